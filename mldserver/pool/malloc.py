"""Memory for a process that decodes batches: large buffers reused while batches flow
and given back to the system when they stop (glibc only; elsewhere a no-op), and the
garbage collector tuned for batches of many small objects.

A batch crosses the server as a few buffers of its line's size (the line, the frame to
a handler process, the rows coming back, the parsed line there), megabytes each, many
at a time. Where such a buffer comes from decides what it costs:

- from ``mmap`` (glibc's choice for 128 KiB and more, until frees raise its threshold):
  every page is faulted in on first write and unmapped on ``free``, so a few megabytes
  are hundreds of page faults, batch after batch (``perf`` shows them under ``memmove``,
  then ``munmap``);
- from the heap (glibc's sliding threshold, after the first large ``free``): its pages
  stay mapped and the next batch reuses them, but the heap's free holes are kept, not
  returned, and the processes' memory grows with the peak of lines ever in flight.

So buffers under ``THRESHOLD`` come from the heap, whose top is not trimmed on each
``free``, and a thread gives every free page back once a ``period`` (``malloc_trim``),
10 s by default (jemalloc's decay time for dirty pages): a page freed and taken again
within a period is never faulted twice, and what a burst left behind is returned within
a period. The period is that long because a line lives about a second at 32 shards: a
trim every second gave back the lines just freed and about to be taken again.

A process whose threads take turns (an amazon_kclpy processor's handler process, one
thread per shard, ``api/kclpy/turns.py``) needs one heap, not glibc's one per thread
(up to eight per core): each shard's thread would keep the pages its last batch freed in
a heap of its own. ``one_heap()`` serves every thread from the first heap: the pages a
batch frees are the next batch's, whichever shard it is.

A batch also decodes into tens of thousands of objects: ``collect_less()`` makes the
young collections fewer and larger, and freezes what was imported so far out of them.
The server (``cli``) and each handler process (``pool/child.py``) start so::

    collect_less()
    one_heap()              # (a process whose threads take turns) before it starts a thread
    reuse_large_buffers()   # True if it took effect

The figures behind these choices are in docs/performance.md (``mldserver bench --part
relay``, ``--part coordinator`` and ``--part kclpy`` measure them again).
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
THRESHOLD = 64 << 20  # buffers under 64 MiB (a batch's lines, frames and rows) from the heap
PERIOD = 10.0  # seconds between two trims

_trimmer: threading.Thread | None = None


def collect_less() -> None:
    """Fewer, larger young collections (a batch decodes into tens of thousands of
    objects), and everything imported so far frozen out of them (once, at start-up)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def reuse_large_buffers(period: float = PERIOD) -> bool:
    """Large buffers from the heap, its free pages given back every ``period`` seconds
    by a daemon thread (started once a process)."""
    global _trimmer
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, the C library's among them
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    malloc_trim.argtypes = (ctypes.c_size_t,)
    if not (mallopt(M_MMAP_THRESHOLD, THRESHOLD) and mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
        return False
    if _trimmer is None:
        def trim() -> None:
            while True:
                time.sleep(period)
                malloc_trim(0)  # (ctypes lets the GIL go for the call)

        _trimmer = threading.Thread(target=trim, name="malloc-trim", daemon=True)
        _trimmer.start()
    return True


def one_heap() -> bool:
    """Every thread's allocations from one heap (glibc's first arena); True if it took
    effect. Only threads started afterwards: a thread keeps the heap it first took."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_ARENA_MAX, 1))
