"""Rows: what a handler emitted for one processed batch, as columns (a
:class:`RowBatch`: never an object per row), in the order it emitted them. A shard's
worker builds one per batch (``shard.batches``: from rows emitted in the server's loop,
or read in place from a handler process's columnar body, ``pool.frames``); the
coordinator queues, cuts and merges them (``coordinator.ordering``,
``coordinator.merge``), its ledger keeps them until committed and its spool writes them
out. The value type of that whole way, so it sits below all of them and imports
nothing of the server's but ``positions``: a handler process loads it.

A batch of records at 7, 8 and 9 whose handler emitted a row for 7 at an event time it
gave, and two for 9 with none (so its record's arrival time, 2_000, stands in), as the
server reads it from a handler process's columnar body (``shard.batches.encoded_rows``)::

    rows.times     = [1_500, 2_000, 2_000]                # int64 ms; NO_TIME (-1): none at all
    rows.records   = [0, 2, 2]                            # each row's record, in the batch
    rows.positions = [Position(7..), Position(8..), Position(9..)]   # the batch's, once
    rows.body      = b'{"k":1}\n{"k":2}\n{"k":3}\n'       # JSON lines, one buffer
    rows.offsets   = [0, 8, 16, 24]                       # row i: body[offsets[i]:offsets[i+1]]

    rows.row(0), rows.position(1)      # b'{"k":1}', Position(9..): row 1's record's
    rows[1:3]                          # RowBatch(2 rows): the same buffers, nothing copied
    rows.above(Position(8..))          # RowBatch(2 rows): those of records past 8 (a
                                       # re-delivery's duplicates left out)

``RowBatch.of([Item(1_500, seven, b'{"k":1}'), ...])`` builds one from rows given one
by one (the spool, tests), and iterating a batch gives its ``Item``s back. Slices share
the batch's buffers: a window's rows are slices of its shards' batches until a sink
reads them (``base.handoff.JsonLines``).

numpy is imported where it is used: a server without a sink, and the handler
processes, never load it.
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import sys
from array import array
from itertools import islice
from operator import le
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from ..base.positions import Position, Positions

if TYPE_CHECKING:
    import numpy as np

_TAGS = itertools.count(1)  # RowBatch.tag: 0 is none
NO_TIME = -1  # an event time not given: the shard's previous row's (valid times are >= 0)
# In a handler process's rows (``pool.frames``): no event time given, so the record's
# arrival time, which the server fills in from its own reading of the line (never read
# in the handler process). Arrival times the server read and that are not a plain
# integer: ``ODD_TIME``, read again the usual way, which says what is wrong.
ARRIVAL_TIME = -2
ODD_TIME = -3


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
    record order), so within the batch the merge key's order is the rows' order.
    ``timed``: some row's event time came from the data (``emit``'s ``event_time_ms``),
    not its record's arrival time, so the wall clock says nothing of the times still to
    come (``coordinator.watermarks``). A slice (``rows[i:j]``) shares every buffer.
    ``tag``: the coordinator's name for the piece these rows were cut from (``ordering``
    tags each piece it keeps; slices and copies of it keep the tag), so the ledger knows
    whose rows a window commits."""

    __slots__ = ("times", "records", "positions", "body", "offsets", "ordered", "timed", "tag")

    def __init__(self, times: np.ndarray, records: np.ndarray, positions: Sequence[Position], body: Any,
                 offsets: np.ndarray, ordered: bool | None = None, timed: bool = False, tag: int = 0) -> None:
        self.times = times
        self.records = records
        self.positions = positions
        self.body = body
        self.offsets = offsets
        self.ordered = nondecreasing(records) if ordered is None else ordered
        self.timed = timed
        self.tag = tag

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
            *concat_lines(batches),
            all(b.ordered for b in batches),
            any(b.timed for b in batches),
        )

    def __len__(self) -> int:
        return len(self.times)

    def tagged(self) -> RowBatch:
        """These rows given a tag of their own, unless they have one (``tag``)."""
        if not self.tag:
            self.tag = next(_TAGS)
        return self

    def __getitem__(self, rows: slice) -> RowBatch:
        start, stop, step = rows.indices(len(self.times))
        assert step == 1, "rows are sliced, never strided"
        stop = max(start, stop)
        return RowBatch(self.times[start:stop], self.records[start:stop], self.positions, self.body,
                        self.offsets[start : stop + 1], self.ordered, self.timed, self.tag)

    def with_times(self, times: np.ndarray) -> RowBatch:
        return RowBatch(times, self.records, self.positions, self.body, self.offsets, self.ordered, self.timed,
                        self.tag)

    def compact(self) -> RowBatch:
        """These rows in buffers of their own, copied::

            rows = batch[:4_000].compact()      # 4,000 rows' JSON, columns and positions
            rows.held_bytes() < batch.held_bytes()
        """
        import numpy as np

        start, end = int(self.offsets[0]), int(self.offsets[-1])
        return self._own(np.frombuffer(self.body, dtype=np.uint8, count=end - start, offset=start).copy(), start)

    def cut(self, bounds: Sequence[int]) -> list[RowBatch]:
        """These rows cut before each row index in ``bounds`` (increasing, inside), each
        piece in buffers of its own, so that each is let go on its own: ``ordering``
        cuts a batch whose rows span windows at the windows' ends, and a window's commit
        frees its piece (were the pieces slices, the batch's buffers would be held whole
        until its last window commits). Rows on loan (a handler process's rows arena:
        ``rows/loans.py``) are cut where they lie, their JSON not copied, the loan split
        (this batch, whose bytes the pieces now own, is not read again); any others are
        copied (``compact``)::

            first, second = batch.cut([4_000])  # rows 0-3,999 and 4,000 on
        """
        edges = [0, *bounds, len(self)]
        loan = _root(self.body)
        parts = None
        if getattr(loan, "given", None) is not None:
            from . import loans

            start = loans.origin(self.body, loan)  # where body[0] is in the loan
            firsts = [start + int(self.offsets[j]) for j in bounds]  # each later piece's first byte there
            parts = loans.split(loan, firsts)
        if parts is None:
            return [self[i:j].compact() for i, j in zip(edges, edges[1:])]
        return [self[i:j]._own(part, first - start)
                for i, j, part, first in zip(edges, edges[1:], parts, [0, *firsts])]

    def _own(self, body: Any, shift: int) -> RowBatch:
        """These rows over ``body``, where each row's bytes are ``shift`` earlier than in
        this batch's, with columns and positions of their own."""
        import numpy as np

        records = self.records
        first, last = (int(records[0]), int(records[-1])) if self.ordered else (int(records.min()), int(records.max()))
        positions = self.positions
        sliced = getattr(positions, "sliced", None)  # positions.Positions: a string of their own
        kept = sliced(first, last + 1) if sliced is not None else list(positions[first : last + 1])
        return RowBatch(np.array(self.times, dtype=np.int64), np.asarray(records, dtype=np.int64) - first, kept,
                        body, np.asarray(self.offsets, dtype=np.int64) - shift, self.ordered, self.timed)

    def spilled(self, put: Callable[[Sequence[Any]], list[Any]]) -> RowBatch:
        """These rows out of memory: their columns, JSON lines and positions written by
        ``put`` (``coordinator.spill.Spill.put``: into a file, returning a read-only
        uint8 view of each part, mapped), read back only when a sink reads them. What the
        coordinator keeps past ``max_buffered_bytes``::

            rows = piece.spilled(spill.put)   # rows.held_bytes() == 0
        """
        import numpy as np

        start, end = int(self.offsets[0]), int(self.offsets[-1])
        parts: list[Any] = [np.asarray(self.times, dtype=np.int64), np.asarray(self.records, dtype=np.int64),
                            np.asarray(self.offsets, dtype=np.int64) - start,
                            memoryview(self.body).cast("B")[start:end]]
        positions = self.positions
        if type(positions) is list and not any(p.sub for p in positions):
            positions = Positions.of([p.text for p in positions])  # one string: it can move too
        joined = getattr(positions, "joined", None)  # positions.Positions (KPL sub-records stay)
        if joined is not None:
            parts.append(joined.encode("ascii") if type(joined) is str else joined)
            if positions.ends is not None:
                parts.append(np.asarray(positions.ends, dtype=np.int64))
        views = put(parts)
        times, records, offsets = (v.view(np.int64) for v in views[:3])
        if joined is not None:
            ends = views[5].view(np.int64) if positions.ends is not None else None
            positions = type(positions)(views[4], positions.width, ends)
        return RowBatch(times, records, positions, views[3], offsets, self.ordered, self.timed)

    def take(self, indices: np.ndarray) -> RowBatch:
        """Some of the rows, copied (a rare path: duplicates among rows out of order)."""
        import numpy as np

        body = memoryview(self.body)
        lines = [body[s:e] for s, e in zip(self.offsets[indices].tolist(), self.offsets[indices + 1].tolist())]
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        np.cumsum([len(line) for line in lines], out=offsets[1:])
        return RowBatch(self.times[indices], self.records[indices], self.positions, b"".join(lines), offsets,
                        timed=self.timed, tag=self.tag)

    def position(self, i: int) -> Position:
        return self.positions[int(self.records[i])]

    def row(self, i: int) -> bytes:
        """Row ``i``'s JSON, without its newline."""
        return bytes(memoryview(self.body)[int(self.offsets[i]) : int(self.offsets[i + 1]) - 1])

    def nbytes(self) -> int:
        """The rows' JSON, newlines included."""
        return int(self.offsets[-1] - self.offsets[0])

    def on_disk(self) -> bool:
        """Are these rows' JSON lines in a spill file (``spilled``), not in memory?"""
        return type(_root(self.body)) is mmap.mmap

    def page_out(self) -> None:
        """Rows ``spilled`` to a file, once read (the merge's sort, a sink's gather): the
        pages those reads brought into this process are let go, back to the page cache
        (``madvise(MADV_DONTNEED)``). The rows stay in the file; a later read brings
        them back. What the committer does once a window is committed, so the server
        does not hold a segment's pages (64 MiB) until the segment's last batch goes.
        Rows in memory: nothing to do::

            rows = piece.spilled(spill.put); rows.row(0)   # its page read in
            rows.page_out()                                 # and let go; rows.row(0) reads it again
        """
        segment = _root(self.body)
        if type(segment) is not mmap.mmap:
            return
        import numpy as np

        positions = self.positions
        buffers = (self.times, self.records, self.offsets, self.body,
                   getattr(positions, "joined", None), getattr(positions, "ends", None))
        spans = [(b.ctypes.data, b.ctypes.data + b.nbytes) for b in buffers
                 if isinstance(b, np.ndarray) and b.nbytes and _root(b) is segment]
        if not spans:
            return
        base = np.frombuffer(segment, dtype=np.uint8).ctypes.data
        start = (min(s for s, _ in spans) - base) // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(max(e for _, e in spans) - base, len(segment))
        segment.madvise(mmap.MADV_DONTNEED, start, end - start)

    def held_bytes(self) -> int:
        """The memory this batch keeps alive, which its slices share: each buffer whole
        (the frame its JSON lines were read from, with the columns a handler process
        sent beside them; its own columns, a slice's parents'), and its positions;
        nothing of rows ``spilled`` to a file. What the ledger counts against
        ``max_buffered_bytes``: a 10,000-row batch of 340-byte rows from a handler
        process holds some 4.2 MB (3.4 MB of JSON, 200 kB of columns
        in the frame, 240 kB of columns of its own, 560 kB of positions)."""
        body = _root(self.body)
        held = _size(body)
        for column in (self.times, self.records, self.offsets):
            root = _root(column)
            if root is not body:
                held += _size(root)
        return held + _positions_size(self.positions)

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


