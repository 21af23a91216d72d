"""Decoding a batch (KPL aggregates on a KCL 1.x daemon, records kept byte-exact) and
encoding what the handler emitted; through the server, and with plain calls."""

from __future__ import annotations

import base64
import json

import pytest

import mldserver
from mldserver import native
from mldserver.base.positions import Position
from mldserver.api.records import MAX_EVENT_TIME_MS, Emitted, Record, valid_event_time
from mldserver.pool import frames
from mldserver.shard.batches import BAD_ROW, INVALID_AGGREGATE, MALFORMED, decode_records, encode_rows, encoded_rows
from mldserver.api.testing import SHARD_END, FakeDaemon, make_records

from ..conftest import DATA
from ..harness import running
from ..helpers import counted_parses
from .serving import dead_letters, recorder

VECTORS = {v["name"]: v for v in json.loads((DATA / "kpl-vectors.json").read_text())["vectors"]}


async def test_unicode_partition_keys_survive_byte_exact(tmp_path):
    Rec, calls = recorder()
    key = "a\u2028b\u2029c\u0085d\U0001F600"
    async with running(tmp_path, Rec) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.child.write(
            ('{"action":"processRecords","records":[{"data":"eA==","partitionKey":"' + key +
             '","sequenceNumber":"1","subSequenceNumber":0}],"millisBehindLatest":0}\n').encode()
        )
        assert (await shard.child.read_message())["responseFor"] == "processRecords"
        await shard.lease_lost()
        await shard.close()
    assert calls[1][1][0][2] == key


async def test_kcl1_daemon_gets_v1_checkpoints_and_deaggregated_records(tmp_path):
    vectors = {v["name"]: v for v in json.loads((DATA / "kpl-vectors.json").read_text())["vectors"]}
    Rec, calls = recorder()

    class CheckpointingRec(Rec):
        async def process_records(self, batch, checkpointer):
            await super().process_records(batch, checkpointer)
            await checkpointer.checkpoint(batch.records[-1].sequence_number)

    async with running(tmp_path, CheckpointingRec) as (_, _, plain):
        daemon = FakeDaemon(plain.command, v1=True)
        shard = await daemon.shard("s")
        records = [
            {"data": vectors[name]["kinesis_record"]["data_b64"], "partitionKey": vectors[name]["kinesis_record"]["partition_key"],
             "sequenceNumber": str(100 + i), "approximateArrivalTimestamp": 1}
            for i, name in enumerate(["agg_3_records", "agg_bad_md5", "agg_bad_partition_key_index"])
        ]
        await shard.process_records(records)
        await shard.shutdown("TERMINATE")
        await shard.close()
    seen = calls[1][1]
    assert [(s, sub, pk, d) for s, sub, pk, d in seen[:3]] == [
        ("100", 0, "alpha", b"one"), ("100", 1, "beta", b"two"), ("100", 2, "alpha", b"three")]
    assert seen[3][:3] == ("101", None, "alpha")  # corrupt aggregate passes through whole
    assert seen[3][3] == base64.b64decode(vectors["agg_bad_md5"]["kinesis_record"]["data_b64"])
    assert [s[:2] for s in seen[4:]] == [("102", 0)]
    assert shard.checkpoint_requests[0] == ("102", None)  # the v1 "checkpoint" form
    assert daemon.checkpoints["s"] == SHARD_END
    [letter] = dead_letters(tmp_path, "s")  # the partly expanded aggregate is kept whole
    assert letter["sequence_number"] == "102" and letter["reason"] == "invalid KPL aggregate"


async def test_a_row_that_is_not_json_dead_letters_its_record_and_keeps_the_others(tmp_path):
    class BytesRow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                value = record.data if record.sequence_number == "11" else record.sequence_number
                batch.emit(record, {"value": value})

    async with running(tmp_path, BytesRow, sink=f"file:{tmp_path / 'out'}", window=3600.0) as (server, _, daemon):
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(10, 3), millis_behind_latest=1000)  # window stays open
        rows = [r.data for r in server.coordinator.ledger.uncommitted("shardId-1")]
        assert rows == [b'{"value":"10"}', b'{"value":"12"}']
        [letter] = dead_letters(tmp_path, "shardId-1")
        assert letter["sequence_number"] == "11" and letter["reason"] == "bad row"
        assert "not JSON-encodable" in letter["error"] and base64.b64decode(letter["data"]) == b"11111111"
        await shard.lease_lost()
        await shard.close()


