"""Spill: where the coordinator keeps rows past ``max_buffered_bytes``, in files
rather than memory. Back-pressure keeps most batches under the cap; what must still
land past it (the watermark's holder going on until a window closes, batches already in
handler processes) comes here, so the cap holds whatever the shards' count.

Rows are written into segment files of ``SEGMENT`` bytes under ``<state-dir>/spill/``,
each unlinked as soon as it is made and mapped once, read-only: a spilled batch's
columns and JSON are views of that map (``RowBatch.spilled``). Pages written with
``pwrite`` sit in the page cache, the kernel's to write back and drop, and come into the
server's memory only when a sink reads them. A segment goes when the last batch viewing
it does; one file descriptor a segment, not one a batch::

    spill = Spill(Path("state/spill"))
    rows = piece.spilled(spill.put)      # its buffers now views of a segment's map
    rows.held_bytes() == 0; spill.bytes  # what was written, in all
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..base.durable import empty_dir

if TYPE_CHECKING:
    from ..rows.batch import RowBatch
    from ..base.logs import EventLogger

SEGMENT = 64 << 20  # bytes a segment file holds (a larger batch gets one of its own)


class Spill:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.bytes = 0  # written, in all
        self._fd = -1  # the segment written now
        self._map: Any = None  # its map (numpy uint8), shared by every batch in it
        self._used = 0

    def clear(self) -> None:
        """At start-up: a segment a crash left (between its making and its unlink) goes."""
        empty_dir(self.directory)

    def put(self, parts: Sequence[Any]) -> list[Any]:
        """Write ``parts`` (buffers) one after another; returns a read-only uint8 view
        of each. OSError (a full disk) leaves nothing half written behind a view."""
        bufs = [memoryview(part).cast("B") for part in parts]
        total = sum(map(len, bufs))
        if self._map is None or self._used + total > len(self._map):
            self._new(max(SEGMENT, total))
        views, at = [], self._used
        for buf in bufs:
            done = 0
            while done < len(buf):
                done += os.pwrite(self._fd, buf[done:], at + done)
            views.append(self._map[at : at + len(buf)])
            at += len(buf)
        self._used = at
        self.bytes += total
        return views

    def keeper(self, room: int, max_bytes: int, log: EventLogger) -> Callable[[RowBatch], RowBatch]:
        """How one batch's pieces are kept: in memory while they fit in ``room`` (what is
        left under ``max_bytes``), the rest here. Should a file fail (a full disk), the
        piece stays in memory: past the cap, but nothing lost."""

        def keep(piece: RowBatch) -> RowBatch:
            nonlocal room
            held = piece.held_bytes()
            if held > room:
                if not self.bytes:
                    log.info("rows_spilled", directory=str(self.directory), buffered_bytes=max_bytes - room,
                             max_buffered_bytes=max_bytes,
                             what_to_do="none: rows past the cap wait in files until their window commits")
                try:
                    piece = piece.spilled(self.put)
                    held = 0
                except OSError as exc:
                    log.error("spill_failed", directory=str(self.directory), error=str(exc),
                              what_to_do="free space there: the rows stay in memory, past max_buffered_bytes")
            room -= held
            return piece

        return keep

    def _new(self, size: int) -> None:
        import numpy as np

        self.close()
        fd, path = tempfile.mkstemp(dir=self.directory, prefix="rows-")
        try:
            os.unlink(path)  # it goes with its last view (or the process)
            os.ftruncate(fd, size)
            mapped = np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ), dtype=np.uint8)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._map, self._used = fd, mapped, 0

    def close(self) -> None:
        """Stop writing the current segment (its map lives on in its batches)."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._map, self._used = -1, None, 0
