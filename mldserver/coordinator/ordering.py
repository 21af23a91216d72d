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
- **late rows**: a row whose window has closed goes with the next window to close
  (alone, in the window after the last closed one, once that one is past the
  watermark too), counted in ``late_rows``; never dropped.

A shard whose lease went to another server is ``drop``-ped: its rows leave the open
windows at once, and only what is committed of it counts as delivered should it come
back. A shard gone from here whose rows are all committed is ``forget``-ten; the highest
position it delivered is kept a while (the last ``RETIRED`` such shards), so that a
shard coming back (its SHARD_END or its lease lost, then taken again) has the rows it
delivered before dropped as duplicates, not committed twice.

What a shard hands over is an ``Item(time, position, data)``: the event time (None: the
shard's previous one), the record's :class:`~mldserver.positions.Position` and the row
as JSON bytes. Inside, it becomes a ``Row(time, shard_id, position, n, data)``, whose
order as a tuple is the merge key: ``n`` numbers a shard's rows so no two keys tie::

    ordering = Ordering(window_ms=60_000, blocks=lambda parent, now: False, parents_of=lambda s: ())
    seven = Position.parse("7", 0)
    rows = ordering.add("s0", [Item(1_000, seven, b'{"k":1}')], last=seven, now=now)
    [closed] = ordering.close(until=60_000)   # WindowRows(0, 60000) holding that row
    window, counts = seal(closed)             # Window(0, 60000, rows=[b'{"k":1}']), {"s0": 1}
    list(window.sources)                      # [("s0", Position("7", 0))]: where each row came from
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Callable, Iterable, NamedTuple

from ..positions import Position
from .handoff import Window


class Item(NamedTuple):
    """One row as a shard hands it over, in record order."""

    time: float | None  # event time in ms; None: the shard's previous row's
    position: Position  # of the record the row came from
    data: bytes  # the row, as JSON


class Row(NamedTuple):
    """One row inside the coordinator; as a tuple, its order is the merge key."""

    time: float  # effective event time (clamped) in ms
    shard_id: str
    position: Position
    n: int  # the row's number in its shard: no two keys tie
    data: bytes


RETIRED = 1024  # forgotten shards whose highest delivered position is kept

# Rows and items are made by the million: ``tuple.__new__`` builds them in C, where
# ``Row(...)`` would run a Python-level ``__new__`` for each.
_new = tuple.__new__


@dataclass(slots=True)
class WindowRows:
    """A closed window's rows as ordering gathered them, unsorted; ``seal`` makes the
    :class:`~mldserver.coordinator.handoff.Window` a sink gets."""

    start: int
    end: int
    rows: list[Row] = field(default_factory=list, repr=False)
    late_rows: int = 0  # the first ``late_rows`` rows are late


@dataclass(slots=True)
class ShardOrder:
    floor: float = -math.inf  # the effective event time of the shard's last row
    high: Position | None = None  # the highest position delivered here
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
        self.retired: OrderedDict[str, Position] = OrderedDict()  # forgotten shard -> its high
        self.buckets: dict[int, list[Row]] = {}  # window start -> rows
        self.pending_late: list[Row] = []  # rows whose window had closed, for the next to close
        self.closed_until = -math.inf  # end of the last closed window
        self.clamped = 0
        self.duplicates = 0
        self.late_rows = 0

    def shard(self, shard_id: str) -> ShardOrder:
        state = self.shards.get(shard_id)
        if state is None:
            state = self.shards[shard_id] = ShardOrder(high=self.retired.pop(shard_id, None))
        return state

    def forget(self, shard_id: str) -> None:
        """Drop a shard with no rows left here; remember its highest position a while."""
        state = self.shards.pop(shard_id, None)
        if state is None:
            return
        assert not state.held, f"{shard_id} still has rows held"
        if state.high is not None:
            self.retired[shard_id] = state.high
            self.retired.move_to_end(shard_id)
            while len(self.retired) > RETIRED:
                self.retired.popitem(last=False)

    def drop(self, shard_id: str, high: Position | None) -> int:
        """The shard's lease went to another server: its rows still here (open windows,
        late, held) go, and it starts afresh should it come back, with ``high`` (what
        is committed of it) as the position at or below which records are duplicates.
        Returns the rows dropped."""
        dropped = 0
        for start, rows in list(self.buckets.items()):
            kept = [row for row in rows if row.shard_id != shard_id]
            dropped += len(rows) - len(kept)
            if kept:
                self.buckets[start] = kept
            else:
                del self.buckets[start]
        late = [row for row in self.pending_late if row.shard_id != shard_id]
        dropped += len(self.pending_late) - len(late)
        self.pending_late = late
        state = self.shards.pop(shard_id, None)
        if state is not None:
            dropped += len(state.held)
        self.retired.pop(shard_id, None)
        if high is not None:
            self.retired[shard_id] = high
        return dropped

    def delivered(self, shard_id: str, position: Position) -> None:
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
        if high is not None and items and items[0].position <= high:
            kept = [it for it in items if it.position > high]
            self.duplicates += len(items) - len(kept)
            items = kept
        if last is not None and (high is None or last > high):
            state.high = last
        times: list[float] = []
        floor = state.floor
        for t in map(_time, items):
            if t is None:
                t = floor if floor != -math.inf else now
            elif t < floor:
                t = floor
                self.clamped += 1
            floor = t
            times.append(t)
        n = state.count
        numbers = range(n + 1, n + 1 + len(items))
        fields = zip(times, repeat(shard_id), map(_position, items), numbers, map(_data, items))
        rows: list[Row] = list(map(_new, repeat(Row), fields))
        state.floor, state.count = floor, n + len(items)
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
        if rows[0].time >= start:
            return rows
        out = []
        for row in rows:
            if row.time < start:
                row = row._replace(time=start)
                self.clamped += 1
            out.append(row)
        state = self.shards[shard_id]
        state.floor = max(state.floor, start)
        return out

    def _assign(self, rows: list[Row]) -> None:
        size = self.window_ms
        first = rows[0].time - rows[0].time % size
        if first + size > rows[-1].time and first + size > self.closed_until:
            self.buckets.setdefault(int(first), []).extend(rows)  # the usual case: one open window
            return
        bucket_start = None
        bucket: list[Row] = []
        for row in rows:
            start = row.time - row.time % size
            if start != bucket_start:
                if start + size <= self.closed_until:
                    self.pending_late.append(row)
                    self.late_rows += 1
                    continue
                bucket_start = start
                bucket = self.buckets.setdefault(int(start), [])
            bucket.append(row)

    def close(self, until: float) -> list[WindowRows]:
        """The windows whose end is at or below the watermark ``until``, in order.
        Their rows are not sorted yet: :func:`seal` does it, one window at a time."""
        windows = []
        for start in sorted(s for s in self.buckets if s + self.window_ms <= until):
            rows = self.buckets.pop(start)
            windows.append(WindowRows(start, start + self.window_ms, rows))
            self.closed_until = max(self.closed_until, start + self.window_ms)
        if self.pending_late and (windows or until >= self.closed_until + self.window_ms):
            # late rows alone, once the window after the last closed one is itself past the
            # watermark (say, a lease moved here with rows older than what this server closed)
            if not windows:
                end = int(self.closed_until)
                windows.append(WindowRows(end, end + self.window_ms, []))
                self.closed_until = end + self.window_ms
            first = windows[0]
            first.rows = self.pending_late + first.rows
            first.late_rows = len(self.pending_late)
            self.pending_late = []
        return windows

    def buffered_windows(self) -> int:
        return len(self.buckets)


def seal(closed: WindowRows) -> tuple[Window, dict[str, int]]:
    """Sort a closed window's rows by the merge key: the window a sink gets (rows as
    JSON bytes, each shard's highest position), and how many rows each shard had in it."""
    rows = closed.rows
    rows.sort()
    counts = Counter(map(_row_shard_id, rows))
    # A shard's rows are in its order: its last is its highest.
    last = dict(zip(map(_row_shard_id, rows), map(_row_position, rows)))
    window = Window(closed.start, closed.end, list(map(_row_data, rows)), closed.late_rows, last, RowSources(rows))
    closed.rows = []
    return window, counts


class RowSources:
    """A window's ``sources``: (shard id, position) per row, read from the sorted rows
    only when a sink asks (the rows stay alive in the ledger until committed anyway)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def __iter__(self):
        rows = self._rows
        return zip(map(_row_shard_id, rows), map(_row_position, rows))

    def __len__(self) -> int:
        return len(self._rows)


# Field readers for map(), in C (an itemgetter by the field's index).
_time, _position, _data = (itemgetter(Item._fields.index(name)) for name in ("time", "position", "data"))
_row_shard_id, _row_position, _row_data = (
    itemgetter(Row._fields.index(name)) for name in ("shard_id", "position", "data")
)

