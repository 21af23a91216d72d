"""Ordering: every shard's rows into one plausible total order, cut into windows.
Pure: no I/O, no clock of its own (``now`` is passed in), no asyncio.

Rows arrive a batch at a time as columns (a :class:`RowBatch`: never an object per
row) and wait in their shard's own queue. A closed window's rows are ordered by the
merge key (event time ms, shard id, sequence number as an integer, sub-sequence
number, then the row's place in its shard), so one shard is never reordered. What
keeps that promise where Bloop breaks it:

- **clamps**: a row's effective event time never decreases within a shard (a row
  older than its shard's previous one takes that time; counted in ``clamped``). So a
  shard's queue is sorted by time: cutting a window out of it is a binary search
  (``close``), and merging the shards is a stable sort of runs already sorted (``seal``);
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

What a shard hands over per processed batch is one ``RowBatch``. A batch of records
at 7, 8 and 9 whose handler emitted a row for 7 at an event time it gave, and two for
9 with none (so its record's arrival time, 2_000, stands in), as the server reads it
from a handler process's columnar body (``shard.batches.encoded_rows``)::

    rows.times     = [1_500, 2_000, 2_000]                # int64 ms; NO_TIME (-1): none at all
    rows.records   = [0, 2, 2]                            # each row's record, in the batch
    rows.positions = [Position(7..), Position(8..), Position(9..)]   # the batch's, once
    rows.body      = b'{"k":1}\n{"k":2}\n{"k":3}\n'       # JSON lines, one buffer
    rows.offsets   = [0, 8, 16, 24]                       # row i: body[offsets[i]:offsets[i+1]]

    ordering = Ordering(window_ms=60_000, blocks=lambda parent, now: False, parents_of=lambda s: ())
    kept = ordering.add("s0", rows, last=Position(9..), now=now)   # times: a running maximum
    [closed] = ordering.close(until=60_000)   # WindowRows(0, 60000, parts={"s0": [rows[0:3]]})
    window, counts = seal(closed)             # Window(0, 60000, rows=JsonLines(3 rows)), {"s0": 3}
    list(window.sources)                      # [("s0", Position(7..)), ("s0", Position(9..)), ...]: each row's

``RowBatch.of([Item(1_500, seven, b'{"k":1}'), ...])`` builds one from rows given one
by one (the spool, tests). Slices share the batch's buffers: a window's rows are
slices of its shards' batches until a sink reads them (``handoff.JsonLines``).

numpy (and pyarrow, for a window whose shards interleave) are imported where they are
used: a server without a sink, and the handler processes, never load them.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from operator import le
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from ..positions import Position
from .handoff import JsonLines, Made, Window

if TYPE_CHECKING:
    import numpy as np

NO_TIME = -1  # an event time not given: the shard's previous row's (valid times are >= 0)
RETIRED = 1024  # forgotten shards whose highest delivered position is kept


class Item(NamedTuple):
    """One row on its own, for the few places that need one: the spool, tests."""

    time: int | None  # event time in ms; None: the shard's previous row's
    position: Position  # of the record the row came from
    data: bytes  # the row, as JSON


class RowBatch:
    """One processed batch's rows as columns, in the order the handler emitted them.

    ``times``: int64 event times (``NO_TIME``: none given); ``records``: for each row,
    the index in ``positions`` of its record's position; ``positions`` never decrease
    (a batch's records, in the order the daemon delivers a shard), so the index orders
    rows as their positions do and a position is read only where one is needed (a
    window's last row, the ledger's head); ``body`` and ``offsets`` (int64, one more
    than rows): row ``i`` is ``body[offsets[i]:offsets[i + 1]]``, JSON ending in a
    newline. ``ordered``: the record indexes never decrease (the handler emitted in
    record order), so within the batch the merge key's order is the rows' order. A
    slice (``rows[i:j]``) shares every buffer."""

    __slots__ = ("times", "records", "positions", "body", "offsets", "ordered")

    def __init__(self, times: np.ndarray, records: np.ndarray, positions: Sequence[Position], body: Any,
                 offsets: np.ndarray, ordered: bool | None = None) -> None:
        self.times = times
        self.records = records
        self.positions = positions
        self.body = body
        self.offsets = offsets
        self.ordered = _nondecreasing_array(records) if ordered is None else ordered

    @classmethod
    def each(cls, times: np.ndarray, positions: list[Position], body: Any, offsets: np.ndarray) -> RowBatch:
        """Rows each given its own record's position (in the server's loop, the spool)."""
        import numpy as np

        if _nondecreasing(positions):
            return cls(times, np.arange(len(positions)), positions, body, offsets, True)
        distinct = sorted(set(positions))  # a handler emitted out of record order
        index = {p: i for i, p in enumerate(distinct)}
        return cls(times, np.array([index[p] for p in positions], dtype=np.int64), distinct, body, offsets)

    @classmethod
    def of(cls, items: Iterable[Item]) -> RowBatch:
        """Rows given one by one (the spool, tests)."""
        import numpy as np

        items = list(items)
        times = np.array([NO_TIME if it.time is None else it.time for it in items], dtype=np.int64)
        lines = [it.data + b"\n" for it in items]
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        np.cumsum([len(line) for line in lines], out=offsets[1:])
        return cls.each(times, [it.position for it in items], b"".join(lines), offsets)

    @classmethod
    def empty(cls) -> RowBatch:
        """No rows (a batch without any, a server without a sink): numpy not needed."""
        return cls(array("q"), array("q"), (), b"", array("q", [0]), True)  # type: ignore[arg-type]

    @classmethod
    def concat(cls, batches: Sequence[RowBatch]) -> RowBatch:
        """Several batches' rows as one, copied (a rare path: a shard's rows spooled)."""
        import numpy as np

        if len(batches) == 1:
            return batches[0]
        if not batches:
            return cls.empty()
        firsts = np.cumsum([0] + [len(b.positions) for b in batches])
        return cls(
            np.concatenate([b.times for b in batches]),
            np.concatenate([b.records.astype(np.int64) + first for b, first in zip(batches, firsts)]),
            [p for b in batches for p in b.positions],  # a shard's batches follow one another
            *_concat(batches),
            all(b.ordered for b in batches),
        )

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, rows: slice) -> RowBatch:
        start, stop, step = rows.indices(len(self.times))
        assert step == 1, "rows are sliced, never strided"
        stop = max(start, stop)
        return RowBatch(self.times[start:stop], self.records[start:stop], self.positions, self.body,
                        self.offsets[start : stop + 1], self.ordered)

    def with_times(self, times: np.ndarray) -> RowBatch:
        return RowBatch(times, self.records, self.positions, self.body, self.offsets, self.ordered)

    def take(self, indices: np.ndarray) -> RowBatch:
        """Some of the rows, copied (a rare path: duplicates among rows out of order)."""
        import numpy as np

        body = memoryview(self.body)
        lines = [body[s:e] for s, e in zip(self.offsets[indices].tolist(), self.offsets[indices + 1].tolist())]
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        np.cumsum([len(line) for line in lines], out=offsets[1:])
        return RowBatch(self.times[indices], self.records[indices], self.positions, b"".join(lines), offsets)

    def position(self, i: int) -> Position:
        return self.positions[int(self.records[i])]

    def row(self, i: int) -> bytes:
        """Row ``i``'s JSON, without its newline."""
        return bytes(memoryview(self.body)[int(self.offsets[i]) : int(self.offsets[i + 1]) - 1])

    def nbytes(self) -> int:
        """The rows' JSON, newlines included."""
        return int(self.offsets[-1] - self.offsets[0])

    def lowest(self) -> Position:
        return self.positions[int(self.records[0] if self.ordered else self.records.min())]

    def above(self, high: Position) -> RowBatch:
        """The rows whose position is above ``high`` (a binary search of the positions)."""
        import numpy as np

        first = bisect.bisect_right(self.positions, high)  # the first record above it
        if self.ordered:
            return self[int(np.searchsorted(self.records, first)) :]
        return self.take(np.flatnonzero(self.records >= first))

    def __iter__(self) -> Iterator[Item]:
        for i, t in enumerate(self.times.tolist()):
            yield Item(None if t == NO_TIME else t, self.position(i), self.row(i))

    def __repr__(self) -> str:
        return f"RowBatch({len(self.times)} rows)"


