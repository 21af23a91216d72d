"""A change handler on plain batches: one callback per record, in order, DynamoDB
changes told from Kinesis records by their shape, exact values, one record retried
alone and then given up while the batch goes on, rows, checkpoints and statistics."""

from __future__ import annotations

import base64
import json
from decimal import Decimal

import pytest

import mldserver
from mldserver.api.changes import parse_change
from mldserver.base.config import Settings
from mldserver.api.context import Context
from mldserver.api.failures import FailureGuard
from mldserver.api.records import Batch, EmittedRows, Record, ShardInfo
from mldserver.api.testing import dynamodb_record

SHARD = ShardInfo("shardId-00000001795347969710-dbd68f62", "TRIM_HORIZON", 0)
T = 1795347960000


def change(seq, name, keys, new=None, old=None, view="NEW_AND_OLD_IMAGES", created=T, **extra):
    stream = {"ApproximateCreationDateTime": created, "Keys": keys, "SequenceNumber": f"{seq:021d}",
              "SizeBytes": 59, "StreamViewType": view}
    if new is not None:
        stream["NewImage"] = new
    if old is not None:
        stream["OldImage"] = old
    return {"awsRegion": "us-east-1", "dynamodb": stream, "eventID": f"ev-{seq}", "eventName": name,
            "eventSource": "aws:dynamodb", "eventVersion": "1.1", **extra}


def kinesis(seq, data: bytes, pk="pk"):
    return {"action": "record", "data": base64.b64encode(data).decode(), "partitionKey": pk,
            "sequenceNumber": str(seq), "subSequenceNumber": 0, "approximateArrivalTimestamp": 1476889707000}


def batch_of(raws, rows=True):
    return Batch([Record(r) for r in raws], 0, SHARD, EmittedRows() if rows else None)


def context(**settings):
    return Context(Settings(**{"handler_backoff": 0.0, "handler_retries": 2, **settings}))


class Seen(mldserver.ChangeHandler):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.seen = []

    async def on_update(self, doc, meta):
        self.seen.append(("update", doc, meta))

    async def on_delete(self, meta):
        self.seen.append(("delete", meta))


KEY = {"pk": {"S": "a"}}
BIG = "12345678901234567890123456789012345678"


async def test_dynamodb_changes_call_on_update_and_on_delete_in_order_with_exact_values():
    new = {"pk": {"S": "a"}, "n": {"N": BIG}, "d": {"N": "-0.000000000000000000000000000000000000001"},
           "ss": {"SS": ["x", "y"]}, "b": {"B": "AHJhdw=="}, "m": {"M": {"l": {"L": [{"N": "1"}, {"NULL": True}]}}}}
    modified = dict(new, n={"N": "9.99E+10"})
    raws = [dynamodb_record(change(1, "INSERT", KEY, new)),
            dynamodb_record(change(2, "MODIFY", KEY, modified, new)),
            dynamodb_record(change(3, "REMOVE", KEY, old=modified))]
    handler = Seen(context())
    batch = batch_of(raws)
    await handler.process_records(batch, FailureGuard(Checkpoints(), batch))
    (k1, doc1, m1), (k2, doc2, m2), (k3, m3) = handler.seen
    assert (k1, k2, k3) == ("update", "update", "delete")
    assert doc1 == {"pk": "a", "n": int(BIG), "d": Decimal("-1E-39"), "ss": {"x", "y"}, "b": b"\x00raw",
                    "m": {"l": [1, None]}}
    assert doc2["n"] == 99_900_000_000 and type(doc2["n"]) is int
    assert m1.old is None and m2.old == doc1 and m3.old == doc2
    assert [m.event_name for m in (m1, m2, m3)] == ["INSERT", "MODIFY", "REMOVE"]
    assert [m.sequence_number for m in (m1, m2, m3)] == [f"{i:021d}" for i in (1, 2, 3)]
    assert [m.event_id for m in (m1, m2, m3)] == ["ev-1", "ev-2", "ev-3"]
    assert all(m.keys == {"pk": "a"} and m.source == "dynamodb" and not m.expired for m in (m1, m2, m3))
    assert m1.creation_time_ms == T and m1.stream_view_type == "NEW_AND_OLD_IMAGES" and m1.aws_region == "us-east-1"
    assert m1.record is batch.records[0] and m1.partition_key == m1.sequence_number  # the KCL 3.x adapter's
    assert batch.stats == {"on_update_success": 2, "on_delete_success": 1} and batch.failed is None


