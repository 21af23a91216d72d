"""The ledger: which of a shard's rows the sink has committed, and so how far the
shard may checkpoint. Pure bookkeeping, no I/O.

A shard may checkpoint only up to the highest position such that it and every
earlier row of that shard are committed (erlmld: "checkpoint at the latest record for
which it and everything before it is done"). Records a handler emitted no row for are
done once their batch is processed. A processed batch's rows come in pieces
(``ordering.add``'s, ``rows.RowBatch``, shared with ``ordering``: nothing is copied),
each with a ``tag``; a window commits some rows of some pieces (slices of them, which
keep the tag), always the front of each piece: the ledger counts each piece's
committed rows, and the lowest position of the rows not committed yet bounds the
checkpoint. A shard's rows commit in time order, so with event times that never
decrease within a shard that is the shard's own order; with ``max_out_of_orderness``
a piece's rows are sorted by time, and a later piece may commit before an earlier::

    ledger.add("s0", [rows], last=Position(12, 0, "12"))  # a processed batch: rows at 10, 11
    ledger.safe("s0")                  # None: nothing committed yet
    ledger.last_end("s0")              # Position(12, 0, "12"): where the uncommitted rows' batches end
    ledger.commit("s0", [rows[:1]])    # the window holding row 10 committed
    ledger.safe("s0")                  # Position(10, 0, "10")
    ledger.commit("s0", [rows[1:]])    # row 11 too: the whole batch is done
    ledger.safe("s0")                  # Position(12, 0, "12")

A shard whose lease is lost has its pending rows dropped (``ledger.drop("s0")``): the
new owner reads them again; what was safe stays safe, until a reading of the shard
begins here again (``opened``): then what is safe is its initialize checkpoint, for it
may deliver records below what was safe that no reading committed (a checkpoint moved
back by hand, a reading that began at LATEST before), and its batches and commits move
it from there.

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
    ledger.commit("s0", [rows[:9_000]])   # the same: the batch's buffers are still held
    ledger.commit("s0", [rows[9_000:]])   # ledger.bytes back where it was
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from ..base.positions import Position
from ..rows.batch import RowBatch

@dataclass(slots=True)
class Piece:
    rows: RowBatch
    held: int  # the memory it holds, whole, until its last row commits
    batch: int  # the shard's batches, numbered: a later batch's rows are all above an earlier's
    done: int = 0  # its first rows, committed


@dataclass(slots=True)
class ShardLedger:
    pending: dict[int, Piece] = field(default_factory=dict)  # tag -> a piece with rows to commit, in order
    ends: deque[Position] = field(default_factory=deque)  # last positions of processed batches
    batches: int = 0
    safe: Position | None = None


class Ledger:
    def __init__(self) -> None:
        self.shards: dict[str, ShardLedger] = {}
        self.rows = 0
        self.bytes = 0
        self.peak_rows = 0  # the most buffered since start
        self.peak_bytes = 0

    def add(self, shard_id: str, pieces: Sequence[RowBatch], last: Position | None) -> None:
        """A processed batch: its kept rows (in pieces, ``ordering.add``'s, tagged), and
        its last record's position."""
        state = self.shards.get(shard_id)
        if state is None:
            state = self.shards[shard_id] = ShardLedger()
        state.batches += 1
        for rows in pieces:
            if not len(rows):
                continue
            held = rows.held_bytes()
            state.pending[rows.tagged().tag] = Piece(rows, held, state.batches)
            self.rows += len(rows)
            self.bytes += held
        if last is not None:
            state.ends.append(last)
        self._advance(state, None)
        if self.rows > self.peak_rows:
            self.peak_rows = self.rows
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def opened(self, shard_id: str, checkpoint: object) -> bool:
        """A reading of the shard begins here at ``checkpoint`` (a Position; anything else:
        a sentinel, nothing safe): what is safe is that, as the daemon has it now. Returns
        whether rows of an earlier reading are still uncommitted here."""
        state = self.shards.get(shard_id)
        if state is None:
            return False
        state.safe = checkpoint if isinstance(checkpoint, Position) else None
        return bool(state.pending)

    def commit(self, shard_id: str, parts: Sequence[RowBatch]) -> None:
        """The sink committed these rows of this shard (slices of its pieces)."""
        state = self.shards[shard_id]
        pending = state.pending
        parts = [part for part in parts if len(part)]
        for part in parts:
            piece = pending[part.tag]
            piece.done += len(part)
            if piece.done >= len(piece.rows):
                del pending[part.tag]
                self.bytes -= piece.held  # its buffers are let go
            self.rows -= len(part)
        self._advance(state, parts)

    def _advance(self, state: ShardLedger, committed: Sequence[RowBatch] | None) -> None:
        head = _lowest(state.pending)
        best = state.safe
        for part in committed or ():
            top = highest_below(part, head)
            if top is not None:
                best = _max(best, top)
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
        pending = state.pending.values() if state is not None else ()
        return RowBatch.concat([p.rows[p.done :] for p in pending])

    def drop(self, shard_id: str, forget: bool = False) -> int:
        """The shard's lease went to another server: its uncommitted rows are let go
        (the new owner reads them again); what is safe stays safe, unless ``forget``
        (the id names another shard now). Returns their count."""
        state = self.shards.pop(shard_id, None) if forget else self.shards.get(shard_id)
        if state is None:
            return 0
        count = sum(len(p.rows) - p.done for p in state.pending.values())
        self.rows -= count
        self.bytes -= sum(p.held for p in state.pending.values())
        state.pending.clear()
        state.ends.clear()
        return count

    def forget(self, shard_id: str) -> None:
        """Drop a shard whose rows are all committed (``done``): it is gone from here."""
        state = self.shards.pop(shard_id, None)
        assert state is None or not state.pending, f"{shard_id} still has uncommitted rows"

    def done(self, shard_id: str) -> bool:
        state = self.shards.get(shard_id)
        return state is None or not state.pending


def _lowest(pending: dict[int, Piece]) -> Position | None:
    """The lowest position of the rows not committed: the lowest of the first batch's
    pieces' rows not committed (a later batch's are higher)."""
    first = next(iter(pending.values()), None)
    if first is None:
        return None
    low = None
    for piece in pending.values():
        if piece.batch != first.batch:
            break
        rows = piece.rows
        p = rows.position(piece.done) if rows.ordered else rows.positions[int(rows.records[piece.done:].min())]
        if low is None or p < low:
            low = p
    return low


def highest_below(rows: RowBatch, head: Position | None) -> Position | None:
    """The highest position of these rows below ``head`` (None: all count; None if none is)."""
    import numpy as np

    if rows.ordered:
        top = rows.position(-1)
        if head is None or top < head:
            return top
        below = int(np.searchsorted(rows.records, bisect.bisect_left(rows.positions, head)))
        return rows.position(below - 1) if below else None
    if head is None:
        return rows.positions[int(rows.records.max())]
    records = rows.records[rows.records < bisect.bisect_left(rows.positions, head)]
    return rows.positions[int(records.max())] if len(records) else None


def _max(a: Position | None, b: Position) -> Position:
    return b if a is None or b > a else a
