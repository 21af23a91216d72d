"""Large buffers reused while batches flow, and given back to the system when they
stop (glibc only; elsewhere a no-op).

A batch crosses the server as a few buffers of its line's size (the line, the frame to
a handler process, the rows coming back, the parsed line there), megabytes each, many
at a time. Where such a buffer comes from decides what it costs:

- from ``mmap`` (glibc's choice for 128 KiB and more, until frees raise its threshold):
  every page is faulted in on first write and unmapped on ``free``. A 3.4 MB buffer is
  some 850 page faults; in the server a third of the CPU went there with a file sink
  (``perf``: ``exc_page_fault`` under ``memmove``, then ``munmap``);
- from the heap (glibc's sliding threshold, after the first large ``free``): its pages
  stay mapped and the next batch reuses them, but the heap's free holes are kept, not
  returned, and the processes' memory grows with the peak of lines ever in flight
  (``mldserver bench --part relay``, 32 shards of 10,000 x 100 B: the server's peak PSS
  484 MiB, each handler process's 52 MiB).

So: buffers under ``THRESHOLD`` come from the heap, whose top is not trimmed on each
``free``, and a thread gives every free page back once a ``period`` (``malloc_trim``),
10 s by default (jemalloc's decay time for dirty pages): a page freed and taken again
within a period is never faulted twice, and what a burst left behind is returned within
a period. Measured with ``bench --part relay`` at 1 shard of 10,000 x 100 B, 1.95x
amazon_kclpy's records/s against 1.6x with every large buffer from ``mmap``; at 32
shards the peak PSS is the same (197 MiB in all)::

    from mldserver.pool.malloc import reuse_large_buffers
    reuse_large_buffers()   # once, at start-up: True if it took effect

The period is that long because a line lives about a second at 32 shards: with a trim
every second, the server gave back at each trim the 20 to 60 MiB of lines just freed and
about to be taken again (``bench --part coordinator``, file sink: 110,000 to 160,000
pages faulted a run against 50,000 to 75,000, the same peak PSS).

A process whose threads take turns (an amazon_kclpy processor's handler process, one
thread per shard, ``api/kclpy/turns.py``) needs one heap, not glibc's one per thread
(up to eight per core): each shard's thread kept the pages its last batch freed in a
heap of its own, so a process of 16 shards held 16 batches' worth between two trims
where one computes at a time. ``one_heap()`` serves every thread from the first heap:
the pages a batch frees are the next batch's, whichever shard it is. Measured with
``bench --part kclpy`` at 32 shards: memory per shard 7.1 MiB (0.64x amazon_kclpy's)
against 4.6 MiB (0.42x) at 1,000 x 1 KiB, 10.5-11.0 against 6.8-7.1 MiB at 10,000 x
100 B, the same CPU per record::

    one_heap()              # before the process starts a thread (each takes a heap at once)
    reuse_large_buffers()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
THRESHOLD = 64 << 20  # buffers under 64 MiB (a batch's lines, frames and rows) from the heap
PERIOD = 10.0  # seconds between two trims

_trimmer: threading.Thread | None = None


def reuse_large_buffers(period: float = PERIOD) -> bool:
    """Large buffers from the heap, its free pages given back every ``period`` seconds
    by a daemon thread (started once a process)."""
    global _trimmer
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
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
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_ARENA_MAX, 1))
