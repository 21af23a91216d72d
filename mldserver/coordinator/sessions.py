"""Sessions: per-key session windows made of the panes ``ordering`` closes. Pure: no
I/O, no clock, no asyncio.

A session gathers the rows of one key (a field of each row, ``session_key``) that
follow one another by less than ``gap``: a row at least ``gap`` after the previous row
of its key starts a new session, and a session spans its first row's time to its last
row's time plus ``gap`` (Spark's ``session_window``). ``ordering`` queues and cuts rows
in panes ``gap`` long (its tumbling windows), so by the time the watermark passes a
session's end every row of it is in a closed pane. The sessions the watermark closed
are handed over together, one window a step (``WindowRows.sessions``: their rows
copied out of the panes, each with its session's span)::

    sessions = Sessions(gap=30_000, key="user")
    sessions.assemble(ordering.close(until=60_000), until=60_000)
    # [WindowRows(1_000, 60_000, kind="session")]: the sessions whose end is at or before
    # 60_000 (say user "a" at 1_000 and 12_000: the session [1_000, 42_000)); the
    # window's end is the watermark it was cut at, its start its first session's

A pane is kept until every session with rows in it has closed; a handover commits the
panes it lets go (``WindowRows.commits``: what its shards may checkpoint past, in
order), so a session still open holds its shards' checkpoints where its first row is.
After a restart those rows are read again, and the sessions they make again are
handed over once more unless the commit log says they were: a session ending at or
before the last handover's end, whose row is at or below the highest position handed
over of its shard (``resume``), is left out.

A row that comes after its pane closed (``ordering``'s late rows) joins its key's open
session when it is within ``gap`` of it, and otherwise starts a session of its own,
counted late (``late_policy`` says what happens to it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..base.positions import Position
from .windows import SessionRows, WindowRows

if TYPE_CHECKING:
    import numpy as np

    from ..rows.batch import RowBatch


@dataclass(slots=True)
class Session:
    sid: int
    key: Any
    start: int
    last: int
    late: bool = False
    panes: set[int] = field(default_factory=set)  # the panes holding its rows (their numbers)


@dataclass(slots=True)
class SessionPiece:
    shard: str
    rows: RowBatch
    sids: np.ndarray  # each row's session
    late: bool


@dataclass(slots=True)
class Pane:
    number: int
    rows: WindowRows  # as ordering closed it: what it commits once let go
    pieces: list[SessionPiece]
    open: int = 0  # sessions not closed yet with rows here


class Sessions:
    def __init__(self, gap: int, key: str) -> None:
        self.gap = gap
        self.key = key
        self.kept: deque[Pane] = deque()  # closed panes, in order, each with rows in a session still open
        self.panes = 0  # panes numbered so far
        self.sessions: dict[int, Session] = {}  # open, by number
        self.latest: dict[Any, Session] = {}  # each key's newest open session
        self.ends: list[tuple[int, int]] = []  # (end, session) heap; an end may have moved on since
        self.next_sid = 0
        self.handed_until = -math.inf  # the end of the last handover
        self.resumed_end = -math.inf  # the commit log's, at start: sessions ending at or before it were handed over
        self.resumed: dict[str, Position] = {}  # ... up to these positions

    def resume(self, committed_end: int, output: dict[str, Position]) -> None:
        """The last handover before a restart ended at ``committed_end``, and each shard's
        rows were handed over up to ``output``: rows read again that made a session
        ending by then are not handed over again."""
        self.resumed_end = committed_end
        self.resumed = dict(output)
        self.handed_until = max(self.handed_until, committed_end)

    def drop(self, shard_id: str) -> int:
        """A shard whose lease went elsewhere: its rows leave the panes kept (the new
        owner reads them again). Returns how many."""
        dropped = 0
        for pane in self.kept:
            keep = [p for p in pane.pieces if p.shard != shard_id]
            dropped += sum(len(p.rows) for p in pane.pieces) - sum(len(p.rows) for p in keep)
            pane.pieces = keep
            for group in (pane.rows.parts, pane.rows.late):
                group.pop(shard_id, None)
        return dropped

    def assemble(self, closed: list[WindowRows], until: float) -> list[WindowRows]:
        """The sessions the watermark ``until`` has closed, handed over together (one
        window, or none), from the panes closed so far (``closed``: the newest)."""
        for rows in closed:
            self._assign(rows)
        ended = self._close(until)
        released = self._release()
        if not ended and not released:
            return []
        end = int(max(until, self.handed_until + 1)) if until != math.inf else int(self.handed_until + 1)
        self.handed_until = end
        window = WindowRows(min((s.start for s in ended), default=end), end, kind="session", commits={})
        assert window.commits is not None
        for pane in released:
            for group in (pane.rows.late, pane.rows.parts):
                for shard_id, rows in group.items():
                    window.commits.setdefault(shard_id, []).extend(rows)
        window.sessions = self._rows(ended, released)
        window.late_rows = window.sessions.late_rows()
        return [window]

    def _assign(self, pane_rows: WindowRows) -> None:
        """Each row of a closed pane into its key's session, in event-time order."""
        import numpy as np

        number = self.panes
        self.panes += 1
        pieces = [SessionPiece(s, rows, np.empty(len(rows), dtype=np.int64), late)
                  for late, group in ((True, pane_rows.late), (False, pane_rows.parts))
                  for s in sorted(group) for rows in group[s] if len(rows)]
        pane = Pane(number, pane_rows, pieces)
        if pieces:
            times = np.concatenate([p.rows.times for p in pieces])
            which = np.repeat(np.arange(len(pieces)), [len(p.rows) for p in pieces])
            index = np.concatenate([np.arange(len(p.rows)) for p in pieces])
            order = np.argsort(times, kind="stable")  # ties: late rows first, then by shard, in its order
            touched: set[int] = set()
            for t, p, i in zip(*(a[order].tolist() for a in (times, which, index)), strict=True):
                piece = pieces[p]
                session = self._session_of(self._key_of(piece.rows.row(i)), t, piece.late)
                session.panes.add(number)
                piece.sids[i] = session.sid
                touched.add(session.sid)
            pane.open = len(touched)
        self.kept.append(pane)

    def _key_of(self, row: bytes) -> Any:
        value = orjson.loads(row).get(self.key) if row.startswith(b"{") else None
        return value if value is None or isinstance(value, (str, int, float, bool)) else orjson.dumps(
            value, option=orjson.OPT_SORT_KEYS)

    def _session_of(self, key: Any, t: int, late: bool) -> Session:
        gap = self.gap
        session = self.latest.get(key)
        if session is not None and session.start - gap < t < session.last + gap:
            session.start = min(session.start, t)
            session.last = max(session.last, t)
            return session
        session = Session(self.next_sid, key, t, t, late=late and (session is None or t < session.start))
        self.next_sid += 1
        self.sessions[session.sid] = session
        if key not in self.latest or t >= self.latest[key].last:
            self.latest[key] = session
        heapq.heappush(self.ends, (t + gap, session.sid))
        return session

    def _close(self, until: float) -> list[Session]:
        """The open sessions whose end the watermark has passed, oldest first."""
        ended = []
        ends = self.ends
        by_number: dict[int, Pane] | None = None
        while ends and ends[0][0] <= until:
            _, sid = heapq.heappop(ends)
            session = self.sessions[sid]
            end = session.last + self.gap
            if end > until:  # it grew since: its end is later now
                heapq.heappush(ends, (end, sid))
                continue
            del self.sessions[sid]
            if self.latest.get(session.key) is session:
                del self.latest[session.key]
            if by_number is None:
                by_number = {pane.number: pane for pane in self.kept}
            for number in session.panes:
                by_number[number].open -= 1
            ended.append(session)
        return sorted(ended, key=lambda s: (not s.late, s.start, s.sid))

    def _release(self) -> list[Pane]:
        """The oldest panes no open session holds rows of."""
        released = []
        while self.kept and self.kept[0].open == 0:
            released.append(self.kept.popleft())
        return released

    def _rows(self, ended: list[Session], released: list[Pane]) -> SessionRows:
        """The rows of the sessions ended, copied out of the panes kept and those let go
        now (the ones the commit log says were handed over before a restart left out)."""
        import numpy as np

        spans = {s.sid: (s.start, s.last + self.gap, s.late) for s in ended}
        rank = {s.sid: i for i, s in enumerate(ended)}
        parts: list[tuple[str, RowBatch, np.ndarray]] = []
        if not ended:
            return SessionRows(parts, [])
        wanted = np.array(sorted(spans), dtype=np.int64)
        rank_of = np.array([rank[sid] for sid in wanted.tolist()], dtype=np.int64)  # by wanted's order
        # (only sessions ending by the last handover before a restart may have been handed over)
        read_again = bool(self.resumed) and any(end <= self.resumed_end for _, end, _ in spans.values())
        for piece in (p for pane in (*released, *self.kept) for p in pane.pieces):
            index = np.flatnonzero(np.isin(piece.sids, wanted))
            if len(index) and read_again:
                index = self._not_handed_over(piece, index, spans)
            if len(index):
                ranks = rank_of[np.searchsorted(wanted, piece.sids[index])]
                parts.append((piece.shard, piece.rows.take(index), ranks))
        return SessionRows(parts, [spans[s.sid] for s in ended])

    def _not_handed_over(self, piece: SessionPiece, index: np.ndarray, spans: dict[int, tuple[int, int, bool]]) -> np.ndarray:
        """Rows read again after a restart, less those whose session ended by the last
        handover and that were handed over then (at or below their shard's position)."""
        import numpy as np

        high = self.resumed.get(piece.shard)
        if high is None:
            return index
        keep = [i for i, sid in zip(index.tolist(), piece.sids[index].tolist())
                if spans[sid][1] > self.resumed_end or piece.rows.position(i) > high]
        return np.array(keep, dtype=np.int64)