# -- with plain calls ------------------------------------------------------------


def kinesis_record(name, seq):
    record = VECTORS[name]["kinesis_record"]
    return {"data": record["data_b64"], "partitionKey": record["partition_key"], "sequenceNumber": seq,
            "approximateArrivalTimestamp": 1}


def test_records_are_decoded_lazily_with_the_last_ones_position_parsed():
    raws = [{"sequenceNumber": "7", "data": "eA=="}, {"sequenceNumber": "8", "subSequenceNumber": 2, "data": "eQ=="}]
    records, bad = decode_records(raws, deaggregate_kpl=False)
    assert bad == [] and [r.data for r in records] == [b"x", b"y"]
    assert [r.position for r in records] == [Position(7, 0, "7"), Position(8, 2, "8")]


def test_a_batch_whose_last_record_has_no_position_is_malformed_whole():
    for last in [{"data": "eA=="}, {"sequenceNumber": "12x"}, {"sequenceNumber": 12}, "not an object"]:
        raws = [{"sequenceNumber": "7"}, last]
        records, bad = decode_records(raws, deaggregate_kpl=False)
        assert records == [] and bad == [(raws, MALFORMED, bad[0].error)]


def test_aggregates_expand_into_records_with_their_sub_sequence_positions():
    records, bad = decode_records([kinesis_record("agg_3_records", "100")], deaggregate_kpl=True)
    assert bad == []
    assert [r.position for r in records] == [Position(100, sub, "100") for sub in range(3)]
    assert [(r.partition_key, r.data) for r in records] == [("alpha", b"one"), ("beta", b"two"), ("alpha", b"three")]


def test_an_aggregate_that_breaks_half_way_is_returned_to_dead_letter_not_fired_off():
    raw = kinesis_record("agg_bad_partition_key_index", "102")
    records, bad = decode_records([kinesis_record("agg_1_record", "101"), raw], deaggregate_kpl=True)
    [(raws, reason, error)] = bad
    assert raws == [raw] and reason == INVALID_AGGREGATE and error
    assert [r.position for r in records][:1] == [Position(101, 0, "101")]
    assert all(r.sequence_number in ("101", "102") for r in records)


def test_rows_become_items_at_their_records_position_and_event_time():
    a = Record({"sequenceNumber": "7", "approximateArrivalTimestamp": 1000})
    b = Record({"sequenceNumber": "8", "subSequenceNumber": 1, "approximateArrivalTimestamp": 2000})
    items, bad = encode_rows([Emitted(a, {"k": 1}, None), Emitted(b, {"k": 2}, 5000)])
    assert bad == []
    assert [(i.time, i.position, i.data) for i in items] == [
        (1000, Position(7, 0, "7"), b'{"k":1}'), (5000, Position(8, 1, "8"), b'{"k":2}')]


def test_rows_a_handler_process_encoded_are_read_in_place_with_their_records_positions_and_times():
    records = [Record({"sequenceNumber": "7", "approximateArrivalTimestamp": 1000}),
               Record({"sequenceNumber": "8", "approximateArrivalTimestamp": "soon", "data": "eA=="}),
               Record({"sequenceNumber": "9"})]
    emitted = [(records[0], {"k": 1}, None), (records[2], {"k": 2}, None), (records[1], {"k": 3}, 5),
               (records[1], {"k": 4}, None), (records[0], {"k": 5}, 6)]
    n, parts, bad = frames.encode_rows(emitted, records)
    assert bad == [] and frames.decode_rows(n, b"".join(parts)).times.tolist() == [-2, -2, 5, -2, 6]
    rows, unfit = encoded_rows(records, *frames.decode_rows(n, b"".join(parts)))
    assert [(i.time, i.position.seq, i.data) for i in rows] == [
        (1000, 7, b'{"k":1}'), (None, 9, b'{"k":2}'), (5, 8, b'{"k":3}'), (6, 7, b'{"k":5}')]
    # the child leaves the arrival time to the server where no event time was given: the
    # server fills it in, and refuses a bad one, saying why
    assert [(r.raws[0]["sequenceNumber"], r.reason) for r in unfit] == [("8", BAD_ROW)]
    assert "event time 'soon' from the record's approximateArrivalTimestamp" in unfit[0].error
    n, parts, _ = frames.encode_rows(emitted[:1], records[:1])
    assert parts[-1].obj is not None  # the lines where emit wrote them: sent, not joined
    rows, unfit = encoded_rows(records[:1], *frames.decode_rows(n, b"".join(parts)))
    assert unfit == [] and bytes(rows.body) == b'{"k":1}\n'  # the child's JSON line, not copied


