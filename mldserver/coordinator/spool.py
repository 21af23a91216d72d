"""The spool: an ended shard's uncommitted rows, kept on disk until they commit.

The daemon starts a shard's children only after the parent checkpoints SHARD_END,
and the parent's last window cannot close until the children report. So on
``shardEnded`` the parent's uncommitted rows are written here (append, fsync) before
SHARD_END is stored; at start-up every spool file is replayed into the coordinator,
and a file is deleted once all its rows are committed.

``<state_dir>/spool/<shard_id>.jsonl`` (the shard id made a file name by
``durable.safe_filename``): a header line, then one line per row::

    {"shard_id":"shardId-000000000000","last":["4959...",0],"parents":[]}
    [1476889707000,"4959...",0,{"k":"v"}]       # event time, sequence, sub, the row

Files are written to a temporary name and renamed: a crash leaves either the old
spool or the new one, never half of one. ``store`` (what the coordinator awaits) waits
out a failing disk: logged once, retried until written (``durable.until_written``),
no temporary file left behind; SHARD_END is not stored before it returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..base.durable import atomic_write, safe_filename, until_written
from ..base.logs import EventLogger, get_logger
from ..base.positions import Position
from ..rows.batch import Item, RowBatch


@dataclass
class Spooled:
    shard_id: str
    last: Position | None
    parents: list[str]
    rows: RowBatch


class Spool:
    def __init__(self, directory: Path, log: EventLogger | None = None) -> None:
        self.directory = directory
        self.log = log or get_logger("mldserver.spool")
        self._found: dict[str, Path] = {}  # shard -> the file read_all found it in

    def path_for(self, shard_id: str) -> Path:
        return self.directory / f"{safe_filename(shard_id)}.jsonl"

    async def store(self, shard_id: str, rows: RowBatch, last: Position | None, parents: list[str]) -> Path:
        """``write`` in a thread, retried until the rows are on disk."""
        return await until_written(
            lambda: self.write(shard_id, rows, last, parents), self.path_for(shard_id), self.log,
            what="spool", shard_id=shard_id,
        )

    def write(self, shard_id: str, rows: RowBatch, last: Position | None, parents: list[str]) -> Path:
        """Blocking (run it in a thread): the rows are on disk when this returns."""
        header = {"shard_id": shard_id, "last": last.to_json() if last else None, "parents": parents}
        lines = [orjson.dumps(header)]
        lines += [orjson.dumps([r.time, *r.position.to_json(), orjson.Fragment(r.data)]) for r in rows]
        self.directory.mkdir(parents=True, exist_ok=True)
        return atomic_write(self.path_for(shard_id), b"\n".join(lines) + b"\n")

    def read_all(self) -> list[Spooled]:
        """Every spool file (blocking; start-up only). A torn last line is ignored:
        files are renamed into place whole, so only a foreign edit makes one."""
        out = []
        for path in sorted(self.directory.glob("*.jsonl")) if self.directory.is_dir() else []:
            lines = path.read_bytes().splitlines()
            if not lines:
                continue
            header = orjson.loads(lines[0])
            last = header.get("last")
            items: list[Item] = []
            for line in lines[1:]:
                if line.strip():
                    t, seq, sub, row = orjson.loads(line)
                    items.append(Item(t, Position.from_json([seq, sub]), orjson.dumps(row)))
            position = Position.from_json(last) if last else None
            out.append(Spooled(header["shard_id"], position, header.get("parents", []), RowBatch.of(items)))
            self._found[header["shard_id"]] = path
        return out

    def delete(self, shard_id: str) -> None:
        # A file found at start-up may carry an older version's name for this shard.
        for path in {self.path_for(shard_id), self._found.pop(shard_id, None)} - {None}:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
