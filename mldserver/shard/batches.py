"""A batch in and out of the handler, pure: the daemon's records decoded into
:class:`~mldserver.api.records.Record` (KPL aggregates expanded), and what the handler
emitted encoded into the coordinator's items. What cannot be used is returned, with
why, for the driver to dead-letter; nothing here does I/O::

    records, bad = decode_records(event.records, deaggregate_kpl=True, positions=True)
    # a KCL 1.x aggregate at "100" -> Records 100/0, 100/1, 100/2 (positions set);
    # an aggregate whose MD5 fails -> one Record, unchanged;
    # one that breaks half-way -> the records before the break, and
    #   BadRecords([raw], "invalid KPL aggregate", "partition key index 7 out of range")

    rows, bad = encode_rows(batch_rows)     # a RowBatch: times, record indexes, JSON lines
    # a row orjson cannot encode, a record with no valid position, or an event time
    # that is not epoch ms (emit(..., event_time_ms="soon"), an arrival time
    # "yesterday") -> BadRecords([record.to_json()], "bad row", "row not JSON-encodable: ...")
    rows, bad = encoded_rows(batch.records, *frames.decode_rows(n, body))  # the same, from a
    # handler process's columnar body: read in place, each row's JSON as the child wrote it

A batch whose last record is not an object with a sequence number of digits is
malformed whole (its position would be the shard's delivered one): no records, one
``BadRecords`` with all of it. With ``positions`` (a sink is downstream: every row
needs its record's position) every record's position is checked here, at once (each
``Position`` made when read: ``positions.Positions``), and a record without one is
returned as malformed; otherwise a record's position is parsed
when first read (``Record.position``, kept), and a server without a sink never pays
for it.

Records the protocol core left unread (``LazyRecords``: handler processes read them
from the line) stay so: ``decode_records`` checks the last record's position (with
``positions``: every record's, in bulk) and returns a ``LineRecords``, whose
``Record``s are made one at a time when asked for. With ``later`` the bulk reading
waits for the caller (``read_positions``), who runs it while a handler process parses
the same line, and calls the handler only if it found every position::

    records, bad = decode_records(lazy, deaggregate_kpl=False, positions=True, later=True)
    records.positions is None        # not read yet
    records.read_positions()         # True; False: a record has none: decode again,
                                     #   without ``later``, to have it returned as malformed
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Sequence


from ..base.positions import Position, Positions
from ..protocol.lazy import LazyRecords
from ..rows.emitted import EmittedRows
from ..api.records import MAX_EVENT_TIME_MS, Record, row_time, row_times, times_valid
from ..rows.batch import ARRIVAL_TIME, NO_TIME, ODD_TIME, Item, RowBatch
from .kpl import deaggregate, is_aggregate

MALFORMED = "malformed records"
INVALID_AGGREGATE = "invalid KPL aggregate"
BAD_ROW = "bad row"

if TYPE_CHECKING:
    import numpy as np

# A batch whose shard's handler could not be initialized: dead-lettered whole, not called.
INITIALIZE_FAILED = "initialize failed"


class BadRecords(NamedTuple):
    """Records to dead-letter, as the daemon sent them, and why."""

    raws: list[Any]
    reason: str
    error: str


NO_POSITION = "a record is not an object with a sequenceNumber of digits"


def decode_records(
    raws: list[Any], *, deaggregate_kpl: bool, positions: bool = False, later: bool = False
) -> tuple[list[Record], list[BadRecords]]:
    """The handler's records, and what could not be made into records. ``later``:
    the positions of a line read lazily are left to ``LineRecords.read_positions``,
    which the caller runs while a handler process parses the line."""
    if not raws:
        return [], []
    if type(raws) is LazyRecords:
        lazy = None if deaggregate_kpl else _lazy(raws, positions, later)
        if lazy is not None:
            return lazy, []
        raws = raws.records()  # aggregates, or something wrong with a record: read them all, as below
    last = raws[-1]
    position = Position.parse(last.get("sequenceNumber"), last.get("subSequenceNumber")) if type(last) is dict else None
    if position is None:
        return [], [BadRecords(raws, MALFORMED, NO_POSITION)]
    if deaggregate_kpl:
        return _deaggregated(raws)
    if not positions:
        records = list(map(Record, raws))
        records[-1]._position = position
        return records, []
    if set(map(type, raws)) == {dict}:
        parsed = Position.parse_all([r.get("sequenceNumber") for r in raws], [r.get("subSequenceNumber") for r in raws])
    else:
        parsed = [Position.parse(r.get("sequenceNumber"), r.get("subSequenceNumber")) if type(r) is dict else None
                  for r in raws]
    if None not in parsed:
        return list(map(Record, raws, repeat(None), parsed)), []
    records, bad = [], []
    for raw, p in zip(raws, parsed):
        if p is None:
            bad.append(BadRecords([raw], MALFORMED, NO_POSITION))
        else:
            records.append(Record(raw, None, p))
    return records, bad


def _lazy(raws: LazyRecords, positions: bool, later: bool) -> LineRecords | None:
    """The records of a line read lazily, or None if one of them is malformed (with
    ``later``, that is for ``read_positions`` to find)."""
    last = raws.last()
    position = Position.parse(last.get("sequenceNumber"), last.get("subSequenceNumber")) if type(last) is dict else None
    if position is None:
        return None
    records = LineRecords(raws, None, position)
    if not positions or later:
        return records
    return records if records.read_positions() else None


class LineRecords(Sequence[Record]):
    """The records of a processRecords line read lazily (a handler process reads them
    from the line): a :class:`~mldserver.api.records.Record` is made only for the records
    the server asks for (the last one, the records rows came from, a checkpoint's)."""

    __slots__ = ("raws", "positions", "arrivals", "_last")

    def __init__(self, raws: LazyRecords, positions: Sequence[Position] | None, last: Position,
                 arrivals: bytes | None = None) -> None:
        self.raws = raws
        self.positions = positions  # every record's, checked in bulk (a sink is downstream)
        self.arrivals = arrivals  # every record's arrival time, read with the positions (n int64), or None
        self._last = last

    def __len__(self) -> int:
        return len(self.raws)

    def read_positions(self) -> bool:
        """Every record's position and arrival time, read in one native pass over the
        line (some 0.8 ms for 10,000 records of 100 B); False if a record has none (the
        batch is read again, whole, to say which: ``decode_records``)."""
        raws = self.raws
        scanned = raws.sequence_numbers()  # the usual batch
        parsed = Positions.scanned(*scanned[:3]) if scanned is not None else None
        if parsed is None:
            # A record that is not an object has None in every column: no position.
            parsed = Position.batch(*raws.columns("sequenceNumber", "subSequenceNumber"))
        raws.release()
        if None in parsed:
            return False
        self.positions, self.arrivals = parsed, scanned[3] if scanned is not None else None
        return True

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.raws)))]
        n = len(self.raws)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("record index out of range")
        if i == n - 1:  # the one the server always reads: kept from the first reading
            return Record(self.raws.last(), None, self._last)
        return Record(self.raws.obj(i), None, self.positions[i] if self.positions is not None else None)


