"""Ordering: every shard's rows into one plausible total order, cut into windows.
Pure: no I/O, no clock of its own (``now`` is passed in), no asyncio.

Each shard's rows stay in their own FIFO; windows are sorted by the merge key
(event time ms, shard id, sequence number as an integer, sub-sequence number), so
one shard is never reordered. What keeps that promise where Bloop breaks it:

- **clamps**: a row's effective event time never decreases within a shard (a row
  older than its shard's previous one takes that time; counted in ``clamped``);
- **duplicates**: a row at or below what its shard already delivered (a daemon
  restart re-delivers from the checkpoint) is dropped and counted;
- **lineage**: a child shard's rows are held until none of its parents (up to two)
  can still add rows, and are then clamped to start no earlier than the parents'
  last rows (one millisecond later where the child's id sorts before a parent's, so
  the merge key itself puts parents first);
- **late rows**: a row whose window has closed goes with the next window to close,
  counted in ``late``; never dropped.

A row is the tuple ``(event_time, shard_id, seq, sub, n, seq_str, data)``: ``n``
numbers a shard's rows so no two keys tie; ``data`` is the row as JSON bytes::

    ordering = Ordering(window_ms=60_000, blocks=lambda parent, now: False, parents_of=lambda s: ())
    rows = ordering.add("s0", [(1_000, 7, 0, "7", b'{"k":1}')], last=(7, 0, "7"), now=now)
    ordering.close(until=60_000)   # [Window(0, 60000) holding that row]
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable, Iterable

from .windows import Window

# (event time or None, sequence number as int, sub-sequence number, sequence number, row as JSON)
Item = tuple[float | None, int, int, str, bytes]
Row = tuple  # (event_time, shard_id, seq, sub, n, seq_str, data)
Position = tuple[int, int, str]  # (seq, sub, seq_str): compares as integers


@dataclass(slots=True)
class ShardOrder:
    floor: float = -math.inf  # the effective event time of the shard's last row
    high: tuple[int, int] | None = None  # the highest position delivered here
    held: list[Row] = field(default_factory=list)  # waiting for parents to finish
    count: int = 0


class Ordering:
    def __init__(
        self,
        *,
        window_ms: int,
        blocks: Callable[[str, float], bool],
        parents_of: Callable[[str], Iterable[str]],
    ) -> None:
        self.window_ms = window_ms
        self.blocks = blocks  # can this (parent) shard still add rows at ``now``?
        self.parents_of = parents_of
        self.shards: dict[str, ShardOrder] = {}
        self.buckets: dict[int, list[Row]] = {}  # window start -> rows
        self.late_rows: list[Row] = []
        self.closed_until = -math.inf  # end of the last closed window
        self.clamped = 0
        self.duplicates = 0
        self.late = 0

    def shard(self, shard_id: str) -> ShardOrder:
        state = self.shards.get(shard_id)
        if state is None:
            state = self.shards[shard_id] = ShardOrder()
        return state

    def delivered(self, shard_id: str, position: tuple[int, int]) -> None:
        """Positions up to here count as delivered (a commit log, a stored checkpoint)."""
        state = self.shard(shard_id)
        if state.high is None or position > state.high:
            state.high = position

    def resume(self, committed_end: int) -> None:
        """Windows up to ``committed_end`` were committed before a restart: rows for
        them are late now, so a window id is never committed twice."""
        self.closed_until = max(self.closed_until, committed_end)

    def add(self, shard_id: str, items: list[Item], last: Position | None, now: float) -> list[Row]:
        """One processed batch's rows, in record order; returns the rows kept."""
        state = self.shard(shard_id)
        high = state.high
        if high is not None and items and (items[0][1], items[0][2]) <= high:
            kept = [it for it in items if (it[1], it[2]) > high]
            self.duplicates += len(items) - len(kept)
            items = kept
        if last is not None and (high is None or last[:2] > high):
            state.high = last[:2]
        rows: list[Row] = []
        floor = state.floor
        n = state.count
        for t, seq, sub, seq_str, data in items:
            if t is None:
                t = floor if floor != -math.inf else now
            elif t < floor:
                t = floor
                self.clamped += 1
            floor = t
            n += 1
            rows.append((t, shard_id, seq, sub, n, seq_str, data))
        state.floor, state.count = floor, n
        if state.held or self._blocked(shard_id, now):
            state.held.extend(rows)
        elif rows:
            self._assign(self._after_parents(shard_id, rows))
        return rows

    def _blocked(self, shard_id: str, now: float) -> bool:
        return any(self.blocks(p, now) for p in self.parents_of(shard_id))

    def release(self, now: float) -> list[str]:
        """Let children whose parents are done into the windows; returns their ids."""
        released = []
        for shard_id, state in self.shards.items():
            if state.held and not self._blocked(shard_id, now):
                self._assign(self._after_parents(shard_id, state.held))
                state.held = []
                released.append(shard_id)
        return released

    def _after_parents(self, shard_id: str, rows: list[Row]) -> list[Row]:
        """Clamp a child's rows to start after its parents' last rows."""
        start = -math.inf
        for parent in self.parents_of(shard_id):
            p = self.shards.get(parent)
            if p is not None and p.floor != -math.inf:
                start = max(start, p.floor + (1 if shard_id < parent else 0))
        if rows[0][0] >= start:
            return rows
        out = []
        for row in rows:
            if row[0] < start:
                row = (start,) + row[1:]
                self.clamped += 1
            out.append(row)
        state = self.shards[shard_id]
        state.floor = max(state.floor, start)
        return out

    def _assign(self, rows: list[Row]) -> None:
        size = self.window_ms
        first = rows[0][0] - rows[0][0] % size
        if first + size > rows[-1][0] and first + size > self.closed_until:
            self.buckets.setdefault(int(first), []).extend(rows)  # the usual case: one open window
            return
        bucket_start = None
        bucket: list[Row] = []
        for row in rows:
            start = row[0] - row[0] % size
            if start != bucket_start:
                if start + size <= self.closed_until:
                    self.late_rows.append(row)
                    self.late += 1
                    continue
                bucket_start = start
                bucket = self.buckets.setdefault(int(start), [])
            bucket.append(row)

    def close(self, until: float) -> list[Window]:
        """The windows whose end is at or below the watermark ``until``, in order.
        Rows stay tuples: :func:`seal` sorts them (off the event loop)."""
        windows = []
        for start in sorted(s for s in self.buckets if s + self.window_ms <= until):
            rows = self.buckets.pop(start)
            windows.append(Window(start, start + self.window_ms, rows))
            self.closed_until = max(self.closed_until, start + self.window_ms)
        if self.late_rows and (windows or until == math.inf):
            if not windows:  # late rows alone: the window after the last closed one
                end = int(self.closed_until)
                windows.append(Window(end, end + self.window_ms, []))
                self.closed_until = end + self.window_ms
            first = windows[0]
            first.rows = self.late_rows + first.rows
            first.late = len(self.late_rows)
            self.late_rows = []
        return windows

    def buffered_windows(self) -> int:
        return len(self.buckets)


def seal(window: Window) -> dict[str, int]:
    """Sort a closed window's rows by the merge key and turn them into JSON bytes;
    fills ``window.positions``; returns how many rows each shard had in it."""
    rows = window.rows
    rows.sort()
    counts = Counter(map(itemgetter(1), rows))
    last = {row[1]: row for row in rows}  # a shard's rows are in its order: its last is its highest
    window.rows = list(map(itemgetter(6), rows))
    window.positions = {s: (row[5], row[3]) for s, row in last.items()}
    return counts

