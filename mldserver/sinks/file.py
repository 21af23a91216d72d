"""The file sink (``--sink file:DIR``): one JSON-lines file per window, for tests and
for users without Spark.

``DIR/<start>-<end>.jsonl`` holds the window's rows in merged order, one JSON object
per line; the window's late rows (older than a window already closed) go beside it in
``DIR/<start>-<end>.late.jsonl``. Each file is written under a temporary name starting
with ``_`` (readers skip those), fsynced, then renamed into place. A window id that
already has a file (the same window closed again after a restart) gets ``.1``, ``.2``
... so output is never overwritten: delivery is at least once::

    DIR/1763719200000-1763719260000.jsonl
    DIR/1763719260000-1763719320000.late.jsonl

With ``allowed_lateness`` a window amended by a late row is handed over again
(``Window.version`` 2, 3, ...): its files are replaced, each by a rename, with the
window's rows, the new among them (a late file it no longer has is removed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..base.handoff import Committed, Window
from ..base.durable import atomic_write


class FileSink:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.names: dict[str, tuple[int, str]] = {}  # window id -> (its end, the name its files have)

    async def start(self) -> Committed:
        return Committed()  # no commit log: a window closed again is written again

    async def commit(self, window: Window) -> None:
        await asyncio.to_thread(self._write, window)

    def _write(self, window: Window) -> None:
        """The window's rows are JSON lines already: written as they are, a run at a
        time (``JsonLines.chunks``, rows of interleaved shards gathered into whole disk
        blocks): the window is never copied whole. Past the page cache (``base.direct``):
        fsynced at once, nobody reads it from there."""
        self.directory.mkdir(parents=True, exist_ok=True)
        known = self.names.get(window.id)
        replacing = known is not None and window.version > 1
        name = known[1] if replacing else self._free_name(window.id)
        rows, late = window.rows, window.late_rows
        for suffix, chunks in ((".late.jsonl", rows.chunks(0, late, blocks=True) if late else None),
                               (".jsonl", rows.chunks(late, blocks=True) if len(rows) > late else None)):
            if chunks is not None:
                atomic_write(self.directory / f"{name}{suffix}", chunks, direct=True)
            elif replacing:  # an earlier version may have had such rows
                (self.directory / f"{name}{suffix}").unlink(missing_ok=True)
        if window.version:
            self.names[window.id] = (window.end, name)
        if window.final_until is not None:  # final: never amended again
            self.names = {i: (end, n) for i, (end, n) in self.names.items() if end > window.final_until}

    def _free_name(self, base: str) -> str:
        name, n = base, 0
        while (self.directory / f"{name}.jsonl").exists() or (self.directory / f"{name}.late.jsonl").exists():
            n += 1
            name = f"{base}.{n}"
        return name
