"""A window's Arrow table made as its rows arrive, not when it closes.

Turning a window's JSON rows into Arrow (``schema.rows_to_table``) is the largest part
of a sink's work between a window's close and its commit that is not Spark's (some
200 ms a 100,000-row window on 2 cores). With a schema known (declared, or inferred
from the first window), each batch's rows are parsed when the coordinator keeps them
(``arrived``: one parse at a time, in a thread of its own, beside the loop), and at
commit the window's table is those tables cut and put in merged order (``table``:
slices and one ``take``, no parse)::

    ahead = TablesAhead.of(settings)          # a quarter of max_buffered_bytes (none for sessions)
    ahead.arrived(pieces, schema)             # on the loop, as a batch's rows are kept
    table, rejected = ahead.rows_to_table(window.rows, schema)   # in the sink's thread
    ahead.committed(window)                   # its tables let go

(``table(rows, schema)``: the table made ahead alone, or None.)

``table`` gives None, and the window's rows are parsed at commit the usual way (whole,
small runs gathered first), wherever a part of it was not made ahead: lines not cut from
batches (``JsonLines.pieces`` is None: a hand-made window), a batch spilled to a file,
arrived before the schema was known or past the budget, a parse that failed (a row that
does not fit the schema: the usual parse finds it and dead-letters it). Sessions' rows
are never made ahead (each row gains its session's bounds): the sinks do not ask.

The tables ahead are held beside the rows' JSON, so they are bounded: past ``budget``
bytes of rows, a batch is not parsed ahead. A table is let go once its rows are in no
window to come: all before the next window's start (the window's end; a hopping
window's start plus its ``slide``, so a pane's rows are parsed once for all the windows
that hold it). Those of a window that committed go at once; those of rows no window
took (rows dropped with a lost lease, late rows dropped by ``late_policy``) once a
further window has committed since they arrived (late rows that arrive while a window
commits go with the next one).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from .schema import parse, rows_to_table


@dataclass(slots=True)
class _Ahead:
    # id() of the piece's body: a part of it shares that body. An id is reused only once
    # its object is gone; a body made from a live piece (``RowBatch.take``) never has its id.
    body: int
    offsets: Any  # the piece's offsets, a copy (a part's are a slice of them)
    last_time: int  # its latest row's event time (ms)
    nbytes: int
    schema: pa.Schema
    since: int  # the windows committed when it arrived
    table: concurrent.futures.Future[pa.Table | None]


class TablesAhead:
    def __init__(self, budget: int, slide: int | None = None) -> None:
        self.budget = budget
        self.slide = slide  # ms between two windows' starts (hopping windows); None: tumbling
        self.held = 0  # bytes of JSON rows parsed or being parsed ahead
        self._tables: dict[int, _Ahead] = {}  # by the piece's tag
        self._parser: concurrent.futures.ThreadPoolExecutor | None = None
        self.made = 0  # windows whose table ``table`` made (not left to the usual parse)
        self.commits = 0

    @classmethod
    def of(cls, settings: Any) -> TablesAhead:
        """A sink's (``base.config.Settings``): a quarter of the rows' cap, some two
        windows' worth at the defaults; nothing for sessions, whose rows each gain their
        session's bounds at the close."""
        return cls(settings.max_buffered_bytes // 4 if settings.session_gap is None else 0,
                   round(settings.slide * 1000) if settings.slide is not None else None)

    def rows_to_table(self, rows: Any, schema: pa.Schema | None) -> tuple[pa.Table, list[tuple[int, str]]]:
        """``schema.rows_to_table``'s answer, from the tables made ahead where they are all
        there (nothing rejected), else by parsing the rows."""
        table = self.table(rows, schema) if schema is not None else None
        return (table, []) if table is not None else rows_to_table(rows, schema)

    def arrived(self, pieces: Sequence[Any], schema: pa.Schema | None) -> None:
        """Rows the coordinator keeps (``rows.RowBatch`` pieces, tagged): parsed with
        ``schema`` in the parser's thread, within the budget. Never raises."""
        if schema is None:
            return
        import numpy as np

        for piece in pieces:
            nbytes = piece.nbytes()
            if not piece.tag or piece.tag in self._tables or not nbytes or piece.on_disk():
                continue  # (spilled: read back at commit, not now)
            if self.held + nbytes > self.budget:
                return
            if self._parser is None:
                self._parser = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mldserver-rows-ahead")
            try:
                parsed = self._parser.submit(_parse_or_none, piece, schema)
            except RuntimeError:  # the interpreter is shutting down
                return
            self.held += nbytes
            # (its offsets copied: a batch from a handler process has them in the frame it
            # read, whose shared memory they would keep from being given back)
            offsets = np.array(piece.offsets, dtype=np.int64)
            self._tables[piece.tag] = _Ahead(id(piece.body), offsets, int(np.max(piece.times)), nbytes, schema,
                                             self.commits, parsed)

    def table(self, rows: Any, schema: pa.Schema) -> pa.Table | None:
        """The window's rows (``handoff.JsonLines``) as a table with ``schema``, in their
        order, from the tables made ahead; None: parse the rows as usual. Blocks on a
        parse still under way: call it off the loop."""
        if rows.pieces is None:
            return None
        parts, order = rows.pieces
        tables = []
        for part in parts:
            if not len(part):
                continue
            table = self._part(part, schema)
            if table is None:
                return None
            tables.append(table)
        if not tables:
            return None
        table = pa.concat_tables(tables)
        self.made += 1
        if order is None:
            return table
        import numpy as np

        # (an Arrow array over the order's memory: ``take`` of a numpy array imports pandas)
        order = np.ascontiguousarray(order, dtype=np.int64)
        return table.take(pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)]))

    def committed(self, window: Any) -> None:
        """``window`` (``handoff.Window``) committed: the tables of its rows in no window to
        come go (a hopping window's: its oldest pane's), and those of rows all before its
        start that no window took, one commit after they arrived."""
        self.commits += 1
        used = {part.tag for part in window.rows.pieces[0]} if window.rows.pieces is not None else set()
        following = window.start + self.slide if self.slide is not None else window.end  # the next window's start
        for tag in [tag for tag, ahead in self._tables.items()
                    if (tag in used and ahead.last_time < following)
                    or (ahead.last_time < window.start and ahead.since < self.commits - 1)]:
            ahead = self._tables.pop(tag)
            ahead.table.cancel()
            self.held -= ahead.nbytes

    def _part(self, part: Any, schema: pa.Schema) -> pa.Table | None:
        """The part's rows as a slice of its piece's table made ahead, or None."""
        import numpy as np

        ahead = self._tables.get(part.tag)
        if ahead is None or ahead.body != id(part.body) or not ahead.schema.equals(schema):
            return None
        try:
            made = ahead.table.result()
        except BaseException:  # let go meanwhile (``committed``), or a parse that failed: the usual parse
            return None
        first = int(np.searchsorted(ahead.offsets, part.offsets[0]))
        last = first + len(part)
        if made is None or last >= len(ahead.offsets) or ahead.offsets[first] != part.offsets[0] \
                or ahead.offsets[last] != part.offsets[-1]:
            return None
        return made.slice(first, len(part))


def _parse_or_none(rows: Any, schema: pa.Schema) -> pa.Table | None:
    """A batch's rows (one run of lines in its body) as a table, or None if one does not fit."""
    lines = memoryview(rows.body).cast("B")[int(rows.offsets[0]) : int(rows.offsets[-1])]
    try:
        return parse(lines, schema)
    except pa.ArrowInvalid:
        return None