async def test_a_deletion_by_ttl_is_marked_expired():
    ttl = change(4, "REMOVE", KEY, old={"pk": {"S": "a"}},
                 userIdentity={"principalId": "dynamodb.amazonaws.com", "type": "Service"})
    user = change(5, "REMOVE", KEY, old={"pk": {"S": "a"}})
    handler = Seen(context())
    await handler.dispatch(batch_of([dynamodb_record(ttl), dynamodb_record(user)]))
    assert [m.expired for _, m in handler.seen] == [True, False]


async def test_a_stream_without_new_images_gives_no_doc_and_seconds_are_read_as_seconds():
    keys_only = change(1, "INSERT", KEY, view="KEYS_ONLY", created=1795347960.5)
    empty = change(2, "MODIFY", KEY, new={}, old={}, view="KEYS_ONLY")  # the KCL 3.x adapter writes absent maps so
    handler = Seen(context())
    await handler.dispatch(batch_of([dynamodb_record(keys_only, v1=True), dynamodb_record(empty)]))
    (_, doc, meta), (_, doc2, meta2) = handler.seen
    assert doc is None and meta.keys == {"pk": "a"} and meta.old is None
    assert meta.creation_time_ms == 1795347960500 and meta.partition_key is None  # the KCL 1.x adapter's
    assert doc2 is None and meta2.old is None and meta2.position.seq == 2


async def test_kinesis_records_give_the_decoded_json_or_the_bytes():
    handler = Seen(context())
    await handler.dispatch(batch_of([kinesis(7, b'{"order": 1, "amount": 2.5}', "cust-1"), kinesis(8, b"\xff\x00raw"),
                                     kinesis(9, json.dumps({"eventSource": "aws:dynamodb"}).encode())]))
    (_, d1, m1), (_, d2, m2), (_, d3, _) = handler.seen
    assert d1 == {"order": 1, "amount": 2.5} and d2 == b"\xff\x00raw"
    assert d3 == {"eventSource": "aws:dynamodb"}  # no dynamodb object: not a change record
    assert (m1.source, m1.partition_key, m1.sequence_number, m1.sub_sequence_number, m1.arrival_time_ms) == \
        ("kinesis", "cust-1", "7", 0, 1476889707000)
    assert m1.keys is None and m1.event_name is None and m1.creation_time_ms is None and not m1.expired


async def test_emit_attributes_the_row_to_the_record_and_defaults_to_the_changes_creation_time():
    """The default is the record's arrival time, which for a DynamoDB change is its
    creation time: the stream's own clock (a caught-up shard's watermark follows the wall
    clock, as for arrival times); a change whose record has none gives its creation time."""
    class Emitting(mldserver.ChangeHandler):
        async def on_update(self, doc, meta):
            self.emit({"seq": meta.sequence_number})
            if meta.source == "kinesis":
                self.emit({"given": 1}, event_time_ms=5)

    batch = batch_of([dynamodb_record(change(1, "INSERT", KEY, KEY)), kinesis(7, b"{}")])
    await Emitting(context()).dispatch(batch)
    assert [(e.record, e.row, e.event_time_ms) for e in batch.rows] == [
        (batch.records[0], {"seq": "000000000000000000001"}, None),  # its arrival time: the creation time
        (batch.records[1], {"seq": "7"}, None),  # the record's arrival time, downstream
        (batch.records[1], {"given": 1}, 5),
    ]
    assert batch.records[0].approximate_arrival_timestamp == T
    no_arrival = dynamodb_record(change(2, "INSERT", KEY, KEY))
    del no_arrival["approximateArrivalTimestamp"]
    batch = batch_of([no_arrival])
    await Emitting(context()).dispatch(batch)
    assert [e.event_time_ms for e in batch.rows] == [T]
    with pytest.raises(RuntimeError, match="inside on_update/on_delete"):
        Emitting(context()).emit({"k": 1})