def test_rows_of_a_lazily_read_line_take_the_positions_checked_in_bulk_and_the_childs_times(monkeypatch):
    from mldserver.base.positions import Positions
    from mldserver.protocol.lazy import LazyRecords

    raws = make_records(100, 4)
    raws[1]["approximateArrivalTimestamp"] = 1234
    del raws[3]["approximateArrivalTimestamp"]
    line = json.dumps({"action": "processRecords", "records": raws}).encode()
    records, bad = decode_records(LazyRecords.parse(line), deaggregate_kpl=False, positions=True)
    assert bad == [] and type(records).__name__ == "LineRecords" and type(records.positions) is Positions
    child = frames.records_from(line, True)  # the handler process's records, from the same line
    emitted = [(child[0], {"k": 0}, 5), (child[1], {"k": 1}, None), (child[3], {"k": 3}, None)]
    n, parts, _ = frames.encode_rows(emitted, child)
    made = []
    monkeypatch.setattr(Record, "__init__", lambda *a: made.append(a))  # a Record each would show here
    rows, unfit = encoded_rows(records, *frames.decode_rows(n, b"".join(parts)))
    assert made == [] and unfit == [] and rows.positions is records.positions
    assert rows.times.tolist() == [5, 1234, frames.NO_TIME]  # given; the arrival time; none at all
    # The arrival times came with the positions (the native scan): the line not parsed again;
    # with MLDSERVER_NO_EXTENSIONS, both are read from the line parsed once.
    assert (records.raws._array is None) is native.native_allowed()
    assert [rows.position(i).seq for i in range(3)] == [int(raws[i]["sequenceNumber"]) for i in (0, 1, 3)]


def test_a_line_the_protocol_read_lazily_holds_no_parsed_line_while_it_waits(monkeypatch):
    """A decoded line keeps only its bytes (its parsed form is some 2.4 times their
    size, and with a sink at 32 shards every line waiting for a handler process kept
    one: 180 MiB of the server's memory). The native check reads what the conversation
    needs without pysimdjson, and the native scan reads the positions from the bytes, so
    the line is never parsed whole; without them it is parsed twice."""
    from mldserver.protocol import messages

    parses = counted_parses(monkeypatch)
    raws = make_records(100, 3)
    event = messages.decode(json.dumps({"action": "processRecords", "records": raws}).encode(), lazy=True)
    assert parses == ([] if native.native_allowed() else [1]) and event.records._array is None  # only bytes
    records, bad = decode_records(event.records, deaggregate_kpl=False, positions=True, later=True)
    assert records.read_positions() and bad == []
    assert parses == ([] if native.native_allowed() else [1, 1]) and event.records._array is None
    assert [p.seq for p in records.positions] == [100, 101, 102]


@pytest.mark.parametrize("odd", [None, "7x", "not an object"])
def test_a_lines_positions_can_be_read_later_and_a_record_without_one_is_then_found(odd):
    """``later``: decoded without reading every position (a handler process parses the
    line meanwhile); ``read_positions`` reads them then, or says one is missing, and
    decoding again without ``later`` returns that record as malformed."""
    from mldserver.protocol import messages

    raws = make_records(100, 3)
    if odd == "not an object":
        raws[1] = odd
    elif odd is not None:
        raws[1]["sequenceNumber"] = odd
    line = json.dumps({"action": "processRecords", "records": raws}).encode()
    records, bad = decode_records(messages.decode(line, lazy=True).records, deaggregate_kpl=False, positions=True,
                                  later=True)
    assert bad == [] and len(records) == 3 and records.positions is None
    assert records[-1].position == Position(102, 0, "102")  # the last one's, always read at once
    if odd is None:
        assert records.read_positions() is True
        assert [p.seq for p in records.positions] == [100, 101, 102]
        # the arrival times, read in the same native pass (else, MLDSERVER_NO_EXTENSIONS, record by record)
        assert len(records.arrivals) == 3 * 8 if native.native_allowed() else records.arrivals is None
        return
    assert records.read_positions() is False
    records, bad = decode_records(messages.decode(line, lazy=True).records, deaggregate_kpl=False, positions=True)
    assert [r.sequence_number for r in records] == ["100", "102"]
    assert [(b.raws, b.reason) for b in bad] == [([raws[1]], MALFORMED)]