def _deaggregated(raws: list[Any]) -> tuple[list[Record], list[BadRecords]]:
    out: list[Record] = []
    bad: list[BadRecords] = []
    for raw in raws:
        record = Record(raw)
        if type(raw) is not dict or not is_aggregate(record.data):
            out.append(record)
            continue
        base = Position.parse(raw.get("sequenceNumber"), None)
        if base is None:
            bad.append(BadRecords([raw], MALFORMED, "an aggregate without a sequenceNumber of digits"))
            continue
        users = deaggregate(record.data, raw.get("partitionKey"), raw.get("explicitHashKey"))
        if users.error:
            bad.append(BadRecords([raw], INVALID_AGGREGATE, users.error))
        for user in users.records:
            if not users.aggregated:
                out.append(record)
                continue
            fields = dict(raw, partitionKey=user.partition_key, subSequenceNumber=user.sub_sequence_number)
            fields["data"] = None
            if user.explicit_hash_key is not None:
                fields["explicitHashKey"] = user.explicit_hash_key
            out.append(Record(fields, user.data, Position(base.seq, user.sub_sequence_number, base.text)))
    return out, bad


class EncodedRows(NamedTuple):
    """What a batch emitted, already columns (a handler process encoded the rows)."""

    rows: RowBatch
    bad: list[BadRecords]


