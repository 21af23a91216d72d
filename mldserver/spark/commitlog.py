"""The commit log of a sink: what is committed, one fsynced entry per window, written
last (after the window's output is published). A window is committed if and only if
its entry exists; output without an entry is a half-written window, redone.

``DIR/_commits/<start>-<end>.json``::

    {"window": "1763719200000-1763719260000", "start": 1763719200000, "end": 1763719260000,
     "rows": 812, "late": 3, "rows_out": 41, "committed_at": "2026-11-21T10:01:05.120Z",
     "positions": {"shardId-000000000001": ["49590338271490256608559692538361571095921575989136588898", 0]},
     "starts": {"shardId-000000000001": ["49590338271490256608559692538361571095921575989136580000", 1]}}

A session window's entry also has ``output``: per shard, the highest position of the
rows it handed over (``coordinator.sessions``). With ``allowed_lateness`` a window is
committed again when amended (its entry replaced, ``"version": 2``, ...), and ``final``
says where the windows final by then end (``coordinator.amends``): a restart resumes
there. ``positions`` holds, per shard, the
highest position the window covers, in its JSON
form (``Position.to_json()``: the sequence number's exact digits, the sub-sequence). A
shard's committed rows are a prefix of the rows each reading of it delivered (windows
commit in order and a shard's event times never decrease), so ``starts``, where the
rows the server read of the shard start (``Window.starts``: just above the checkpoint
it was initialized at, or its first record), and the position make an interval
[start, position] committed. Read back, each shard's entries make its committed
intervals (``Committed.intervals``, ``base.intervals``; an entry without ``starts``,
written before them, says everything at or below its position) and the highest
position over all entries (``Committed.positions``): the coordinator filters replays
inside an interval, which makes output exactly once while delivery is at least once,
and takes a row below where a reading started, which no reading had, as new. With
``max_out_of_orderness`` a shard's rows commit out of its order: ``positions`` is where
every row at or below is committed, and above it a row is committed if some commit
handed over a row at or above it and its window ended by that commit's ``end``: read
back as ``handed``, per shard the (highest handed over, end) pairs no later commit
outdoes (``coordinator.ordering``).

Pure files, no Spark: the server reads the log at start-up, the Spark process appends.

An entry a window forever would make the log grow without end (43,000 files a month
with 60 s windows, each read at every start), so the writer compacts it: past
``COMPACT_AT`` entries, all but the newest ``KEEP`` are folded into
``_commits/_compacted.json`` (written durably first, then they are deleted)::

    {"end": 1763719260000, "windows": 41210, "compacted_at": "2026-11-21T10:01:05.120Z",
     "positions": {"shardId-000000000001": ["4959...", 0], ...},
     "intervals": {"shardId-000000000001": [[["4959...", 1], ["4959...", 0]]], ...}}

Reading the log reads it and the entries after its ``end`` (one a crash left before
its deletion is already in it); a window that ends at or before its ``end`` is
committed (``entry`` answers ``{"window": ..., "compacted": true}``): windows commit in
order, so no later commit can be of one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..base.handoff import Committed
from ..base.durable import atomic_write, utc_timestamp
from ..base.intervals import from_json, joined, to_json
from ..base.positions import Position

COMMITS = "_commits"
COMPACTED = "_compacted.json"
COMPACT_AT = 1_000  # entries past which the writer compacts the log
KEEP = 100  # the newest entries a compaction leaves as they are


class CommitLog:
    def __init__(self, sink_dir: Path) -> None:
        self.directory = Path(sink_dir) / COMMITS
        self._entries: int | None = None  # entry files, once counted (``compact_if_due``)

    def path(self, window_id: str) -> Path:
        return self.directory / f"{window_id}.json"

    def has(self, window_id: str) -> bool:
        return self.path(window_id).exists() or self._folded(window_id)

    def entry(self, window_id: str) -> dict[str, Any] | None:
        try:
            return orjson.loads(self.path(window_id).read_bytes())
        except FileNotFoundError:
            return {"window": window_id, "compacted": True} if self._folded(window_id) else None

    def read(self) -> Committed:
        return self._fold(self._read_entries())

    def append(self, entry: dict[str, Any]) -> Path:
        """Write one entry durably: a temporary name, fsync, rename, fsync the folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {**entry, "committed_at": utc_timestamp()}
        path = atomic_write(self.path(entry["window"]), orjson.dumps(entry))
        if self._entries is not None:
            self._entries += 1
        return path

    def compact_if_due(self) -> int:
        """``compact`` once there are more than COMPACT_AT entries (counted once, then
        kept count of by ``append``): the writer calls it after each append."""
        if self._entries is None:
            self._entries = len(self._entry_paths())
        if self._entries <= COMPACT_AT:
            return 0
        return self.compact()

    def compact(self, keep: int | None = None) -> int:
        """All entries but the newest ``keep`` (KEEP) folded into the compacted file
        (written durably, then they are deleted); returns how many."""
        entries = sorted(self._read_entries(), key=lambda e: e["end"])
        folded = entries[: max(len(entries) - (KEEP if keep is None else keep), 0)]
        self._entries = len(entries) - len(folded)
        if not folded:
            return 0
        into = self._fold(folded)
        atomic_write(self.directory / COMPACTED, orjson.dumps({
            "end": into.end, "windows": into.windows, "compacted_at": utc_timestamp(),
            "positions": {s: p.to_json() for s, p in into.positions.items()},
            "intervals": {s: to_json(i) for s, i in into.intervals.items()},
            "output": {s: p.to_json() for s, p in into.output.items()},
            "handed": {s: [[p.to_json(), end] for p, end in pairs] for s, pairs in into.handed.items()},
            "final": into.final_until,
        }))
        for entry in folded:
            self.path(entry["window"]).unlink(missing_ok=True)
        return len(folded)

    def _fold(self, entries: list[dict[str, Any]]) -> Committed:
        """The compacted file with ``entries`` folded in: each shard's highest position
        and committed intervals, the last end, the windows (an entry it holds already,
        left by a compaction that stopped before its deletions, is not counted twice)."""
        compacted = self._compacted()
        committed = Committed()
        if compacted is not None:
            committed.end, committed.windows = compacted["end"], compacted["windows"]
            committed.positions = {s: Position.from_json(v) for s, v in compacted["positions"].items()}
            committed.intervals = {s: from_json(v) for s, v in compacted.get("intervals", {}).items()}
            committed.output = {s: Position.from_json(v) for s, v in compacted.get("output", {}).items()}
            committed.final_until = compacted.get("final")
            committed.handed = {s: [(Position.from_json(p), end) for p, end in pairs]
                                for s, pairs in compacted.get("handed", {}).items()}
        for entry in sorted(entries, key=lambda e: e["end"]):
            if compacted is not None and entry["end"] <= compacted["end"]:
                continue
            committed.windows += 1
            if committed.end is None or entry["end"] > committed.end:
                committed.end = entry["end"]
            final = entry.get("final")
            if final is not None and (committed.final_until is None or final > committed.final_until):
                committed.final_until = final
            starts = entry.get("starts", {})
            for shard_id, value in entry.get("positions", {}).items():
                low = starts.get(shard_id)
                known = committed.intervals.get(shard_id)
                if known is None:  # (a compacted file written before intervals: its position, all below)
                    old = committed.positions.get(shard_id)
                    known = () if old is None else ((None, old),)
                committed.intervals[shard_id] = joined(known, None if low is None else Position.from_json(low),
                                                       Position.from_json(value))
            for field, highest in (("positions", committed.positions), ("output", committed.output)):
                for shard_id, value in entry.get(field, {}).items():
                    position = Position.from_json(value)
                    known = highest.get(shard_id)
                    if known is None or position > known:
                        highest[shard_id] = position
            for shard_id, value in entry.get("output", {}).items():
                pairs = committed.handed.setdefault(shard_id, [])
                position = Position.from_json(value)
                while pairs and pairs[-1][0] <= position:  # outdone: this one is as high, and later
                    pairs.pop()
                pairs.append((position, entry["end"]))
        return committed

    def _folded(self, window_id: str) -> bool:
        """Is the window in the compacted file (it ends at or before its end)?"""
        compacted = self._compacted()
        return compacted is not None and int(window_id.rpartition("-")[2]) <= compacted["end"]

    def _compacted(self) -> dict[str, Any] | None:
        try:
            return orjson.loads((self.directory / COMPACTED).read_bytes())
        except FileNotFoundError:
            return None

    def _entry_paths(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return [p for p in self.directory.glob("*.json") if not p.name.startswith("_")]

    def _read_entries(self) -> list[dict[str, Any]]:
        return [orjson.loads(path.read_bytes()) for path in self._entry_paths()]

