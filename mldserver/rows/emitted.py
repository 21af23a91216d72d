"""What a batch's handler emitted (``Batch.emit``), kept as it is emitted: each row
written at once as a JSON line into one buffer, its record and its event time beside
it. No row object outlives its ``emit``: kept by the ten thousand until the call ends,
the rows' dicts would cost a handler process more than encoding them does (the
measurement is in docs/performance.md).

A row is what it was at its ``emit``: a dict changed afterwards does not change it.
A row orjson cannot encode is set aside with its record and why, for the caller to
dead-letter; event times are kept as given (None: the record's arrival time stands in,
read where the rows are encoded, or in a handler process by the server, with the
positions) and checked there too::

    rows = EmittedRows()
    rows.add(record, {"k": 1}, None)
    rows.add(record, {"k": 2}, 1763719200000)
    rows.add(record, {"k": object()}, None)      # not JSON: set aside
    len(rows) == 2; rows.bad == [(record, "row not JSON-encodable: Type is not JSON serializable: object")]
    rows.sizes == [8, 8]; rows.lines() == b'{"k":1}\\n{"k":2}\\n'   # rows.view(): the same, in place
    rows.records == [record, record]; rows.times == [None, 1763719200000]
    rows.one_for_one([record])                   # False: a row for each record, in order? (a passthrough's)
    rows[1] == Emitted(record, {"k": 2}, 1763719200000)   # read back (tests)
    mark = len(rows); ...; rows.truncate(mark)   # a failed attempt's rows taken back
    rows.close()                                 # the call is over: a later add raises
    rows.drop({id(record)})                      # the rows of records given up (batch.fail)
    for line, record, t in rows.each(): ...      # b'{"k":1}\\n', record, None; ...
"""

from __future__ import annotations

import io
from array import array
from operator import is_
from typing import Any, Iterator, NamedTuple

import orjson

from ..native import load_native

Record = Any  # (``records.Record``, which imports this module: named, not imported)

_dumps, _OPT = orjson.dumps, orjson.OPT_APPEND_NEWLINE


def _emitted_after_the_call(line: bytes) -> int:
    raise RuntimeError("batch.emit called after process_records returned: the row is not kept; "
                       "emit inside the call (await the tasks that emit before returning)")


class Emitted(NamedTuple):
    """One ``batch.emit``: the record a row is attributed to, the row, its event time."""

    record: Record
    row: dict[str, Any]
    event_time_ms: int | None


class PyCollector:
    """The native ``Collector``'s steps in Python (installed without a C compiler)."""

    __slots__ = ("_buffer", "_write", "_ends", "records", "times", "bad", "timed")

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._write = self._buffer.write
        self._ends: list[int] = []  # where each row's JSON line ends, its newline included
        self.records: list[Record] = []  # each row's record
        self.times: list[Any] = []  # each row's event time as given (None: none given)
        self.bad: list[tuple[Record, str]] = []  # rows orjson could not encode: their record, why
        self.timed = 0  # rows given an event time

    def add(self, record: Record, row: Any, event_time_ms: Any = None) -> None:
        try:
            line = _dumps(row, None, _OPT)
        except TypeError as exc:  # (orjson.JSONEncodeError)
            self.bad.append((record, f"row not JSON-encodable: {exc}"))
            return
        self._write(line)  # (raises once closed)
        self._keep(record, event_time_ms)

    def append_line(self, record: Record, line: bytes, event_time_ms: Any) -> None:
        self._buffer.write(line)  # (closed or not: ``drop`` keeps what was emitted)
        self._keep(record, event_time_ms)

    def _keep(self, record: Record, event_time_ms: Any) -> None:
        """The line just written: where it ends, its record and time."""
        self._ends.append(self._buffer.tell())
        self.records.append(record)
        self.times.append(event_time_ms)
        if event_time_ms is not None:
            self.timed += 1

    def truncate(self, n: int) -> None:
        if n < len(self._ends):
            end = self._ends[n - 1] if n > 0 else 0
            self._buffer.truncate(end)  # (BufferError while a view is held: nothing changed)
            self._buffer.seek(end)
            del self._ends[n:], self.records[n:], self.times[n:]
            self.timed = len(self.times) - self.times.count(None)

    def one_for_one(self, records: Any) -> bool:
        return len(self.records) == len(records) and all(map(is_, self.records, records))

    def close(self) -> None:
        self._write = _emitted_after_the_call

    def lines(self) -> bytes:
        return self._buffer.getvalue()

    def view(self) -> memoryview:
        return self._buffer.getbuffer()

    def ends(self) -> bytes:
        return array(_U64, self._ends).tobytes()

    def __len__(self) -> int:
        return len(self._ends)


# The native collector (setup.py builds it); PyCollector without a C compiler, or with
# MLDSERVER_NO_EXTENSIONS set.
_native = load_native("mldserver.rows._emitted")
Collector = _native.Collector if _native is not None else PyCollector

_U64 = "Q"


class EmittedRows(Collector):  # type: ignore[misc,valid-type]
    """What a batch's handler emitted: ``add`` is ``batch.emit`` (the collector's own);
    the rest reads the rows back, or takes some out."""

    __slots__ = ()

    @classmethod
    def of(cls, emitted: Any) -> EmittedRows:
        """Rows given as ``Emitted`` (or ``(record, row, event_time_ms)``) tuples (tests)."""
        rows = cls()
        for record, row, t in emitted:
            rows.add(record, row, t)
        return rows

    @property
    def sizes(self) -> list[int]:
        """Each row's JSON line's size, its newline included."""
        ends = self._offsets()
        return [end - start for start, end in zip([0, *ends], ends)]

    def _offsets(self) -> list[int]:
        """Where each row's line ends in ``lines()``."""
        return memoryview(self.ends()).cast(_U64).tolist()

    def drop(self, gone: set[int]) -> None:
        """The rows of these records (``id``) taken out, the others kept in order."""
        if not any(id(r) in gone for r in self.records):
            return
        kept = [(line, record, t) for line, record, t in self.each() if id(record) not in gone]
        self.truncate(0)
        for line, record, t in kept:
            self.append_line(record, line, t)

    def each(self) -> Iterator[tuple[bytes, Record, Any]]:
        """Each row as it is kept: its JSON line (its newline included), its record,
        its event time as given."""
        lines, start = self.lines(), 0
        for end, record, t in zip(self._offsets(), self.records, self.times):
            yield lines[start:end], record, t
            start = end

    def __getitem__(self, i: int) -> Emitted:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row index out of range")
        ends = self._offsets()
        with self.view() as lines:  # (read in place: the view is let go at once)
            row = orjson.loads(lines[ends[i - 1] if i else 0 : ends[i]])
        return Emitted(self.records[i], row, self.times[i])

    def __iter__(self) -> Iterator[Emitted]:
        return (Emitted(record, orjson.loads(line), t) for line, record, t in self.each())