def encode_rows(emitted: EmittedRows | EncodedRows | Iterable[tuple[Any, Any, Any]] | None
                ) -> tuple[RowBatch, list[BadRecords]]:
    """The coordinator's columns for what a batch emitted (JSON lines already:
    ``rows.emitted``; or ``(record, row, event_time_ms)`` tuples), in order, and the
    rows that cannot be rows there (their records, to dead-letter): a row orjson could
    not encode, a record with no position, or an event time (``emit``'s, else the
    record's arrival time) that is neither None nor epoch milliseconds
    (``records.valid_event_time``)."""
    if isinstance(emitted, EncodedRows):
        return emitted.rows, emitted.bad
    if emitted is None:  # every batch of a server without a sink
        return RowBatch.empty(), []
    if not isinstance(emitted, EmittedRows):
        emitted = EmittedRows.of(emitted)
    bad = [BadRecords([record.to_json()], BAD_ROW, error) for record, error in emitted.bad]
    if not len(emitted):
        return RowBatch.empty(), bad
    times = event_times(row_times(emitted.records, emitted.times))
    if times is not None:
        import numpy as np

        offsets = np.zeros(len(emitted) + 1, dtype=np.int64)
        offsets[1:] = np.frombuffer(emitted.ends(), dtype=np.uint64)
        rows = rows_from_columns(emitted.records, None, times, offsets, emitted.lines())
        if rows is not None:
            rows.timed = bool(emitted.timed)
            return rows, bad
    items = []
    for line, record, t in emitted.each():
        line = line[:-1]  # (no newline)
        t, error = row_time(record, t)
        if error is not None:
            bad.append(BadRecords([record.to_json()], BAD_ROW, error))
            continue
        try:
            items.append(Item(t, record.position, line))
        except ValueError as exc:  # a record with no position
            bad.append(BadRecords([record.to_json()], BAD_ROW, str(exc)))
    rows = RowBatch.of(items)
    rows.timed = bool(emitted.timed)
    return rows, bad


def encoded_rows(records: Sequence[Record], index: Any, times: Any, ends: Any, lines: Any
                 ) -> tuple[RowBatch, list[BadRecords]]:
    """The coordinator's columns for the rows a handler process encoded (``pool.frames``:
    each row's record index, event time, and end in ``lines``, its JSON lines), read in
    place. The handler process gave each row ``emit``'s time, checked there, or
    ``ARRIVAL_TIME``: its record's arrival time, filled in here from the batch's
    reading (``arrival_times``; ``NO_TIME`` where the record has none). Rows whose
    record has no position, or whose arrival time is not an event time, are returned
    as bad rows, as ``encode_rows`` does."""
    import numpy as np

    n = len(times)
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.frombuffer(ends, dtype=np.uint64, count=n)
    # The columns are copied (12 bytes a row): only the JSON lines stay where the body
    # lies, which may be the rows arena, on loan until their window commits (``rows/loans.py``).
    index = np.frombuffer(index, dtype=np.uint32, count=n).copy()
    times = np.frombuffer(times, dtype=np.int64, count=n).copy()
    arrival = times == ARRIVAL_TIME
    fine = True
    if arrival.any():
        filled = arrival_times(records)[index[arrival]]
        times[arrival] = filled
        fine = not ((filled == ODD_TIME) | (filled >= MAX_EVENT_TIME_MS)).any()
    timed = not arrival.all()  # some row's time is emit's, from the data
    rows = rows_from_columns(records, index, times, offsets, lines) if fine else None
    if rows is not None:
        rows.timed = timed
        return rows, []
    items, bad = [], []
    for i, t, at, start, end in zip(index.tolist(), times.tolist(), arrival.tolist(), offsets.tolist(),
                                    offsets[1:].tolist()):
        r = records[i]
        if at and not (t == NO_TIME or 0 <= t < MAX_EVENT_TIME_MS):
            t, error = row_time(r, None)  # read again, to say what is wrong
            if error is not None:
                bad.append(BadRecords([r.to_json()], BAD_ROW, error))
                continue
        try:
            items.append(Item(None if t == NO_TIME else t, r.position, bytes(lines[start : end - 1])))
        except ValueError as exc:
            bad.append(BadRecords([r.to_json()], BAD_ROW, str(exc)))
    rows = RowBatch.of(items)
    rows.timed = timed
    return rows, bad