def test_a_row_that_cannot_be_an_item_is_returned_with_its_record():
    good = Record({"sequenceNumber": "7"})
    unparsable = Record({"sequenceNumber": "seven", "data": "eA=="})
    items, bad = encode_rows([Emitted(good, {"k": b"bytes"}, 1), Emitted(good, {"k": 1}, 1),
                              Emitted(unparsable, {"k": 2}, 1)])
    assert [i.data for i in items] == [b'{"k":1}']
    assert [(b.raws[0]["sequenceNumber"], b.reason) for b in bad] == [("7", BAD_ROW), ("seven", BAD_ROW)]
    assert "not JSON-encodable" in bad[0].error and "not a position" in bad[1].error


def test_with_a_sink_every_position_is_parsed_at_once_and_a_record_without_one_is_bad():
    raws = [{"sequenceNumber": "7"}, {"sequenceNumber": "7x"}, "not an object", {"sequenceNumber": "9"}]
    records, bad = decode_records(raws, deaggregate_kpl=False, positions=True)
    assert [r._position for r in records] == [Position(7, 0, "7"), Position(9, 0, "9")]
    assert [(b.raws, b.reason) for b in bad] == [([raws[1]], MALFORMED), ([raws[2]], MALFORMED)]
    records, bad = decode_records(raws[:1] + raws[3:], deaggregate_kpl=False, positions=True)
    assert bad == [] and [r.position for r in records] == [Position(7, 0, "7"), Position(9, 0, "9")]


@pytest.mark.parametrize("value", ["soon", 1.5, True, None, -1, MAX_EVENT_TIME_MS, 2**63, 2**64 + 1000, [1], {"t": 1}])
@pytest.mark.parametrize("given_by", ["emit", "arrival_time"])
def test_an_event_time_that_is_not_epoch_ms_makes_a_bad_row_with_its_record(given_by, value):
    good = Record({"sequenceNumber": "7", "approximateArrivalTimestamp": 1000})
    if given_by == "emit":
        odd, t = Record({"sequenceNumber": "8", "approximateArrivalTimestamp": 2000, "data": "eA=="}), value
    else:
        odd, t = Record({"sequenceNumber": "8", "approximateArrivalTimestamp": value, "data": "eA=="}), None
    items, bad = encode_rows([Emitted(good, {"k": 1}, None), Emitted(odd, {"k": 2}, t), Emitted(good, {"k": 3}, 3)])
    if value is None:  # no event time: the shard's previous row's (emit: the record's arrival time)
        assert bad == [] and [i.time for i in items] == [1000, 2000 if given_by == "emit" else None, 3]
        return
    assert [(i.time, i.data) for i in items] == [(1000, b'{"k":1}'), (3, b'{"k":3}')]
    [(raws, reason, error)] = bad
    assert raws == [odd.to_json()] and raws[0]["data"] == "eA==" and reason == BAD_ROW
    assert "event time" in error and ("emit" in error if given_by == "emit" else "approximateArrivalTimestamp" in error)


def test_event_times_from_1970_to_the_year_9999_are_kept():
    record = Record({"sequenceNumber": "7", "approximateArrivalTimestamp": 0})
    items, bad = encode_rows([Emitted(record, {}, None), Emitted(record, {}, MAX_EVENT_TIME_MS - 1)])
    assert bad == [] and [i.time for i in items] == [0, MAX_EVENT_TIME_MS - 1]
    assert valid_event_time(1763719200000) and not valid_event_time(False) and not valid_event_time(1763719200000.0)
