"""Merge: a closed window's rows (``ordering.WindowRows``: each shard's, in its own
order) put in the merge key's order, as the window a sink gets. Pure, like ordering:
no I/O, no clock, no asyncio.

``seal`` decides the order only, on the event loop: a stable sort of the event times
of runs each sorted already (numpy, some 10 ns a row), or, for a window where some
handler emitted rows out of record order, a sort by the whole key. The rows' JSON is
copied into that order where a sink first reads it (``handoff.JsonLines``, in the
sink's thread, off the loop): one batch as it is, batches already in order one after
another (``rows.concat_lines``), or rows of interleaved shards gathered row by row
(``_gather.c``, natively; pyarrow's ``take`` where it was not built); or, for a sink
that only writes them out (``JsonLines.chunks``: the file sink), never copied whole:
each run of lines where it is, or a block gathered at a time (for the file sink, into
page-aligned whole disk blocks, which it writes from there). Two shards of a 60 s
window, their rows at 1_000 and 3_000 (``s0``, records 7 and 8) and 2_000 (``s1``,
record 4)::

    [closed] = ordering.close(until=60_000)   # WindowRows(0, 60000, parts={"s0": [...], "s1": [...]})
    window, commits = seal(closed)            # Window(0, 60000, rows=JsonLines(3 rows)), {"s0": [...], "s1": [...]}
    window.positions                          # {"s0": Position(8..), "s1": Position(4..)}: each shard's highest
    list(window.sources)                      # [("s0", Position(7..)), ("s1", Position(4..)), ("s0", Position(8..))]
    bytes(window.rows.buffer())               # s0's first row, s1's, s0's second: gathered here, on first read

``commits`` (each shard's rows the window commits, slices of the ledger's pieces) is
what the coordinator commits in the ledger once the sink has the window. numpy is imported where it is used (pyarrow only
where ``_gather`` was not built).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

from ..native import load_native
from ..base.positions import Position
from ..rows.batch import RowBatch, concat_lines, nondecreasing
from ..base.direct import BLOCK
from ..base.handoff import JsonLines, Made, Window
from .ordering import WindowRows

# The native gather (setup.py builds it where there is a compiler); None without one, or
# with MLDSERVER_NO_EXTENSIONS set: pyarrow's take serves.
_native = load_native("mldserver.coordinator._gather")
native_gather = _native.gather if _native is not None else None

if TYPE_CHECKING:
    import numpy as np


def seal(closed: WindowRows) -> tuple[Window, dict[str, list[RowBatch]]]:
    """Order a closed window's rows by the merge key: the window a sink gets (its rows
    as JSON lines, each shard's highest position), and each shard's rows it commits. Here only the order is decided (a sort of the event times of runs that are
    each sorted already); the rows' JSON is copied into that order when the sink first
    reads it, off the event loop."""
    import numpy as np

    if closed.sessions is not None:
        return _seal_sessions(closed)
    amends = _amends(closed)
    for shard_id in {*closed.late, *closed.amending}:  # late rows first: older than the window's start
        closed.parts[shard_id] = closed.late.get(shard_id, []) + closed.amending.get(shard_id, []) + \
            closed.parts.get(shard_id, [])
    shards = sorted(closed.parts)  # shard ids in the merge key's order
    parts = [rows for shard_id in shards for rows in closed.parts[shard_id]]
    commits = {shard_id: closed.parts[shard_id] for shard_id in shards}
    n = sum(map(len, parts))
    times = parts[0].times if len(parts) == 1 else np.concatenate([rows.times for rows in parts] or [[]])
    order: np.ndarray | None
    if all(rows.ordered for rows in parts):
        # Each shard's rows are in merge-key order, and laid out by shard id: a stable
        # sort by time alone puts ties in shard id, then position, then row order.
        order = None if nondecreasing(times) else np.argsort(times, kind="stable")
        positions = {shard_id: closed.parts[shard_id][-1].position(-1) for shard_id in shards}
    else:
        order, positions = _merge_out_of_order(closed, shards, parts, times)
    output: dict[str, Position] = {}
    if closed.commits is not None:  # a hopping window commits its oldest pane's rows only
        commits = closed.commits
        positions = {s: max(map(highest, rows)) for s, rows in commits.items() if rows}
    if closed.below is not None:  # rows out of order (max_out_of_orderness): a shard's rows
        # at or below ``below`` are committed, and of those above, what ``output`` says
        output = {s: max(map(highest, rows)) for s, rows in commits.items() if rows}
        positions = closed.below
    owners = [shard_id for shard_id in shards for _ in closed.parts[shard_id]]
    rows = JsonLines(n, partial(_gather, parts, order), partial(_chunks, parts, order), pieces=(parts, order))
    window = Window(closed.start, closed.end, rows, closed.late_rows, positions, RowSources(owners, parts, order),
                    closed.kind, output, version=closed.version, final_until=closed.final_until, amends=amends)
    closed.parts, closed.late, closed.amending = {}, {}, {}
    closed.commits = None
    return window, commits


def _amends(closed: WindowRows) -> list[tuple[str, int]]:
    """The windows the amending rows amend, in order, and how many rows each: in the
    merged order they follow the late rows (older than them all) and are sorted by
    time, so by window."""
    import numpy as np

    parts = [rows for group in closed.amending.values() for rows in group]
    if not parts:
        return []
    size = closed.end - closed.start
    starts, counts = np.unique(np.concatenate([rows.times for rows in parts]) // size * size, return_counts=True)
    return [(f"{start}-{start + size}", int(n)) for start, n in zip(starts.tolist(), counts.tolist())]


def _seal_sessions(closed: WindowRows) -> tuple[Window, dict[str, list[RowBatch]]]:
    """Sessions handed over together: their rows session by session (late ones first,
    then by start), each session's in the merge key's order, every row given its
    session's ``window_start`` and ``window_end``. It commits the panes let go
    (``commits``); ``output`` is each shard's highest row handed over (what a restart
    leaves out of the sessions it makes again: ``sessions.Sessions.resume``)."""
    import numpy as np

    assert closed.sessions is not None and closed.commits is not None
    given = sorted(closed.sessions.parts, key=lambda part: part[0])  # by shard id, a shard's in pane order
    parts = [rows for _, rows, _ in given]
    owners = [shard_id for shard_id, _, _ in given]
    spans = closed.sessions.spans
    order = None
    if parts:
        shard_ids = sorted(set(owners))
        shard_no = np.repeat([shard_ids.index(s) for s in owners], [len(rows) for rows in parts])
        ranks = np.concatenate([(j << 32) | rows.records.astype(np.int64) for j, rows in enumerate(parts)])
        sessions = np.concatenate([r for _, _, r in given])
        order = np.lexsort((ranks, shard_no, np.concatenate([rows.times for rows in parts]), sessions))
        of_row = sessions[order]
    commits = closed.commits
    positions = {s: max(map(highest, rows)) for s, rows in commits.items() if rows}
    output: dict[str, Position] = {}
    for shard_id, rows in zip(owners, parts):
        top = highest(rows)
        if shard_id not in output or top > output[shard_id]:
            output[shard_id] = top
    n = sum(map(len, parts))
    make = partial(_session_lines, parts, order, of_row, spans) if parts else (lambda: (b"", [0]))
    window = Window(closed.start, closed.end, JsonLines(n, make), closed.late_rows, positions,
                    RowSources(owners, parts, order), "session", output)
    closed.sessions, closed.commits = None, None
    return window, commits


def _session_lines(parts: list[RowBatch], order: np.ndarray, of_row: np.ndarray,
                   spans: list[tuple[int, int, bool]]) -> Made:
    """The rows in ``order``, each as its JSON object with its session's
    ``window_start`` and ``window_end`` first."""
    import numpy as np

    body, offsets = _take(parts, order)
    view = memoryview(body).cast("B")
    heads = [b'{"window_start":%d,"window_end":%d' % (start, end) for start, end, _ in spans]
    lines = []
    ends = np.asarray(offsets).tolist()
    for k, session in enumerate(of_row.tolist()):
        row = view[ends[k] + 1 : ends[k + 1]]  # past its "{", its newline included
        lines.append(heads[session] + (b"" if row[:1] == b"}" else b",") + row)
    out = b"".join(lines)
    made = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum([len(line) for line in lines], out=made[1:])
    return out, made


def highest(rows: RowBatch) -> Position:
    """The highest position of a shard's rows."""
    return rows.position(-1) if rows.ordered else rows.positions[int(rows.records.max())]


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
    another when they are in order already; else gathered row by row (``_take``)."""
    if order is None:
        if len(parts) == 1:
            return parts[0].body, parts[0].offsets  # as it is: the offsets say where the rows are
        return concat_lines(parts)
    return _take(parts, order)


TAKE_BLOCK = 1 << 13  # rows gathered at a time (some 3 MB) where a sink writes them out


def _take(parts: list[RowBatch], order: np.ndarray) -> Made:
    """Rows ``order`` (indexes into the parts one after another) into one buffer (what
    ``JsonLines.buffer`` reads): natively in one pass (``_gather``), else a block of
    rows at a time by pyarrow (``_taken_by_arrow``)."""
    import numpy as np

    bodies, part_of, starts, ends = _rows_where(parts)
    first, last = starts[order], ends[order]
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(last - first, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    if native_gather is not None:
        native_gather(out, bodies, part_of[order], first, last)
        return out, offsets
    at = 0
    for chunk in _taken_by_arrow(parts, order):
        out[at : at + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        at += len(chunk)
    return out, offsets


def _chunks(parts: list[RowBatch], order: np.ndarray | None, start: int, stop: int,
            blocks: bool = False) -> Iterator[memoryview]:
    """Rows ``start`` to ``stop`` in merged order as runs of JSON lines (``JsonLines.chunks``):
    where they are in the parts when they are in order already, else gathered a block at
    a time (each block's buffer used again for the next once it is asked for; with
    ``blocks``, for a file written past the page cache, in runs of whole disk blocks
    cut anywhere: ``_taken``)."""
    if order is not None:
        yield from _taken(parts, order[start:stop], blocks)
        return
    first = 0  # the part's first row, in the window
    for rows in parts:
        a, b = max(start - first, 0), min(stop - first, len(rows))
        first += len(rows)
        if a < b:
            yield memoryview(rows.body).cast("B")[int(rows.offsets[a]) : int(rows.offsets[b])]
        if first >= stop:
            return


def _taken(parts: list[RowBatch], order: np.ndarray, blocks: bool = False) -> Iterator[memoryview]:
    """Rows ``order`` (indexes into the parts one after another) as runs of JSON lines,
    ``TAKE_BLOCK`` rows at a time, each copied once from its part (``_gather``), so the
    window is never held twice.

    With ``blocks``, the runs are gathered into a page-aligned buffer and each but the
    last is a whole number of disk blocks (``direct.BLOCK``), cut wherever that falls
    (what is past the last edge is carried to the start of the next): the file sink
    writes them to the disk from where they are (``O_DIRECT``), not copied again into
    its staging buffer."""
    if native_gather is None:
        yield from _taken_by_arrow(parts, order)
        return
    import numpy as np

    bodies, part_of, starts, ends = _rows_where(parts)
    out = _aligned_spares.pop() if blocks and _aligned_spares else np.empty(0, dtype=np.uint8)
    carried = 0  # with blocks: bytes at the start of out, past the last run's last edge
    try:
        for a in range(0, len(order), TAKE_BLOCK):
            rows = order[a : a + TAKE_BLOCK]
            first, last = starts[rows], ends[rows]
            size = carried + int((last - first).sum())
            if len(out) < size:
                out = _aligned(size, out[:carried]) if blocks else np.empty(size, dtype=np.uint8)
            size = carried + native_gather(out[carried:], bodies, part_of[rows], first, last)
            whole = size - size % BLOCK if blocks and a + TAKE_BLOCK < len(order) else size
            if whole:
                yield memoryview(out)[:whole]
            carried = size - whole
            out[:carried] = out[whole:size]  # (less than a block)
    finally:
        if blocks and len(out) <= KEPT_ALIGNED:
            _aligned_spares.append(out)


KEPT_ALIGNED = 16 << 20  # an aligned buffer up to this size is kept for the next window
_aligned_spares: list[np.ndarray] = []  # free for the next window's blocks, their pages faulted in once


def _aligned(size: int, start: np.ndarray) -> np.ndarray:
    """A page-aligned buffer of ``size`` bytes (an anonymous map), beginning with ``start``."""
    import mmap

    import numpy as np

    out = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
    out[: len(start)] = start
    return out


def _rows_where(parts: list[RowBatch]) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
    """Where each row of the parts (one after another) is: its part's body, the part's
    index, and its first and last byte + 1 there (int64, what ``_gather`` reads)."""
    import numpy as np

    part_of = np.repeat(np.arange(len(parts), dtype=np.int64), [len(rows) for rows in parts])
    starts = np.concatenate([np.asarray(rows.offsets[:-1], dtype=np.int64) for rows in parts])
    ends = np.concatenate([np.asarray(rows.offsets[1:], dtype=np.int64) for rows in parts])
    return [rows.body for rows in parts], part_of, starts, ends


def _taken_by_arrow(parts: list[RowBatch], order: np.ndarray) -> Iterator[memoryview]:
    """``_taken`` where ``_gather`` was not built: pyarrow's ``take`` a block of rows at
    a time. A block takes from a narrow range of each part (a part's rows come out in
    its order, or nearly), and pyarrow copies the ranges it takes from first."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    pool = pa.system_memory_pool()  # malloc's: the copies go back to the system once dropped
    firsts = np.cumsum([0] + [len(rows) for rows in parts])  # each part's first row
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
            yield memoryview(data)[int(first) : int(last)]


def _arrow(rows: RowBatch, start: int, stop: int) -> Any:
    """Rows ``start`` to ``stop`` as a pyarrow large_binary array over the batch's buffer."""
    import pyarrow as pa

    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), stop - start,
                                            [None, pa.py_buffer(rows.offsets), pa.py_buffer(rows.body)],
                                            offset=start)
