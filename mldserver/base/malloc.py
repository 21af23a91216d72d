"""Large buffers back to the system when freed (glibc only; elsewhere a no-op).

A batch crosses the server as a few buffers of its line's size (the line, the frame to
a handler process, the parsed line there), megabytes each, many at a time. glibc
serves an allocation that large from ``mmap`` and gives it back on ``free``, but
raises its threshold to the size of every such buffer freed (up to 32 MiB): after the
first batch, every line comes from the heap, whose free holes are kept, not returned,
and the processes' memory grows with the peak of lines ever in flight. Measured with
``mldserver bench --part relay`` at 32 shards of 10,000 x 100 B records: the server's
peak PSS 484 MiB and each handler process's 52 MiB with the sliding threshold; 212 and
34 MiB with it fixed at 1 MiB::

    from mldserver.base.malloc import large_buffers_from_mmap
    large_buffers_from_mmap()   # once, at start-up: True if it took effect
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD = 1 << 20  # buffers of 1 MiB and more: a batch's lines and frames, not its objects


def large_buffers_from_mmap(threshold: int = THRESHOLD) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