def _nondecreasing(values: Sequence[Any]) -> bool:
    return all(map(le, values, islice(values, 1, None)))


def _nondecreasing_array(values: np.ndarray) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


@dataclass(slots=True)
class WindowRows:
    """A closed window's rows as ordering cut them: each shard's, in its order, late
    rows first; ``seal`` makes the :class:`~mldserver.coordinator.handoff.Window` a
    sink gets."""

    start: int
    end: int
    parts: dict[str, list[RowBatch]] = field(default_factory=dict, repr=False)  # shard -> its rows
    late_rows: int = 0  # the first ``late_rows`` rows in merged order are late

    def __len__(self) -> int:
        return sum(len(part) for parts in self.parts.values() for part in parts)


@dataclass(slots=True)
class ShardOrder:
    floor: float = -math.inf  # the effective event time of the shard's last row
    high: Position | None = None  # the highest position delivered here
    held: list[RowBatch] = field(default_factory=list)  # waiting for parents to finish
    queue: deque[RowBatch] = field(default_factory=deque)  # in no closed window yet; times never decrease


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
        self.pending_late: list[tuple[str, RowBatch]] = []  # rows whose window had closed, for the next to close
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
        assert not state.held and not state.queue, f"{shard_id} still has rows here"
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
        late = [(s, rows) for s, rows in self.pending_late if s != shard_id]
        dropped = sum(len(rows) for s, rows in self.pending_late if s == shard_id)
        self.pending_late = late
        state = self.shards.pop(shard_id, None)
        if state is not None:
            dropped += sum(map(len, state.held)) + sum(map(len, state.queue))
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

    def add(self, shard_id: str, rows: RowBatch, last: Position | None, now: float) -> RowBatch:
        """One processed batch's rows; returns the rows kept, their times clamped."""
        state = self.shard(shard_id)
        high = state.high
        if high is not None and len(rows) and rows.lowest() <= high:
            kept = rows.above(high)
            self.duplicates += len(rows) - len(kept)
            rows = kept
        if last is not None and (high is None or last > high):
            state.high = last
        if not len(rows):
            return rows
        rows = self._clamped(state, rows, now)
        if state.held or self._blocked(shard_id, now):
            state.held.append(rows)
        else:
            self._enqueue(shard_id, self._after_parents(shard_id, rows))
        return rows

    def _clamped(self, state: ShardOrder, rows: RowBatch, now: float) -> RowBatch:
        """Event times as a running maximum from the shard's last (a row without one
        takes the previous row's; the shard's first, ``now``)."""
        import numpy as np

        given = rows.times
        times = given.astype(np.int64)  # a copy: the given times may be a read-only frame
        if state.floor == -math.inf:
            if times[0] == NO_TIME:
                times[0] = int(now)
        elif times[0] < state.floor:
            times[0] = int(state.floor)
        np.maximum.accumulate(times, out=times)
        self.clamped += int(np.count_nonzero((given < times) & (given != NO_TIME)))
        state.floor = int(times[-1])
        return rows.with_times(times)

    def _blocked(self, shard_id: str, now: float) -> bool:
        return any(self.blocks(p, now) for p in self.parents_of(shard_id))

    def release(self, now: float) -> list[str]:
        """Let children whose parents are done into the windows; returns their ids."""
        released = []
        for shard_id, state in self.shards.items():
            if state.held and not self._blocked(shard_id, now):
                held, state.held = state.held, []
                for rows in held:
                    self._enqueue(shard_id, self._after_parents(shard_id, rows))
                released.append(shard_id)
        return released

    def _after_parents(self, shard_id: str, rows: RowBatch) -> RowBatch:
        """Clamp a child's rows to start after its parents' last rows."""
        import numpy as np

        start = -math.inf
        for parent in self.parents_of(shard_id):
            p = self.shards.get(parent)
            if p is not None and p.floor != -math.inf:
                start = max(start, p.floor + (1 if shard_id < parent else 0))
        if rows.times[0] >= start:
            return rows
        start = int(start)
        self.clamped += int(np.count_nonzero(rows.times < start))
        state = self.shards[shard_id]
        state.floor = max(state.floor, start)
        return rows.with_times(np.maximum(rows.times, start))

    def _enqueue(self, shard_id: str, rows: RowBatch) -> None:
        """Into the shard's queue; rows whose window has closed go to the next to close."""
        import numpy as np

        closed = self.closed_until
        late = 0
        if closed != -math.inf:
            before = int(closed - closed % self.window_ms)  # a row before this is in a closed window
            if rows.times[0] < before:
                late = int(np.searchsorted(rows.times, before))
                self.pending_late.append((shard_id, rows[:late]))
                self.late_rows += late
        if late < len(rows):
            self.shards[shard_id].queue.append(rows[late:] if late else rows)

    def close(self, until: float) -> list[WindowRows]:
        """The windows whose end is at or below the watermark ``until``, in order, cut
        out of every shard's queue (a binary search each). :func:`seal` sorts them."""
        size = self.window_ms
        windows = []
        while True:
            heads = [(int(s.queue[0].times[0]), shard_id) for shard_id, s in self.shards.items() if s.queue]
            if not heads:
                break
            first = min(heads)[0]
            start = first - first % size
            end = start + size
            if end > until:
                break
            parts = {shard_id: _cut(self.shards[shard_id].queue, end) for t, shard_id in heads if t < end}
            windows.append(WindowRows(start, end, parts))
            self.closed_until = max(self.closed_until, end)
        if self.pending_late and (windows or until >= self.closed_until + size):
            # late rows alone, once the window after the last closed one is itself past the
            # watermark (say, a lease moved here with rows older than what this server closed)
            if not windows:
                end = int(self.closed_until)
                windows.append(WindowRows(end, end + size))
                self.closed_until = end + size
            first_window = windows[0]
            late: dict[str, list[RowBatch]] = {}
            for shard_id, rows in self.pending_late:
                late.setdefault(shard_id, []).append(rows)
            for shard_id, parts in late.items():
                first_window.parts[shard_id] = parts + first_window.parts.get(shard_id, [])
            first_window.late_rows = sum(len(rows) for _, rows in self.pending_late)
            self.pending_late = []
        return windows

    def buffered_windows(self) -> int:
        """Windows holding rows, not closed yet."""
        import numpy as np

        size = self.window_ms
        starts: set[int] = set()
        for state in self.shards.values():
            for rows in state.queue:
                times, i = rows.times, 0
                while i < len(times):
                    start = int(times[i]) - int(times[i]) % size
                    starts.add(start)
                    i = int(np.searchsorted(times, start + size))
        return len(starts)


