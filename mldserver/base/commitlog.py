"""The commit log of a sink: what is committed, one fsynced entry per window, written
last (after the window's output is published). A window is committed if and only if
its entry exists; output without an entry is a half-written window, redone.

``DIR/_commits/<start>-<end>.json``::

    {"window": "1763719200000-1763719260000", "start": 1763719200000, "end": 1763719260000,
     "rows": 812, "late": 3, "rows_out": 41, "committed_at": "2026-11-21T10:01:05.120Z",
     "positions": {"shardId-000000000001": ["49590338271490256608559692538361571095921575989136588898", 0]}}

``positions`` holds, per shard, the highest position the window covers, in its JSON
form (``Position.to_json()``: the sequence number's exact digits, the sub-sequence). A shard's committed rows are always a prefix of its rows (windows
commit in order and a shard's event times never decrease), so the highest position
over all entries is where its committed rows end: the coordinator filters replays at
or below it, which makes output exactly once while delivery is at least once.

Pure files, no Spark: the server reads the log at start-up, the Spark process appends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from .handoff import Committed
from .durable import atomic_write, utc_timestamp
from .positions import Position

COMMITS = "_commits"


class CommitLog:
    def __init__(self, sink_dir: Path) -> None:
        self.directory = Path(sink_dir) / COMMITS

    def path(self, window_id: str) -> Path:
        return self.directory / f"{window_id}.json"

    def has(self, window_id: str) -> bool:
        return self.path(window_id).exists()

    def entry(self, window_id: str) -> dict[str, Any] | None:
        try:
            return orjson.loads(self.path(window_id).read_bytes())
        except FileNotFoundError:
            return None

    def read(self) -> Committed:
        committed = Committed()
        if not self.directory.is_dir():
            return committed
        for path in self.directory.glob("*.json"):
            entry = orjson.loads(path.read_bytes())
            committed.windows += 1
            if committed.end is None or entry["end"] > committed.end:
                committed.end = entry["end"]
            for shard_id, value in entry["positions"].items():
                position = Position.from_json(value)
                known = committed.positions.get(shard_id)
                if known is None or position > known:
                    committed.positions[shard_id] = position
        return committed

    def append(self, entry: dict[str, Any]) -> Path:
        """Write one entry durably: a temporary name, fsync, rename, fsync the folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {**entry, "committed_at": utc_timestamp()}
        return atomic_write(self.path(entry["window"]), orjson.dumps(entry))
