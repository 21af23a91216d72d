"""What a batch's handler emitted (``Batch.emit``), kept as it is emitted: each row
written at once as a JSON line into one buffer, its record and its event time beside
it. No row object outlives its ``emit``: kept by the ten thousand until the call ends,
the rows' dicts cost a handler process more than encoding them (a passthrough handler
over 10,000 records of 100 B: 16.3 ms a batch with the dicts kept and encoded at the
end, 12.1 ms written as they come, against 7.4 ms emitting nothing).

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
    rows[1] == Emitted(record, {"k": 2}, 1763719200000)   # read back (tests)
    mark = len(rows); ...; rows.truncate(mark)   # a failed attempt's rows taken back
    rows.close()                                 # the call is over: a later add raises
    rows.drop({id(record)})                      # the rows of records given up (batch.fail)
    for line, record, t in rows.each(): ...      # b'{"k":1}\\n', record, None; ...
"""

from __future__ import annotations

import io
from typing import Any, Iterator, NamedTuple

import orjson

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


class EmittedRows:
    __slots__ = ("_buffer", "_write", "sizes", "records", "times", "bad")

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._write = self._buffer.write
        self.sizes: list[int] = []  # each row's JSON line, its newline included
        self.records: list[Record] = []  # each row's record
        self.times: list[Any] = []  # each row's event time as given (None: none given)
        self.bad: list[tuple[Record, str]] = []  # rows orjson could not encode: their record, why

    @classmethod
    def of(cls, emitted: Any) -> EmittedRows:
        """Rows given as ``Emitted`` (or ``(record, row, event_time_ms)``) tuples (tests)."""
        rows = cls()
        for record, row, t in emitted:
            rows.add(record, row, t)
        return rows

    def add(self, record: Record, row: Any, event_time_ms: Any = None) -> None:
        try:
            line = _dumps(row, None, _OPT)
        except TypeError as exc:  # (orjson.JSONEncodeError)
            self.bad.append((record, f"row not JSON-encodable: {exc}"))
            return
        self.sizes.append(self._write(line))
        self.records.append(record)
        self.times.append(event_time_ms)

    def __len__(self) -> int:
        return len(self.sizes)

    def lines(self) -> bytes:
        """The rows' JSON lines, back to back."""
        return self._buffer.getvalue()

    def close(self) -> None:
        """The call is over: a row emitted now (a task the handler left running, with
        ``batch.emit`` kept from the call) raises, saying so, instead of going nowhere."""
        self._write = _emitted_after_the_call

    def view(self) -> memoryview:
        """The rows' JSON lines where they were written, not copied (to send them):
        no row may be added or taken back while it is held."""
        return self._buffer.getbuffer()

    def truncate(self, n: int) -> None:
        """Only the first ``n`` rows stay (a failed attempt's rows taken back)."""
        if n < len(self.sizes):
            self._buffer.seek(sum(self.sizes[:n]))
            self._buffer.truncate()
            del self.sizes[n:], self.records[n:], self.times[n:]

    def drop(self, gone: set[int]) -> None:
        """The rows of these records (``id``) taken out, the others kept in order."""
        if not any(id(r) in gone for r in self.records):
            return
        kept = [(line, record, t) for line, record, t in self.each() if id(record) not in gone]
        self._buffer = io.BytesIO()
        self._write = self._buffer.write
        self.sizes, self.records, self.times = [], [], []
        for line, record, t in kept:
            self.sizes.append(self._write(line))
            self.records.append(record)
            self.times.append(t)

    def each(self) -> Iterator[tuple[bytes, Record, Any]]:
        """Each row as it is kept: its JSON line (its newline included), its record,
        its event time as given."""
        lines, start = self.lines(), 0
        for size, record, t in zip(self.sizes, self.records, self.times):
            yield lines[start : start + size], record, t
            start += size

    def __getitem__(self, i: int) -> Emitted:
        n = len(self.sizes)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row index out of range")
        start = sum(self.sizes[:i])
        line = self._buffer.getbuffer()[start : start + self.sizes[i]]
        try:
            row = orjson.loads(line)
        finally:
            line.release()
        return Emitted(self.records[i], row, self.times[i])

    def __iter__(self) -> Iterator[Emitted]:
        return map(self.__getitem__, range(len(self.sizes)))
