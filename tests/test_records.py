"""What a handler sees: records decoded lazily, positions parsed once, rows emitted."""

from __future__ import annotations

import base64
import binascii

import pytest
from hypothesis import given, strategies as st

from mldserver.base.positions import Position
from mldserver.api.records import Batch, Emitted, EmittedRows, Record, ShardInfo, decode_data

RAW = {"data": "bWVvdw==", "partitionKey": "cat", "sequenceNumber": "4959", "subSequenceNumber": 2,
       "approximateArrivalTimestamp": 1476889707000, "action": "record"}


def test_a_record_reads_the_daemons_fields_and_decodes_data_on_first_use():
    record = Record(RAW)
    assert (record.partition_key, record.sequence_number, record.sub_sequence_number) == ("cat", "4959", 2)
    assert record.approximate_arrival_timestamp == 1476889707000 and record.explicit_hash_key is None
    assert record.raw_data == "bWVvdw==" and record.data == b"meow"
    assert Record({"sequenceNumber": "1", "data": None}).data == b""


@given(st.binary(max_size=3000))
def test_data_decodes_to_the_bytes_that_were_encoded(payload):
    assert decode_data(base64.b64encode(payload).decode("ascii")) == payload


def _outcome(decode, text):
    try:
        return decode(text)
    except ValueError as exc:  # binascii.Error included
        return type(exc)


@given(st.text(alphabet=st.sampled_from("ABCxyz019+/=\n -_!\u00e9"), max_size=200))
def test_data_that_is_not_strict_base64_reads_as_binascii_reads_it(text):
    """The SIMD decoder is strict; whatever it refuses (a line break, a character outside
    the alphabet, bad padding, non-ASCII) decodes, or fails, exactly as binascii's."""
    assert _outcome(decode_data, text) == _outcome(binascii.a2b_base64, text)


def test_the_position_is_parsed_once_and_kept():
    record = Record(dict(RAW))
    assert record.position == Position(4959, 2, "4959")
    assert record.position is record.position
    given = Position(7, 1, "7")
    assert Record({"sequenceNumber": "9"}, None, given).position is given  # the decoder's, as is


def test_a_record_without_a_valid_sequence_number_has_no_position():
    for raw in [{"sequenceNumber": "TRIM_HORIZON"}, {"data": "eA=="}, {"sequenceNumber": "1", "subSequenceNumber": -1}]:
        with pytest.raises(ValueError, match="not a position"):
            Record(raw).position


def test_a_de_aggregated_record_writes_its_data_back_as_base64():
    record = Record({"sequenceNumber": "5", "subSequenceNumber": 1, "data": None}, b"meow")
    assert record.raw_data is None and record.to_json()["data"] == "bWVvdw=="


def test_emitted_rows_are_kept_only_when_something_collects_them():
    record = Record(RAW)
    shard = ShardInfo("shardId-1", "TRIM_HORIZON", None)
    ignored = Batch([record], 0, shard)
    ignored.emit(record, {"k": 1})
    assert ignored.rows is None and len(ignored) == 1
    collected = Batch([record], 0, shard, rows=EmittedRows())
    collected.emit(record, {"k": 1})
    collected.emit(record, {"k": 2}, event_time_ms=1763719200000)
    assert list(collected.rows) == [Emitted(record, {"k": 1}, None), Emitted(record, {"k": 2}, 1763719200000)]
    assert collected.rows[1].event_time_ms == 1763719200000 and type(collected.rows[0]) is Emitted


def _batch(n=4, rows=True):
    records = [Record({"sequenceNumber": str(100 + i), "subSequenceNumber": 0, "data": "eA=="}) for i in range(n)]
    return Batch(records, 0, ShardInfo("shardId-0", None, None), EmittedRows() if rows else None)


def test_fail_keeps_each_failed_record_by_index_with_its_error_and_drops_its_rows():
    batch = _batch()
    r = batch.records
    for record in r:
        batch.emit(record, {"seq": record.sequence_number})
    batch.fail(r[2], ValueError("bad order"), attempts=3)
    batch.fail(r[0], "gave up")
    batch.fail(r[2], "a second error is not kept")
    assert batch.settle_failures() == [(0, "gave up", 1), (2, "ValueError: bad order", 3)]
    assert [e.row["seq"] for e in batch.rows] == ["101", "103"]


def test_fail_finds_a_record_given_by_value_and_refuses_one_from_elsewhere():
    batch = _batch(rows=False)
    batch.fail(Record({"sequenceNumber": "102", "subSequenceNumber": 0}), "copy")
    assert batch.settle_failures() == [(2, "copy", 1)]
    with pytest.raises(ValueError, match="not a record of this batch; pass one of batch.records"):
        batch.fail(Record({"sequenceNumber": "7"}), "stranger")


def test_a_batch_with_no_failure_settles_to_nothing():
    batch = _batch()
    batch.emit(batch.records[0], {"k": 1})
    assert batch.settle_failures() == [] and len(batch.rows) == 1