class Flaky(mldserver.ChangeHandler):
    """Raises for the record with sequence number ``bad`` every time, and for ``once``
    the first time only; emits a row before raising."""

    bad, once = "12", "14"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.calls = []

    async def on_update(self, doc, meta):
        self.calls.append(meta.sequence_number)
        self.emit({"seq": meta.sequence_number})
        if meta.sequence_number == self.bad or (meta.sequence_number == self.once and self.calls.count(self.once) == 1):
            raise ValueError(f"cannot handle {meta.sequence_number}")


async def test_a_failing_record_is_retried_alone_then_given_up_and_the_batch_goes_on():
    batch = batch_of([kinesis(seq, b"{}") for seq in range(10, 17)])
    handler = Flaky(context(handler_retries=2))
    await handler.dispatch(batch)
    assert handler.calls == ["10", "11", "12", "12", "12", "13", "14", "14", "15", "16"]
    assert batch.settle_failures() == [(2, "ValueError: cannot handle 12", 3)]
    assert [e.row["seq"] for e in batch.rows] == ["10", "11", "13", "14", "15", "16"]  # no row of a failed attempt
    assert batch.stats == {"on_update_success": 6, "on_update_failure": 4}


async def test_a_record_that_is_not_a_change_it_can_read_is_given_up_at_once():
    bad_number = change(1, "INSERT", KEY, {"pk": {"S": "a"}, "n": {"N": "twelve"}})
    unknown = change(2, "TRUNCATE", KEY)
    batch = batch_of([dynamodb_record(bad_number), dynamodb_record(unknown), kinesis(3, b"{}"), 5])
    batch.records[2]._raw["data"] = "not base64!"  # (reading its data fails too)
    handler = Seen(context())
    await handler.dispatch(batch)
    assert handler.seen == []
    failed = batch.settle_failures()
    assert [(i, attempts) for i, _, attempts in failed] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert "dynamodb.NewImage.n: N holds 'twelve', expected a number as a string" in failed[0][1]
    assert "eventName 'TRUNCATE'" in failed[1][1]


async def test_callbacks_may_be_plain_functions():
    class Plain(mldserver.ChangeHandler):
        seen: list = []

        def on_update(self, doc, meta):
            self.seen.append(doc)

        def on_delete(self, meta):
            self.seen.append(meta.keys)

    batch = batch_of([dynamodb_record(change(1, "INSERT", KEY, KEY)), dynamodb_record(change(2, "REMOVE", KEY))])
    await Plain(context()).dispatch(batch)
    assert Plain.seen == [{"pk": "a"}, {"pk": "a"}]


class Checkpoints:
    def __init__(self):
        self.calls = []

    async def checkpoint(self, sequence_number=None, sub_sequence_number=None, *, retry=True):
        self.calls.append((sequence_number, sub_sequence_number))


async def test_it_checkpoints_what_is_done_at_most_every_checkpoint_interval_and_never_past_a_failure():
    cp = Checkpoints()
    handler = Flaky(context(checkpoint_interval=3600.0, handler_retries=0))
    first = batch_of([kinesis(seq, b"{}") for seq in range(10, 14)])  # 12 fails
    await handler.process_records(first, FailureGuard(cp, first))
    second = batch_of([kinesis(seq, b"{}") for seq in range(20, 22)])
    await handler.process_records(second, FailureGuard(cp, second))  # within the interval: none
    assert cp.calls == [("11", 0)]  # held short of 12 until the server dead-letters it
    every = Flaky(context(checkpoint_interval=0.0))
    third = batch_of([kinesis(seq, b"{}") for seq in range(20, 22)])
    await every.process_records(third, FailureGuard(cp, third))
    assert cp.calls[-1] == (None, None)  # everything delivered


def test_parse_change_names_the_callback():
    callback, doc, meta = parse_change(Record(dynamodb_record(change(3, "REMOVE", KEY))))
    assert (callback, doc, meta.event_name) == ("on_delete", None, "REMOVE")
