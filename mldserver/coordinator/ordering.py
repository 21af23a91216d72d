"""Ordering: every shard's rows into one plausible total order, cut into windows.
Pure: no I/O, no clock of its own (``now`` is passed in), no asyncio.

Rows arrive a batch at a time as columns (a :class:`~mldserver.rows.batch.RowBatch`) and
wait in their shard's own queue. A closed window's rows are ordered by the merge key
(event time ms, shard id, sequence number as an integer, sub-sequence number, then the
row's place in its shard), so one shard is never reordered. What keeps that promise
where Bloop breaks it is decided here, the policy:

- **clamps**: a row's effective event time never decreases within a shard (a row
  older than its shard's previous one takes that time; counted in ``clamped``). So a
  shard's queue is sorted by time: cutting a window out of it is a binary search
  (``close``), and merging the shards is a stable sort of runs already sorted
  (``merge.seal``);
- **rows out of order** (``disorder_ms``, ``max_out_of_orderness``): instead of the
  clamp, each row keeps its own time and a batch's rows are sorted by it (each piece
  in the queue sorted, cut a binary search each); the shard stands at its largest time
  minus ``disorder_ms`` (``progress``), so a row out of order by less lands in its own
  window. Its rows then commit out of the shard's order: each window says, per shard,
  at or below which position every row is committed (``WindowRows.below``, the commit
  log's ``positions``), and a restart or a lease coming back leaves out, above it, the
  rows at or below the highest handed over whose window had committed (``redo``);
- **duplicates**: a row inside what its shard already delivered here or is known to
  have committed (``seen``: intervals, ``base.intervals``; a daemon restart
  re-delivers from the checkpoint), or at or below what the reading under way
  delivered (a replay), is dropped and counted. Below the lowest
  position a reading of the shard started from, a row no owner read is not a
  duplicate however high the shard's committed position: each reading's rows are
  their own interval, from its ``start`` (just above its initialize checkpoint, or its
  first row: ``opened``), which a window's commit claims (``reading``);
- **lineage**: a child shard's rows are held until none of its parents (up to two)
  can still add rows, and are then clamped to start no earlier than the parents'
  last rows (one millisecond later where the child's id sorts before a parent's, so
  the merge key itself puts parents first);
- **late rows**: a row whose window has closed goes with the next window to close
  (alone, in the window after the last closed one, once that one is past the
  watermark too), counted in ``late_rows``; never dropped. Into a table with
  ``allowed_lateness`` (``amend_ms``), those whose window ended less than that before
  the watermark amend their windows where they are: they go with the next window too,
  but as ``WindowRows.amending`` (counted in ``amended_rows``), in their own windows.

Windows are tumbling (``windows.Tumbling``); hopping windows are made of tumbling
panes a slide long (``panes``), session windows of panes a gap long (``sessions``).
A shard whose lease went to another server is ``drop``-ped: its rows leave the open windows at once, and only what is
committed of it counts as delivered should it come back. A shard gone from here whose
rows are all committed is ``forget``-ten; the intervals it delivered are kept a
while (the last ``RETIRED`` such shards), so that a shard coming back (its SHARD_END
or its lease lost, then taken again) has the rows it delivered before dropped as
duplicates, not committed twice.

A batch of records at 7, 8 and 9 (``rows``: a row for 7 at 1_500, two for 9 with no
event time given), then one at 10 given 61_000, of a shard with no parents::

    ordering = Ordering(window_ms=60_000, blocks=lambda parent, now: False, parents_of=lambda s: ())
    [kept] = ordering.add("s0", rows, last=Position(9..), now=now) # times [1_500, 1_500, 1_500]:
                                                                   # a running maximum
    ordering.add("s0", more, last=Position(10..), now=now)         # times [61_000]
    ordering.close(until=59_000)      # []: the watermark has not passed 60_000 yet
    [closed] = ordering.close(until=60_000)   # WindowRows(0, 60000, parts={"s0": [rows[0:3]]})
    ordering.buffered_windows()       # 1: [60_000, 120_000) holds the row at 10
    ordering.holds_children(["s1"])   # False: no child's rows wait for their parents

``merge.seal(closed)`` then puts a closed window's rows in the merge key's order.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..base.config import Settings
from ..base.intervals import Intervals, after, joined, spans, top, union
from ..base.positions import Position
from ..rows.batch import NO_TIME, RowBatch, nondecreasing
from .amends import Amends
from .ledger import highest_below
from .panes import Panes
from .sessions import Sessions
from .windows import Tumbling, WindowRows

__all__ = ["Ordering", "WindowRows"]

RETIRED = 1024  # forgotten shards whose delivered intervals are kept


@dataclass(slots=True)
class ShardOrder:
    floor: float = -math.inf  # the effective event time of the shard's last row (its largest)
    seen: Intervals = ()  # delivered here, or known committed: records inside are duplicates
    start: Position | None = None  # where the rows delivered here start: the low of their interval
    starting: bool = True  # the next batch's first record sets ``start`` (a reading begun at a sentinel)
    high: Position | None = None  # the highest position this reading (and those it continues) delivered: below, a replay
    held: list[RowBatch] = field(default_factory=list)  # waiting for parents to finish
    # in no closed window yet; times never decrease (with ``disorder_ms``, within each piece)
    queue: deque[RowBatch] = field(default_factory=deque)
    handed: Position | None = None  # with ``disorder_ms``: the highest position handed over
    last: float = -math.inf  # with ``disorder_ms``: the event time of the shard's last row


class Ordering:
    """Every shard's queue, and what is delivered, held, late and closed (see above)."""

    def __init__(
        self,
        *,
        window_ms: int,
        slide_ms: int | None = None,
        session: tuple[int, str] | None = None,
        lateness_ms: int = 0,
        keep_late: bool = True,
        in_place: bool = False,
        disorder_ms: int = 0,
        blocks: Callable[[str, float], bool],
        parents_of: Callable[[str], Iterable[str]],
    ) -> None:
        # Tumbling, aligned to the epoch; hopping windows (``slide_ms``) are made of tumbling
        # panes a slide long (``panes``), session windows (``session``: the gap in ms, the
        # key's field) of panes a gap long (``sessions``): rows are queued and cut by pane.
        self.window = Tumbling(session[0] if session else slide_ms or window_ms)
        # Tumbling windows kept open to late rows for ``lateness_ms`` (allowed_lateness) are
        # ``amends``' (late rows beyond it in every version of their window, or once: ``keep_late``).
        # Into a table (``in_place``), a late row within the lateness amends its window where
        # it is: committed with the next handover, in its own window (``amending``).
        self.panes: Panes | Sessions | Amends | None = None
        self.amend_ms = lateness_ms if in_place and not (session or slide_ms) else 0
        if session:
            self.panes = Sessions(*session)
        elif slide_ms and slide_ms != window_ms:
            self.panes = Panes(window_ms, slide_ms)
        elif lateness_ms and not in_place:
            self.panes = Amends(window_ms, lateness_ms, keep_late)
        # max_out_of_orderness: rows keep their own times, each piece sorted by time; a shard
        # stands at its largest time minus this (``progress``)
        self.disorder_ms = disorder_ms
        # with it, rows handed over before a restart or a lost lease, above the position at or
        # below which all are committed: per shard, the highest handed over and the end of the
        # windows committed then (a row at or below it and before that end is a duplicate)
        self.redo: dict[str, list[tuple[Position, int]]] = {}
        self.blocks = blocks  # can this (parent) shard still add rows at ``now``?
        self.parents_of = parents_of
        self.shards: dict[str, ShardOrder] = {}
        self.retired: OrderedDict[str, Intervals] = OrderedDict()  # forgotten shard -> its delivered intervals
        self.pending_late: list[tuple[str, RowBatch]] = []  # rows whose window had closed, for the next to close
        self.closed_until = -math.inf  # end of the last closed window
        self.latest = -math.inf  # the largest event time delivered, any shard
        self.clamped = 0
        self.duplicates = 0
        self.late_rows = 0
        self.amended_rows = 0  # late rows committed into their own windows (``amend_ms``)

    @classmethod
    def of(cls, settings: Settings, *, blocks: Callable[[str, float], bool],
           parents_of: Callable[[str], Iterable[str]]) -> Ordering:
        """The windows the settings ask for: ``window``, ``slide``, ``session_gap`` and
        ``session_key``, ``allowed_lateness`` (with ``late_policy``)."""
        def ms(seconds: float | None) -> int:
            return round(seconds * 1000) if seconds else 0

        session = (ms(settings.session_gap), str(settings.session_key)) if settings.session_gap else None
        return cls(window_ms=ms(settings.window), slide_ms=ms(settings.slide) or None, session=session,
                   lateness_ms=ms(settings.allowed_lateness), keep_late=settings.late_policy == "next",
                   in_place=str(settings.sink).startswith("iceberg:"), disorder_ms=ms(settings.max_out_of_orderness), blocks=blocks, parents_of=parents_of)

    def shard(self, shard_id: str) -> ShardOrder:
        state = self.shards.get(shard_id)
        if state is None:
            state = self.shards[shard_id] = ShardOrder(seen=self.retired.pop(shard_id, ()))
        return state

    def opened(self, shard_id: str, checkpoint: object, buffered: bool) -> None:
        """A reading of the shard begins here (initialize) just above ``checkpoint`` (a
        Position; anything else, such as None or a sentinel like LATEST: at its first
        record). With rows of the reading before still uncommitted here (``buffered``)
        it continues that one (``apart`` says which do not): its rows start where that
        one's did, and what it re-delivers up to where that one got is a replay."""
        state = self.shard(shard_id)
        if not buffered:
            state.high = None
            state.start = after(checkpoint) if isinstance(checkpoint, Position) else None
            state.starting = state.start is None

    def apart(self, shard_id: str, checkpoint: object) -> bool:
        """Would a reading from ``checkpoint`` not continue the one whose rows are read
        here: from a sentinel, from below where they start, or past a gap above what it
        delivered? Its rows still uncommitted here would then mix with rows of another
        stretch of the shard: the coordinator drops them first (the new reading reads
        them again, or starts past them as the daemon's checkpoint says)."""
        state = self.shards.get(shard_id)
        if state is None or state.start is None:
            return False
        if not isinstance(checkpoint, Position):
            return True
        start = after(checkpoint)
        return start < state.start or (state.high is not None and start > after(state.high))

    def forget(self, shard_id: str) -> None:
        """Drop a shard with no rows left here; remember its delivered intervals a while."""
        state = self.shards.pop(shard_id, None)
        if state is None:
            return
        assert not state.held and not state.queue, f"{shard_id} still has rows here"
        if state.seen:
            self.retired[shard_id] = state.seen
            self.retired.move_to_end(shard_id)
            while len(self.retired) > RETIRED:
                self.retired.popitem(last=False)

    def drop(self, shard_id: str, committed: Intervals, safe: Position | None = None, forget: bool = False) -> int:
        """The shard's lease went to another server: its rows still here (open windows,
        late, held, kept panes) go, and it starts afresh should it come back, with what is
        committed of it (``committed``, and its reading here up to ``safe``) as the
        intervals inside which records are duplicates; ``forget``: the id names another
        shard now, nothing of this one is kept. Returns the rows dropped."""
        dropped = sum(len(rows) for s, rows in self.pending_late if s == shard_id)
        self.pending_late = [(s, rows) for s, rows in self.pending_late if s != shard_id]
        state = self.shards.pop(shard_id, None)
        if state is not None:
            dropped += sum(map(len, state.held)) + sum(map(len, state.queue))
            if safe is not None and state.start is not None and not forget:
                committed = joined(committed, state.start, safe)
            high = top(committed)
            if state.handed is not None and (high is None or state.handed > high) and not forget:
                self.redo.setdefault(shard_id, []).append((state.handed, int(self.closed_until)))
        if self.panes is not None:
            dropped += self.panes.drop(shard_id)  # its rows in closed panes, still in windows to come
        self.retired.pop(shard_id, None)
        if forget:
            self.redo.pop(shard_id, None)
            committed = ()
        if committed:
            self.retired[shard_id] = committed
        return dropped

    def delivered(self, shard_id: str, committed: Intervals) -> None:
        """Positions inside these intervals count as delivered (a commit log, a shared sink)."""
        state = self.shard(shard_id)
        state.seen = union(state.seen, committed)

    def reading(self, shard_id: str) -> tuple[Position | None, Position | None]:
        """Where the rows delivered here of the shard start (None: not known here), and
        how far the reading under way has delivered if none of its rows waits here for a
        window (None otherwise; and with panes, sessions or rows out of order, whose
        rows may wait elsewhere): a window committing its last rows covers the records
        after them too, so a reading from the checkpoint it leaves continues its interval."""
        state = self.shards.get(shard_id)
        if state is None:
            return None, None
        if state.held or state.queue or self.panes is not None or self.disorder_ms or \
                any(s == shard_id for s, _ in self.pending_late):
            return state.start, None
        return state.start, state.high

    def resume(self, committed_end: int, output: dict[str, Position] | None = None,
               final_until: int | None = None, handed: dict[str, list[tuple[Position, int]]] | None = None) -> None:
        """Windows up to ``committed_end`` were committed before a restart: rows for
        them are late now, so a window id is never committed twice (for hopping
        windows, rows of the panes no committed window let go are read again; for
        sessions, rows of sessions still open then, and ``output`` says which were
        handed over: ``Sessions.resume``; for rows out of order, ``handed``: per shard, the
        highest row each commit handed over, with the end of the windows committed then)."""
        if isinstance(self.panes, Sessions):
            self.panes.resume(committed_end, output or {})
            return
        if isinstance(self.panes, Amends):  # windows not final then are handed over again, whole
            final = self.panes.resume(final_until)
            if final is not None:
                self.closed_until = max(self.closed_until, final)
            return
        if self.panes is not None:
            committed_end = self.panes.resume(committed_end)
        elif self.disorder_ms:
            for shard_id, pairs in (handed or {}).items():
                self.redo.setdefault(shard_id, []).extend(pairs)
        self.closed_until = max(self.closed_until, committed_end)

    def add(self, shard_id: str, rows: RowBatch, last: Position | None, now: float,
            keep: Callable[[RowBatch], RowBatch] | None = None) -> list[RowBatch]:
        """One processed batch's rows; returns the rows kept, their times clamped, in
        pieces: one, or one a window, each in buffers of its own, for a batch whose rows
        span windows (``pieces``). ``keep`` says how each piece is kept (the
        coordinator's: in memory, or spilled to a file past its cap)."""
        state = self.shard(shard_id)
        seen = state.seen
        if state.starting and (len(rows) or last is not None):
            state.start, state.starting = rows.lowest() if len(rows) else last, False
        high = state.high  # (the usual batch: above all of it)
        if len(rows) and ((high is not None and rows.lowest() <= high) or (seen and rows.lowest() <= seen[-1][1])):
            kept = _outside(rows, seen if high is None else joined(seen, None, high))
            self.duplicates += len(rows) - len(kept)
            rows = kept
        if last is not None and (high is None or last > high):
            state.high = last
            if state.start is not None:
                state.seen = joined(seen, state.start, last)
        if not len(rows):
            return []
        rows = self._own_times(state, rows, now) if self.disorder_ms else self._clamped(state, rows, now)
        if shard_id in self.redo:
            rows = self._not_handed_over(shard_id, rows)
            if not len(rows):
                return []
        pieces = self._pieces(rows)
        if keep is not None:
            pieces = list(map(keep, pieces))
        for piece in pieces:  # the ledger's name for it, kept by its slices: whose rows a window commits
            piece.tagged()
        if state.held or self._blocked(shard_id, now):
            state.held.extend(pieces)
        else:
            for piece in pieces:
                self._enqueue(shard_id, self._after_parents(shard_id, piece))
        return pieces

    def _pieces(self, rows: RowBatch) -> list[RowBatch]:
        """A batch whose rows span windows as one piece a window, each in buffers of its
        own (``RowBatch.cut``), so that a window's commit lets go of its rows' memory.
        Times are sorted (clamped)."""
        import numpy as np

        times = rows.times
        if self.window.end(int(times[0])) > times[-1]:
            return [rows]  # one window: kept as it is
        bounds, i = [], 0
        while True:
            i = int(np.searchsorted(times, self.window.end(int(times[i]))))
            if i >= len(times):
                return rows.cut(bounds)
            bounds.append(i)

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
        self.latest = max(self.latest, state.floor)
        return rows.with_times(times)

    def _own_times(self, state: ShardOrder, rows: RowBatch, now: float) -> RowBatch:
        """With ``disorder_ms``: each row keeps its own event time (a row without one takes
        the previous row's; the shard's first, ``now``), the rows sorted by it (a copy,
        when they are not in order already)."""
        import numpy as np

        times = rows.times.astype(np.int64)
        missing = times == NO_TIME
        if missing.any():
            if missing[0]:
                times[0] = int(now) if state.last == -math.inf else int(state.last)
            given = np.where(times != NO_TIME, np.arange(len(times)), 0)
            times = times[np.maximum.accumulate(given)]  # each missing one: the previous given
        state.last = int(times[-1])
        if not nondecreasing(times):
            order = np.argsort(times, kind="stable")
            rows, times = rows.take(order), times[order]
        state.floor = max(state.floor, int(times[-1]))
        self.latest = max(self.latest, state.floor)
        return rows.with_times(times)

    def _not_handed_over(self, shard_id: str, rows: RowBatch) -> RowBatch:
        """Rows out of order handed over before a restart or a lost lease (``redo``) left
        out as duplicates: those at or below a commit's highest row handed over whose
        window ended by that commit (the others below it were in windows not committed
        then; a row late then went with that commit or an earlier one)."""
        import numpy as np

        lowest = rows.lowest()
        twice = None
        for handed, end in self.redo[shard_id]:  # a commit's highest row handed over, its windows' end
            if lowest > handed:
                continue
            at_or_below = bisect.bisect_right(rows.positions, handed)
            mask = (rows.records < at_or_below) & (rows.times < end)
            twice = mask if twice is None else twice | mask
        if twice is None or not twice.any():
            return rows
        self.duplicates += int(twice.sum())
        return rows.take(np.flatnonzero(~twice))

    def progress(self, shard_id: str, pieces: list[RowBatch]) -> int | None:
        """How far in event time the shard has got with a batch (its watermark), given
        the batch's pieces: their last time, or with ``disorder_ms`` the shard's largest
        time minus it. None: the batch brought no row."""
        if not pieces:
            return None
        if self.disorder_ms:
            return int(self.shards[shard_id].floor) - self.disorder_ms
        return int(pieces[-1].times[-1])

    def holds_children(self, children: Iterable[str]) -> bool:
        """Are rows of any of these shards held here, waiting for their parents?"""
        shards = self.shards
        return any(state.held for state in map(shards.get, children) if state is not None)

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
            before = self.window.start(closed)  # a row before this is in a closed window
            if rows.times[0] < before:
                late = int(np.searchsorted(rows.times, before))
                older = rows[:late]
                if isinstance(self.panes, Amends):  # those for windows not final amend them
                    older = self.panes.take(shard_id, older)
                if len(older):
                    self.pending_late.append((shard_id, older))
                    self.late_rows += len(older)
        if late < len(rows):
            self.shards[shard_id].queue.append(rows[late:] if late else rows)

    def close(self, until: float) -> list[WindowRows]:
        """The windows whose end is at or below the watermark ``until``, in order, cut
        out of every shard's queue (a binary search each). ``merge.seal`` sorts them."""
        size = self.window.size
        windows = []
        first_time, cut = (_first, _cut) if not self.disorder_ms else (_first_of_all, _cut_all)
        while True:
            heads = [(first_time(s.queue), shard_id) for shard_id, s in self.shards.items() if s.queue]
            if not heads:
                break
            first = min(heads)[0]
            start = self.window.start(first)
            end = start + size
            if end > until:
                break
            parts = {shard_id: cut(self.shards[shard_id].queue, end) for t, shard_id in heads if t < end}
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
            # into a table, those whose window ended less than amend_ms before the watermark amend
            # it where they are: committed now, in their own window
            amends_from = self.window.start(until - self.amend_ms) if self.amend_ms and until < math.inf else math.inf
            for shard_id, rows in self.pending_late:
                rows, amending = _split(rows, amends_from)
                if len(amending):
                    first_window.amending.setdefault(shard_id, []).append(amending)
                    self.amended_rows += len(amending)
                    self.late_rows -= len(amending)
                if len(rows):
                    first_window.late.setdefault(shard_id, []).append(rows)
                    first_window.late_rows += len(rows)
            self.pending_late = []
        if self.disorder_ms and windows:
            self._below(windows)
        if isinstance(self.panes, Sessions):
            # a session ends once no row before its end can still come: the watermark, or
            # the oldest row queued, in a pane not closed yet
            until = min([until] + [int(s.queue[0].times[0]) for s in self.shards.values() if s.queue])
        elif isinstance(self.panes, Amends):
            # a window is final once the watermark passes its end plus the allowed lateness, no
            # further than the rows have gone: a stream gone quiet (its watermark past
            # everything) makes no window final, new rows do
            until = min(until, self.latest)
        return windows if self.panes is None else self.panes.assemble(windows, until)

    def _below(self, windows: list[WindowRows]) -> None:
        """Rows out of order: for each window and shard, a position at or below which
        every row of the shard is in that window or an earlier one (``WindowRows.below``:
        what a restart may leave out as committed), and each shard's highest handed over."""
        lowest: dict[str, Position] = {}  # of the rows after the window
        for shard_id, state in self.shards.items():
            waiting = [rows.lowest() for rows in (*state.held, *state.queue) if len(rows)]
            if waiting:
                lowest[shard_id] = min(waiting)
        for window in reversed(windows):
            window.below = {}
            for shard_id in {*window.parts, *window.late}:
                parts = [rows for rows in (*window.late.get(shard_id, ()), *window.parts.get(shard_id, ())) if len(rows)]
                if not parts:
                    continue
                low = lowest.get(shard_id)
                below = [p for p in (highest_below(rows, low) for rows in parts) if p is not None]
                if below:
                    window.below[shard_id] = max(below)
                low_here = min(rows.lowest() for rows in parts)
                lowest[shard_id] = low_here if low is None else min(low, low_here)
                state = self.shards.get(shard_id)
                top = max(highest_below(rows, None) for rows in parts)
                if state is not None and (state.handed is None or top > state.handed):
                    state.handed = top

    def buffered_windows(self) -> int:
        """Windows holding rows, not closed yet."""
        import numpy as np

        window = self.window
        starts: set[int] = set()
        for state in self.shards.values():
            for rows in state.queue:
                times, i = rows.times, 0
                while i < len(times):
                    start = window.start(int(times[i]))
                    starts.add(start)
                    i = int(np.searchsorted(times, start + window.size))
        return len(starts)