def _cut(queue: deque[RowBatch], end: int) -> list[RowBatch]:
    """The rows before ``end`` off the front of a shard's queue."""
    import numpy as np

    out = []
    while queue:
        head = queue[0]
        if head.times[-1] < end:
            out.append(queue.popleft())
            continue
        k = int(np.searchsorted(head.times, end))
        if k:
            out.append(head[:k])
            queue[0] = head[k:]
        break
    return out


def seal(closed: WindowRows) -> tuple[Window, dict[str, int]]:
    """Order a closed window's rows by the merge key: the window a sink gets (its rows
    as JSON lines, each shard's highest position), and how many rows each shard had in
    it. Here only the order is decided (a sort of the event times of runs that are
    each sorted already); the rows' JSON is copied into that order when the sink first
    reads it, off the event loop."""
    import numpy as np

    shards = sorted(closed.parts)  # shard ids in the merge key's order
    parts = [rows for shard_id in shards for rows in closed.parts[shard_id]]
    counts = {shard_id: sum(map(len, closed.parts[shard_id])) for shard_id in shards}
    n = sum(counts.values())
    times = parts[0].times if len(parts) == 1 else np.concatenate([rows.times for rows in parts] or [[]])
    order: np.ndarray | None
    if all(rows.ordered for rows in parts):
        # Each shard's rows are in merge-key order, and laid out by shard id: a stable
        # sort by time alone puts ties in shard id, then position, then row order.
        order = None if _nondecreasing_array(times) else np.argsort(times, kind="stable")
        positions = {shard_id: closed.parts[shard_id][-1].position(-1) for shard_id in shards}
    else:
        order, positions = _merge_out_of_order(closed, shards, parts, times)
    owners = [shard_id for shard_id in shards for _ in closed.parts[shard_id]]
    window = Window(closed.start, closed.end, JsonLines(n, partial(_gather, parts, order)), closed.late_rows,
                    positions, RowSources(owners, parts, order))
    closed.parts = {}
    return window, counts