def arrival_times(records: Sequence[Record]) -> np.ndarray:
    """Every record's ``approximateArrivalTimestamp`` as int64: ``NO_TIME`` where it has
    none, ``ODD_TIME`` where it is not an int below 10**18 (as the scan reads it; one
    out of range is kept: the caller checks the range). Read with the positions, in the
    same native pass, for a line read lazily (``LineRecords.arrivals``); else record by
    record."""
    import numpy as np

    if type(records) is LineRecords and records.arrivals is not None:
        return np.frombuffer(records.arrivals, dtype=np.int64)
    values = (records.raws.column("approximateArrivalTimestamp") if type(records) is LineRecords
              else [r.approximate_arrival_timestamp for r in records])
    return np.array([NO_TIME if t is None else t if type(t) is int and 0 <= t < 10**18 else ODD_TIME
                     for t in values], dtype=np.int64)


def rows_from_columns(records: Sequence[Record], index: np.ndarray | None, times: np.ndarray,
                      offsets: np.ndarray, lines: Any) -> RowBatch | None:
    """A batch's rows as the coordinator keeps them: ``index`` maps each row to its
    record in ``records`` (None: row ``i`` came from ``records[i]``), whose position it
    takes; ``times`` are the rows' (``records.row_times``: ``NO_TIME`` where neither
    ``emit`` nor the record gave one). None when some record has no position: the
    caller finds which, row by row."""
    positions = _positions(records)
    if positions is None:
        return None
    if index is None:
        return RowBatch.each(times, positions, lines, offsets)
    return RowBatch(times, index, positions, lines, offsets)


# The batch's records' positions, one per record. A batch read lazily (``LineRecords``)
# gives them in bulk, without a Record each; the coordinator reads only a few of them
# (a window's last row, the ledger's head, a binary search for duplicates): each is
# made when read (``Positions``).

def _positions(records: Sequence[Record]) -> Sequence[Position] | None:
    """None when some record has none."""
    if type(records) is LineRecords and records.positions is not None:
        return records.positions  # parsed in bulk, all valid (``decode_records``)
    try:
        # ``_position``: the decoder's, read without a call (``position`` parses it if unset)
        return [r._position or r.position for r in records]
    except ValueError:  # a record whose sequence number is not digits (no sink parsed them)
        return None


def event_times(values: list[Any]) -> np.ndarray | None:
    """The times as int64 (``NO_TIME`` for None), or None if one is neither None nor
    a valid event time (``records.times_valid``)."""
    import numpy as np

    if set(map(type, values)) == {int}:  # the usual batch: converted at once, checked in numpy
        try:
            times = np.array(values, dtype=np.int64)
        except OverflowError:
            return None
        return times if times.min() >= 0 and times.max() < MAX_EVENT_TIME_MS else None
    if not times_valid(values):
        return None
    return np.array([NO_TIME if t is None else t for t in values], dtype=np.int64)
