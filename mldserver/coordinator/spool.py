"""The spool: an ended shard's uncommitted rows, kept on disk until they commit.

The daemon starts a shard's children only after the parent checkpoints SHARD_END,
and the parent's last window cannot close until the children report. So on
``shardEnded`` the parent's uncommitted rows are written here (append, fsync) before
SHARD_END is stored; at start-up every spool file is replayed into the coordinator,
and a file is deleted once all its rows are committed.

``<state_dir>/spool/<shard_id>.jsonl``: a header line, then one line per row::

    {"shard_id":"shardId-000000000000","last":["4959...",0],"parents":[]}
    [1476889707000,"4959...",0,{"k":"v"}]       # event time, sequence, sub, the row

Files are written to a temporary name and renamed: a crash leaves either the old
spool or the new one, never half of one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..positions import Position
from ..sinks.commitlog import fsync_dir
from .ordering import Item, Row

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Spooled:
    shard_id: str
    last: Position | None
    parents: list[str]
    items: list[Item]


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, shard_id: str) -> Path:
        return self.directory / f"{_UNSAFE.sub('_', shard_id)}.jsonl"

    def write(self, shard_id: str, rows: list[Row], last: Position | None, parents: list[str]) -> Path:
        """Blocking (run it in a thread): the rows are on disk when this returns."""
        header = {"shard_id": shard_id, "last": last.to_json() if last else None, "parents": parents}
        lines = [orjson.dumps(header)]
        lines += [orjson.dumps([r.time, *r.position.to_json(), orjson.Fragment(r.data)]) for r in rows]
        path = self.path_for(shard_id)
        tmp = path.with_suffix(".tmp")
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(b"\n".join(lines) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.directory)
        return path

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
            out.append(Spooled(header["shard_id"], position, header.get("parents", []), items))
        return out

    def delete(self, shard_id: str) -> None:
        try:
            os.unlink(self.path_for(shard_id))
        except FileNotFoundError:
            pass