def _root(buffer: Any) -> Any:
    """The object that owns a buffer's memory: a view's (numpy's ``base``, a
    memoryview's ``obj``), followed to the end, or to a loan (``rows/loans.py``: bytes of
    a handler process's rows arena, held until given back)."""
    while True:
        if getattr(buffer, "given", None) is not None:
            return buffer
        owner = buffer.obj if type(buffer) is memoryview else getattr(buffer, "base", None)
        if owner is None or owner is buffer:
            return buffer
        buffer = owner


def _size(buffer: Any) -> int:
    if type(buffer) is mmap.mmap:
        return 0  # a file's pages (``spilled``): on disk until read, the kernel's to drop
    return buffer.nbytes if hasattr(buffer, "nbytes") else memoryview(buffer).nbytes


def _positions_size(positions: Sequence[Any]) -> int:
    """A batch's positions: ``positions.Positions`` say, ``Position`` tuples are
    reckoned from the last one (they differ in little but their digits)."""
    if not len(positions):
        return 0
    nbytes = getattr(positions, "nbytes", None)
    if nbytes is not None:
        return nbytes()
    last = positions[-1]
    each = sys.getsizeof(last) + sys.getsizeof(last.seq) + sys.getsizeof(last.text)
    return sys.getsizeof(positions) + len(positions) * each


def _nondecreasing(values: Sequence[Any]) -> bool:
    return all(map(le, values, islice(values, 1, None)))


def nondecreasing(values: np.ndarray) -> bool:
    """Do the array's values never decrease (record indexes, a window's event times)?"""
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def concat_lines(parts: Sequence[RowBatch]) -> tuple[np.ndarray, np.ndarray]:
    """The parts' JSON lines one after another, and their offsets there (a shard's
    batches spooled, a window's parts already in merged order): numpy copies with the
    GIL released (``bytes.join`` holds it throughout, stalling the loop)."""
    import numpy as np

    lines = [np.frombuffer(rows.body, dtype=np.uint8, count=rows.nbytes(), offset=int(rows.offsets[0]))
             for rows in parts]
    bases = np.cumsum([0] + [len(part) for part in lines])
    offsets = np.concatenate([[0]] + [rows.offsets[1:] - rows.offsets[0] + base for rows, base in zip(parts, bases)])
    return np.concatenate(lines), offsets
