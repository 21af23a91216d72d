"""A handler process's arena: shared memory the server copies a batch's line into, so
the line reaches the process without crossing its pipe (a 1.4 MB line was written into
the pipe, read out of it in pieces and joined again: three copies and a dozen
wake-ups; now it is one copy, and the process parses it where it lies)::

    arena = Arena.create(ARENA_BYTES)          # server: anonymous shared memory (memfd)
    region = arena.put(line)                   # (offset, size), or None: full, or the line is larger
    frame["arena"] = region                    # the call frame names it instead of carrying a body
    ...                                        # the process's done frame for that call (or its death)
    arena.free(region)

    view = ArenaView(fd, size)                 # the process: the same memory, read-only
    body = view.region(offset, size)           # a memoryview, parsed in place (pysimdjson, orjson)

One owner at a time: a region is the process's from the call frame that names it until
that call's ``done`` frame arrives, or the process dies; only then does the server
free it (``channel.Channel``), never when the server merely stops waiting for the call,
for the process may still be reading it. What the process keeps of a batch (its parsed
records) is copied out by the parser, so nothing refers to a region after ``done``.

Bounded: the arena has a fixed size; a line that does not fit goes through the pipe
as before, so a full arena never stalls a shard. Its pages are touched as lines land,
shared by both processes, given back once no line has used them for a second
(``trim``), and gone with them: the memory has no name in any file system.

The rows a batch emitted come back the same way, in a second arena the process
allocates in (``rows_arena``: the same class, on the process's side), the server
mapping it read-only (``ArenaView``). A batch's rows body, megabytes, was written into
the pipe, read out in pieces and joined, then copied again into each window's piece:
now the process copies its parts into a region, and the server reads the rows where
they lie until their window commits, holding the region on loan (``rows.loans``). A
batch whose rows span windows is cut in place, one loan a window, and each part is
handed back (a ``free`` frame naming its bytes exactly) when nothing refers to it any
more: committed, spilled, dropped with a lost lease. One owner at a time again: the
process's from ``put`` until those frees arrive; a full rows arena sends the rows
through the pipe, as before::

    rows = Arena(fd, size)                     # the process, over the fd the server passed
    region = rows.put(index, times, ends, lines)   # the body's parts, one after another; or None
    done["rows_arena"] = region                # the done frame names it instead of carrying a body
    offset, size = extent(region)              # the server: the bytes it holds, alignment included
    rows.release(offset, 1_000_000)            # the process, at the server's {"op": "free"}: exact
    rows.release(offset + 1_000_000, size - 1_000_000)   # bytes, any cut, each part once
"""

from __future__ import annotations

import bisect
import mmap
import os
from typing import Any

# The arena of each handler process: at 32 shards over two processes, 16 lines of 1,000
# 1 KiB records (1.4 MB each) are in flight in each; larger batches beyond it take the pipe.
ARENA_BYTES = 64 << 20
# The rows arena of each handler process holds the rows the server keeps until their
# windows commit: its share of ``max_buffered_bytes`` and this much more, for the rows
# in flight and the room first fit leaves between regions (``rows_arena_bytes``). Rows
# that find no room take the pipe and are copied. Pages are touched only as used.
ROWS_IN_FLIGHT = 64 << 20
# Seconds between two trims of an arena (a rows arena: its process's heartbeat; a line
# arena: the server's pool supervisor): only the free pages no region used in the last
# period go, so a short period costs no fault while rows flow.
TRIM_PERIOD = 1.0
# Smaller bodies take the pipe: a write of a few KiB costs less than a region's bookkeeping.
ARENA_MIN = 32 << 10
_ALIGN = 64
WARM_MAX = 4096  # regions put between two trims kept apart: more are one span

Region = tuple[int, int]  # (offset, size)


