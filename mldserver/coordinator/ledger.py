"""The ledger: which of a shard's rows the sink has committed, and so how far the
shard may checkpoint. Pure bookkeeping, no I/O.

A shard may checkpoint only up to the highest position such that it and every
earlier row of that shard are committed (erlmld: "checkpoint at the latest record for
which it and everything before it is done"). Records a handler emitted no row for are
done once their batch is processed. A shard's rows commit in its own order (windows
close in order, a shard's event times never decrease, late rows go to a later
hand-off), so committing is cutting rows off the front of the shard's pending batches
(``rows.RowBatch``, shared with ``ordering``: nothing is copied)::

    ledger.add("s0", [rows], last=Position(12, 0, "12"))  # a processed batch: rows at 10, 11
    ledger.safe("s0")                  # None: nothing committed yet
    ledger.last_end("s0")              # Position(12, 0, "12"): where the uncommitted rows' batches end
    ledger.commit("s0", 1)             # the window holding row 10 committed
    ledger.safe("s0")                  # Position(10, 0, "10")
    ledger.commit("s0", 1)             # row 11 too: the whole batch is done
    ledger.safe("s0")                  # Position(12, 0, "12")

A shard whose lease is lost has its pending rows dropped (``ledger.drop("s0")``): the
new owner reads them again; what was safe stays safe.

It also keeps the count of buffered (uncommitted) rows and the memory they hold: what
the back-pressure caps apply to (and the most of each since start: ``peak_rows``,
``peak_bytes``). A piece holds its buffers whole until its last row is
committed (``RowBatch.held_bytes``: the frame its rows came in, its columns, its
positions; a window's rows are slices of them), so that is what is counted, from the
piece's ``add`` until its last row's ``commit``. A batch that spans windows comes in
one piece a window, each in buffers of its own (``ordering.add``), so a commit lets go
of what it committed::

    ledger.add("s0", [rows], last)     # ledger.bytes += rows.held_bytes(): some 4.2 MB for
                                       # 10,000 rows of 340 bytes from a handler process
    ledger.commit("s0", 9_000)         # the same: the batch's buffers are still held
    ledger.commit("s0", 1_000)         # ledger.bytes back where it was
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from ..base.positions import Position
from ..api.rows import RowBatch

@dataclass(slots=True)
class ShardLedger:
    pending: deque[RowBatch] = field(default_factory=deque)  # uncommitted rows, in order
    held: deque[int] = field(default_factory=deque)  # the memory each pending batch holds, whole
    ends: deque[Position] = field(default_factory=deque)  # last positions of processed batches
    safe: Position | None = None


class Ledger:
    def __init__(self) -> None:
        self.shards: dict[str, ShardLedger] = {}
        self.rows = 0
        self.bytes = 0
        self.peak_rows = 0  # the most buffered since start
        self.peak_bytes = 0

    def add(self, shard_id: str, pieces: Sequence[RowBatch], last: Position | None) -> None:
        """A processed batch: its kept rows (in pieces, ``ordering.add``'s), and its
        last record's position."""
        state = self.shards.get(shard_id)
        if state is None:
            state = self.shards[shard_id] = ShardLedger()
        for rows in pieces:
            if not len(rows):
                continue
            held = rows.held_bytes()
            state.pending.append(rows)
            state.held.append(held)
            self.rows += len(rows)
            self.bytes += held
        if last is not None:
            state.ends.append(last)
        self._advance(state, None)
        if self.rows > self.peak_rows:
            self.peak_rows = self.rows
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def commit(self, shard_id: str, count: int) -> None:
        """The sink committed the next ``count`` rows of this shard."""
        state = self.shards[shard_id]
        pending = state.pending
        left, committed = count, None
        while left:
            head = pending[0]
            if len(head) <= left:
                done = pending.popleft()
                self.bytes -= state.held.popleft()  # its buffers are let go
            else:  # the rest still holds the batch's buffers
                done, pending[0] = head[:left], head[left:]
            left -= len(done)
            committed = done.position(-1)
        self.rows -= count
        self._advance(state, committed)

    def _advance(self, state: ShardLedger, committed: Position | None) -> None:
        head = state.pending[0].position(0) if state.pending else None
        best = state.safe
        if committed is not None and (head is None or committed < head):
            best = _max(best, committed)
        ends = state.ends
        while ends and (head is None or ends[0] < head):
            best = _max(best, ends.popleft())
        state.safe = best

    def safe(self, shard_id: str) -> Position | None:
        state = self.shards.get(shard_id)
        return None if state is None else state.safe

    def last_end(self, shard_id: str) -> Position | None:
        """The last position of the shard's processed batches that is not safe yet:
        where the batches of its uncommitted rows end (what a spool of them goes up
        to). None when there is none."""
        state = self.shards.get(shard_id)
        return state.ends[-1] if state is not None and state.ends else None

    def uncommitted(self, shard_id: str) -> RowBatch:
        state = self.shards.get(shard_id)
        return RowBatch.concat(list(state.pending) if state is not None else [])

    def drop(self, shard_id: str) -> int:
        """The shard's lease went to another server: its uncommitted rows are let go
        (the new owner reads them again); what is safe stays safe. Returns their count."""
        state = self.shards.get(shard_id)
        if state is None:
            return 0
        count = sum(map(len, state.pending))
        self.rows -= count
        self.bytes -= sum(state.held)
        state.pending.clear()
        state.held.clear()
        state.ends.clear()
        return count

    def forget(self, shard_id: str) -> None:
        """Drop a shard whose rows are all committed (``done``): it is gone from here."""
        state = self.shards.pop(shard_id, None)
        assert state is None or not state.pending, f"{shard_id} still has uncommitted rows"

    def done(self, shard_id: str) -> bool:
        state = self.shards.get(shard_id)
        return state is None or not state.pending


def _max(a: Position | None, b: Position) -> Position:
    return b if a is None or b > a else a
