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
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..base.handoff import Committed, Window
from ..base.durable import atomic_write


class FileSink:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

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
        name = self._free_name(window.id)
        rows, late = window.rows, window.late_rows
        if late:
            atomic_write(self.directory / f"{name}.late.jsonl", rows.chunks(0, late, blocks=True), direct=True)
        if len(rows) > late:
            atomic_write(self.directory / f"{name}.jsonl", rows.chunks(late, blocks=True), direct=True)

    def _free_name(self, base: str) -> str:
        name, n = base, 0
        while (self.directory / f"{name}.jsonl").exists() or (self.directory / f"{name}.late.jsonl").exists():
            n += 1
            name = f"{base}.{n}"
        return name