def _outside(rows: RowBatch, seen: Intervals) -> RowBatch:
    """The rows whose record is inside none of the intervals."""
    import numpy as np

    inside = spans(seen, rows.positions)  # record index spans
    if not inside:
        return rows
    if rows.ordered and len(inside) == 1 and inside[0][0] == 0:  # the usual re-delivery: a prefix
        return rows[int(np.searchsorted(rows.records, inside[0][1])) :]
    records = rows.records
    twice = np.zeros(len(records), dtype=bool)
    for i, j in inside:
        twice |= (records >= i) & (records < j)
    return rows.take(np.flatnonzero(~twice))


def _split(rows: RowBatch, at: float) -> tuple[RowBatch, RowBatch]:
    """Rows sorted by time: those before ``at``, and the rest."""
    import numpy as np

    k = int(np.searchsorted(rows.times, at))
    return rows[:k], rows[k:]


def _first(queue: deque[RowBatch]) -> int:
    """The earliest time in a shard's queue: its first row's (times never decrease)."""
    return int(queue[0].times[0])


def _first_of_all(queue: deque[RowBatch]) -> int:
    """The earliest time in a shard's queue of pieces each sorted (``disorder_ms``)."""
    return min(int(rows.times[0]) for rows in queue)


def _cut_all(queue: deque[RowBatch], end: int) -> list[RowBatch]:
    """The rows before ``end`` out of every piece of a shard's queue, each sorted
    (``disorder_ms``): the front of each."""
    import numpy as np

    out, kept = [], []
    for rows in queue:
        if rows.times[-1] < end:
            out.append(rows)
        elif rows.times[0] >= end:
            kept.append(rows)
        else:
            k = int(np.searchsorted(rows.times, end))
            out.append(rows[:k])
            kept.append(rows[k:])
    queue.clear()
    queue.extend(kept)
    return out


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
