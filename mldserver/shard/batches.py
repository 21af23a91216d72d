"""A batch in and out of the handler, pure: the daemon's records decoded into
:class:`~mldserver.records.Record` (KPL aggregates expanded), and what the handler
emitted encoded into the coordinator's items. What cannot be used is returned, with
why, for the driver to dead-letter; nothing here does I/O::

    records, bad = decode_records(event.records, deaggregate_kpl=True, positions=True)
    # a KCL 1.x aggregate at "100" -> Records 100/0, 100/1, 100/2 (positions set);
    # an aggregate whose MD5 fails -> one Record, unchanged;
    # one that breaks half-way -> the records before the break, and
    #   BadRecords([raw], "invalid KPL aggregate", "partition key index 7 out of range")

    items, bad = encode_rows(batch_rows)    # [Item(time, position, b'{"k":1}'), ...]
    # a row orjson cannot encode, a record with no valid position, or an event time
    # that is not epoch ms (emit(..., event_time_ms="soon"), an arrival time
    # "yesterday") -> BadRecords([record.to_json()], "bad row", "row not JSON-encodable: ...")

A batch whose last record is not an object with a sequence number of digits is
malformed whole (its position would be the shard's delivered one): no records, one
``BadRecords`` with all of it. With ``positions`` (a sink is downstream: every row
needs its record's position) every record's position is parsed here, at once, and a
record without one is returned as malformed; otherwise a record's position is parsed
when first read (``Record.position``, kept), and a server without a sink never pays
for it.

Records the protocol core left unread (``LazyRecords``: handler processes read them
from the line) stay so: ``decode_records`` checks the last record's position (with
``positions``: every record's, in bulk) and returns a ``LineRecords``, whose
``Record``s are made one at a time when asked for.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any, Iterable, NamedTuple, Sequence

import orjson

from ..coordinator.ordering import Item
from ..positions import Position
from ..protocol.lazy import LazyRecords
from ..records import EVENT_TIME, MAX_EVENT_TIME_MS, Emitted, Record, valid_event_time
from .kpl import deaggregate, is_aggregate

MALFORMED = "malformed records"
INVALID_AGGREGATE = "invalid KPL aggregate"
BAD_ROW = "bad row"

_new = tuple.__new__
_item_time = itemgetter(Item._fields.index("time"))


class BadRecords(NamedTuple):
    """Records to dead-letter, as the daemon sent them, and why."""

    raws: list[Any]
    reason: str
    error: str


def encode(row: Any) -> bytes:
    # A right-sized copy: orjson's own result sits in an over-allocated, shrunk malloc
    # block; kept by the thousand until their window commits, those fragment the heap
    # (5x slower, several times the memory).
    return bytes(memoryview(orjson.dumps(row)))


NO_POSITION = "a record is not an object with a sequenceNumber of digits"


def decode_records(
    raws: list[Any], *, deaggregate_kpl: bool, positions: bool = False
) -> tuple[list[Record], list[BadRecords]]:
    """The handler's records, and what could not be made into records."""
    if not raws:
        return [], []
    if type(raws) is LazyRecords and not deaggregate_kpl:
        lazy = _lazy(raws, positions)
        if lazy is not None:
            return lazy, []
        raws = raws.records()  # something is wrong with a record: read them all, as below
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


def _lazy(raws: LazyRecords, positions: bool) -> LineRecords | None:
    """The records of a line read lazily, or None if one of them is malformed."""
    last = raws.last()
    position = Position.parse(last.get("sequenceNumber"), last.get("subSequenceNumber")) if type(last) is dict else None
    if position is None:
        return None
    if not positions:
        return LineRecords(raws, None, position)
    # A record that is not an object has None in both columns: no position, as below.
    parsed = Position.parse_all(raws.column("sequenceNumber"), raws.column("subSequenceNumber"))
    if None in parsed:
        return None
    return LineRecords(raws, parsed, position)


class LineRecords(Sequence[Record]):
    """The records of a processRecords line read lazily (a handler process reads them
    from the line): a :class:`~mldserver.records.Record` is made only for the records
    the server asks for (the last one, the records rows came from, a checkpoint's)."""

    __slots__ = ("raws", "positions", "_last")

    def __init__(self, raws: LazyRecords, positions: list[Position] | None, last: Position) -> None:
        self.raws = raws
        self.positions = positions
        self._last = last

    def __len__(self) -> int:
        return len(self.raws)

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
    """What a batch emitted, already items (a handler process encoded the rows)."""

    items: list[Item]
    bad: list[BadRecords]


def encode_rows(emitted: Iterable[Emitted] | EncodedRows) -> tuple[list[Item], list[BadRecords]]:
    """The coordinator's items for what a batch emitted, in order, and the rows that
    cannot be items (their records, to dead-letter): a row orjson cannot encode, a
    record with no position, or an event time (``emit``'s, else the record's arrival
    time) that is neither None nor epoch milliseconds (``records.valid_event_time``)."""
    if isinstance(emitted, EncodedRows):
        return emitted.items, emitted.bad
    emitted = list(emitted)
    try:
        # ``_position``: the decoder's, read without a call (``position`` parses it if unset)
        items = [
            _new(Item, (record.approximate_arrival_timestamp if t is None else t,
                        record._position or record.position, encode(row)))
            for record, row, t in emitted
        ]
        if times_valid(list(map(_item_time, items))):
            return items, []
    except (TypeError, ValueError):  # some row is not JSON, or its record has no position
        pass
    items, bad = [], []
    for record, row, t in emitted:
        source = "the record's approximateArrivalTimestamp" if t is None else "batch.emit(event_time_ms=...)"
        if t is None:
            t = record.approximate_arrival_timestamp
        if t is not None and not valid_event_time(t):
            error = f"event time {t!r:.80} from {source} is not {EVENT_TIME}"
            bad.append(BadRecords([record.to_json()], BAD_ROW, error))
            continue
        try:
            items.append(Item(t, record.position, encode(row)))
        except TypeError as exc:
            bad.append(BadRecords([record.to_json()], BAD_ROW, f"row not JSON-encodable: {exc}"))
        except ValueError as exc:
            bad.append(BadRecords([record.to_json()], BAD_ROW, str(exc)))
    return items, bad


def times_valid(times: list[Any]) -> bool:
    """Every time None or a valid event time: the check of the usual batch, in C."""
    kinds = set(map(type, times))
    if kinds == {int}:
        ints = times
    elif kinds <= {int, type(None)}:
        ints = [t for t in times if t is not None]
    else:
        return False
    return not ints or (min(ints) >= 0 and max(ints) < MAX_EVENT_TIME_MS)