class Arena:
    """The server's side: the memory, and which parts of it are free (first fit)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.map = mmap.mmap(fd, size)
        self._free: list[Region] = [(0, size)]  # sorted by offset, never adjacent
        self.used = 0  # bytes in regions not yet given back
        self._warm: list[Region] = []  # (start, end) of the pages of each region put since the last trim
        self._cold: list[Region] = []  # (start, end) of free pages given back, none put since: sorted
        self._touched = 0  # how far pages may be in memory: the highest end put
        self.puts = 0  # lines that crossed in it
        self.misses = 0  # lines that took the pipe: no free region was large enough

    @classmethod
    def create(cls, size: int = ARENA_BYTES) -> Arena:
        """Anonymous shared memory of ``size`` bytes (``shared_memory``), pass its fd to
        the process (``pass_fds``)."""
        fd = shared_memory(size)
        try:
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def put(self, *parts: Any) -> Region | None:
        """``parts`` (bytes-like) copied one after another into a free region: its
        (offset, size), or None if no free region is large enough. Regions start on
        ``_ALIGN`` and hold their size rounded up to it (``extent``)."""
        views = [memoryview(part).cast("B") for part in parts]
        length = sum(map(len, views))
        need = _up(length)
        for i, (offset, size) in enumerate(self._free):
            at = _up(offset)  # (a part released on its own may end anywhere)
            if at + need <= offset + size:
                rest = [(start, end - start) for start, end in ((offset, at), (at + need, offset + size)) if end > start]
                self._free[i : i + 1] = rest
                for view in views:
                    self.map[at : at + len(view)] = view
                    at += len(view)
                self.used += need
                self.puts += 1
                pages = (_down(at - length, mmap.PAGESIZE), _up(at, mmap.PAGESIZE))
                warm = self._warm
                if len(warm) >= WARM_MAX:  # (an arena nobody trims: the server's, of lines) one span for all
                    warm[:] = [(min(warm)[0], max(end for _, end in warm))]
                warm.append(pages)
                if self._cold:
                    self._cold = _minus(self._cold, [pages])
                self._touched = max(self._touched, pages[1])
                return at - length, length
        self.misses += 1
        return None

    def free(self, region: Region) -> None:
        """Give ``region`` back whole (its call is done, or its process died)."""
        self.release(*extent(region))

    def release(self, offset: int, size: int) -> None:
        """Give back exactly the bytes at (offset, size): a region's extent, or a part of
        it (the rest is given back on its own)."""
        self.used -= size
        free = self._free
        i = bisect.bisect(free, (offset, 0))
        if i < len(free) and offset + size == free[i][0]:  # joins the next
            size += free[i][1]
            del free[i]
        if i and free[i - 1][0] + free[i - 1][1] == offset:  # joins the previous
            offset, size = free[i - 1][0], free[i - 1][1] + size
            del free[i - 1]
            i -= 1
        free.insert(i, (offset, size))

    def trim(self) -> int:
        """Give the system back the free pages no region was put in since the last
        trim, in the holes between regions held as above them, as a heap is trimmed
        (``pool.malloc``): what a burst touched goes within two trims, what each batch
        uses again stays in memory. A window's rows lie between later windows' (shards
        interleave), so its commit opens holes below regions still held: at 32 shards
        behind a file sink, up to 67 of the 147 MiB of pages touched. Returns the bytes
        given back."""
        warm, self._warm = sorted(self._warm), []
        remove = getattr(mmap, "MADV_REMOVE", None)  # (Linux)
        if remove is None:
            return 0
        page = mmap.PAGESIZE
        free = [(_up(offset, page), min(_down(offset + size, page), self._touched)) for offset, size in self._free]
        cold = _minus(_minus([(start, end) for start, end in free if end > start], warm), self._cold)
        for start, end in cold:
            self.map.madvise(remove, start, end - start)  # (shared memory: its pages are freed, read as zeros)
        self._cold = sorted(self._cold + cold)
        return sum(end - start for start, end in cold)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def rows_arena_bytes(max_buffered_bytes: int, workers: int) -> int:
    """A handler process's rows arena: 192 MiB with the defaults (256 MiB, 2 workers)."""
    share = max_buffered_bytes // max(workers, 1)
    return _up(share + ROWS_IN_FLIGHT)


def _up(n: int, unit: int = _ALIGN) -> int:
    """``n`` rounded up to a multiple of ``unit``."""
    return -(-n // unit) * unit


def _down(n: int, unit: int) -> int:
    return n - n % unit


def _minus(spans: list[Region], cuts: list[Region]) -> list[Region]:
    """``spans`` without ``cuts``, both (start, end) sorted and disjoint within each::

        _minus([(0, 100), (200, 300)], [(50, 250)])   # [(0, 50), (250, 300)]
    """
    out: list[Region] = []
    i = 0
    for start, end in spans:
        while i < len(cuts) and cuts[i][1] <= start:
            i += 1
        j = i
        while start < end and j < len(cuts) and cuts[j][0] < end:
            if cuts[j][0] > start:
                out.append((start, cuts[j][0]))
            start = max(start, cuts[j][1])
            j += 1
        if start < end:
            out.append((start, end))
    return out


def extent(region: Region) -> Region:
    """The bytes a region ``put`` returned holds: its size rounded up to ``_ALIGN``."""
    offset, size = region
    return offset, _up(size)


def shared_memory(size: int, name: str = "mldserver-arena") -> int:
    """The fd of anonymous shared memory of ``size`` bytes (memfd; an unlinked temporary
    file where there is none), inheritable: a handler process gets it with ``pass_fds``.
    ``name`` is what ``/proc/PID/maps`` shows of it."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, 0)
    else:  # pragma: no cover  (macOS)
        import tempfile  # (only here: a handler process, which imports this module, needs none of it)

        fd, path = tempfile.mkstemp(prefix=f"{name}-")
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class ArenaView:
    """The reading side, mapped read-only: the process's view of the server's arena,
    the server's of the process's rows arena."""

    def __init__(self, fd: int, size: int) -> None:
        self.map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        os.close(fd)
        self._view = memoryview(self.map)

    def region(self, offset: int, size: int) -> memoryview:
        """The bytes at (offset, size); ValueError if that is not inside the arena."""
        if not (0 <= offset and 0 <= size and offset + size <= len(self._view)):
            raise ValueError(f"region ({offset}, {size}) is not inside the arena of {len(self._view)} bytes")
        return self._view[offset : offset + size]

    def close(self) -> None:
        """Unmapped, unless a region's view is still alive: then when that goes."""
        try:
            self._view.release()
            self.map.close()
        except BufferError:
            pass