class RowSources:
    """A window's ``sources``: (shard id, position) per row in merged order, read from
    the window's parts only when a sink asks (the table sink; the parts stay alive in
    the ledger until committed anyway)."""

    __slots__ = ("_owners", "_parts", "_order")

    def __init__(self, owners: list[str], parts: list[RowBatch], order: np.ndarray | None) -> None:
        self._owners, self._parts, self._order = owners, parts, order

    def __iter__(self) -> Iterator[tuple[str, Position]]:
        shards = [s for s, rows in zip(self._owners, self._parts) for _ in range(len(rows))]
        positions = [p for rows in self._parts for p in map(rows.positions.__getitem__, rows.records.tolist())]
        if self._order is None:
            return zip(shards, positions)
        order = self._order.tolist()
        return zip(map(shards.__getitem__, order), map(positions.__getitem__, order))

    def __len__(self) -> int:
        return sum(map(len, self._parts))


def _merge_out_of_order(closed: WindowRows, shards: list[str], parts: list[RowBatch],
                        times: np.ndarray) -> tuple[np.ndarray, dict[str, Position]]:
    """The merge key in full, for a window where some handler emitted rows out of
    record order: (time, shard, position's rank, row order); and each shard's row that
    sorts last (its highest)."""
    import numpy as np

    sizes = [len(rows) for rows in parts]
    shard_no = np.repeat(np.arange(len(shards)), [sum(map(len, closed.parts[s])) for s in shards])
    # A row's place among its shard's positions: its part (a shard's parts follow one
    # another in position, distinct batches, or in time), then its record index.
    ranks = np.concatenate([(j << 32) | rows.records.astype(np.int64)
                            for s in shards for j, rows in enumerate(closed.parts[s])])
    order = np.lexsort((ranks, shard_no, times))
    last = len(order) - 1 - np.unique(shard_no[order][::-1], return_index=True)[1]
    starts = np.cumsum([0] + sizes)
    positions = {}
    for shard_id, g in zip(shards, order[last].tolist()):
        p = int(np.searchsorted(starts, g, side="right")) - 1
        positions[shard_id] = parts[p].position(g - int(starts[p]))
    return order, positions


def _gather(parts: list[RowBatch], order: np.ndarray | None) -> Made:
    """The window's rows' JSON lines in merged order, and their offsets. Runs where the
    sink first reads the rows (in its thread): the parts as they are, or copied one after
    another when they are in order already; else gathered by pyarrow's ``take`` (C++,
    the GIL released)."""
    if order is None:
        if len(parts) == 1:
            return parts[0].body, parts[0].offsets  # as it is: the offsets say where the rows are
        return _concat(parts)
    return _take(parts, order)


TAKE_BLOCK = 1 << 13  # rows gathered at a time (some 3 MB): pyarrow copies what it takes from first


def _take(parts: list[RowBatch], order: np.ndarray) -> Made:
    """Rows ``order`` (indexes into the parts one after another) into one buffer, a
    block of rows at a time: a block takes from a narrow range of each part (a part's
    rows come out in its order, or nearly), so pyarrow's copy of what it takes from
    stays small and the window is not held twice."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    pool = pa.system_memory_pool()  # malloc's: the copies go back to the system once dropped
    firsts = np.cumsum([0] + [len(rows) for rows in parts])  # each part's first row
    sizes = np.concatenate([np.diff(rows.offsets) for rows in parts])[order]
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    part_of = np.searchsorted(firsts, order, side="right") - 1
    for a in range(0, len(order), TAKE_BLOCK):
        b = min(a + TAKE_BLOCK, len(order))
        rows, owner = order[a:b] - firsts[part_of[a:b]], part_of[a:b]  # (row in its part, part)
        low = np.full(len(parts), np.iinfo(np.int64).max)
        high = np.full(len(parts), -1)
        np.minimum.at(low, owner, rows)
        np.maximum.at(high, owner, rows)
        used = np.flatnonzero(high >= 0)
        spans = high[used] - low[used] + 1
        bases = np.zeros(len(parts), dtype=np.int64)
        bases[used] = np.cumsum(spans) - spans
        values = pa.chunked_array([_arrow(parts[p], int(low[p]), int(high[p]) + 1) for p in used.tolist()],
                                  type=pa.large_binary())
        indices = np.ascontiguousarray(rows - low[owner] + bases[owner], dtype=np.int64)
        # From its buffer: pa.array(ndarray) imports pandas on first use (0.2 s, 30 MiB).
        taken = pc.take(values, pa.Array.from_buffers(pa.int64(), len(indices), [None, pa.py_buffer(indices)]),
                        memory_pool=pool)
        for chunk in taken.chunks:
            _, chunk_offsets, data = chunk.buffers()
            first, last = np.frombuffer(chunk_offsets, dtype=np.int64)[[chunk.offset, chunk.offset + len(chunk)]]
            out[offsets[a] : offsets[a] + last - first] = np.frombuffer(data, dtype=np.uint8, count=last - first,
                                                                        offset=first)
            a += len(chunk)
    return out, offsets


def _arrow(rows: RowBatch, start: int, stop: int) -> Any:
    """Rows ``start`` to ``stop`` as a pyarrow large_binary array over the batch's buffer."""
    import pyarrow as pa

    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), stop - start,
                                            [None, pa.py_buffer(rows.offsets), pa.py_buffer(rows.body)],
                                            offset=start)


def _concat(parts: Sequence[RowBatch]) -> tuple[np.ndarray, np.ndarray]:
    """The parts' JSON lines one after another, and their offsets there: numpy copies
    with the GIL released (``bytes.join`` holds it throughout, stalling the loop)."""
    import numpy as np

    lines = [np.frombuffer(rows.body, dtype=np.uint8, count=rows.nbytes(), offset=int(rows.offsets[0]))
             for rows in parts]
    bases = np.cumsum([0] + [len(part) for part in lines])
    offsets = np.concatenate([[0]] + [rows.offsets[1:] - rows.offsets[0] + base for rows, base in zip(parts, bases)])
    return np.concatenate(lines), offsets
