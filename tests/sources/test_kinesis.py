"""Kinesis's records as the daemon sends them: one record each, a KPL aggregate one per
user record with its sub-sequence number, the exact bytes; and a stream's name from an ARN."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from datetime import datetime, timezone

from aws_kinesis_agg.aggregator import RecordAggregator

from mldserver.sources.kinesis import KinesisStreams, daemon_records, stream_name

DATA = Path(__file__).parent.parent / "data"
SEQ = "49590338271490256608559692538361571095921575989136588898"
AT = datetime(2026, 1, 30, 10, 0, 0, 123000, tzinfo=timezone.utc)


def test_a_record_is_daemon_shaped_with_its_exact_bytes():
    [record] = daemon_records({"SequenceNumber": SEQ, "Data": b"\xff\x00hi", "PartitionKey": "k",
                               "ApproximateArrivalTimestamp": AT})
    assert record == {"action": "record", "data": base64.b64encode(b"\xff\x00hi").decode(), "partitionKey": "k",
                      "sequenceNumber": SEQ, "subSequenceNumber": 0, "approximateArrivalTimestamp": 1769767200123}


def test_a_kpl_aggregate_is_one_record_per_user_record():
    agg = RecordAggregator()
    for i in range(3):
        agg.add_user_record(f"user-{i}", f"data-{i}".encode(), explicit_hash_key=str(100 + i))
    pk, _, blob = agg.clear_and_get().get_contents()
    records = daemon_records({"SequenceNumber": SEQ, "Data": blob, "PartitionKey": pk,
                              "ApproximateArrivalTimestamp": AT})
    assert [(r["sequenceNumber"], r["subSequenceNumber"], r["partitionKey"], base64.b64decode(r["data"]),
             r["explicitHashKey"]) for r in records] == \
        [(SEQ, i, f"user-{i}", f"data-{i}".encode(), str(100 + i)) for i in range(3)]


def test_a_blob_that_only_looks_aggregated_stays_one_record():
    blob = b"\xf3\x89\x9a\xc2" + b"x" * 40  # the magic, a digest that does not match
    [record] = daemon_records({"SequenceNumber": SEQ, "Data": blob, "PartitionKey": "k",
                               "ApproximateArrivalTimestamp": AT})
    assert base64.b64decode(record["data"]) == blob and record["subSequenceNumber"] == 0


def test_a_stream_arn_names_the_stream_and_its_region():
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/clicks"
    assert stream_name(arn) == stream_name("clicks") == "clicks"
    streams = KinesisStreams(arn)
    assert (streams.name, streams.region) == ("clicks", "eu-west-1")


def test_an_aggregate_with_a_bad_table_index_keeps_the_user_records_before_it_as_the_kcl():
    vectors = json.loads((DATA / "kpl-vectors.json").read_text())["vectors"]
    vector = next(v for v in vectors if v["name"] == "agg_bad_partition_key_index")
    records = daemon_records({"SequenceNumber": SEQ, "Data": base64.b64decode(vector["kinesis_record"]["data_b64"]),
                              "PartitionKey": "only-pk", "ApproximateArrivalTimestamp": AT})
    assert [(r["subSequenceNumber"], r["partitionKey"], r["data"]) for r in records] == \
        [(u["sub_sequence_number"], u["partition_key"], u["data_b64"]) for u in vector["expected_user_records"]]


def test_a_page_as_sent_base64_and_epoch_seconds_gives_the_same_records_as_a_parsed_one():
    # (the source's client keeps blobs and timestamps as the service sent them:
    # base.aws.client(raw=True); only an aggregate's data is decoded)
    agg = RecordAggregator()
    for i in range(3):
        agg.add_user_record(f"user-{i}", f"data-{i}".encode(), explicit_hash_key=str(100 + i))
    pk, _, aggregate = agg.clear_and_get().get_contents()
    lookalike = b"\xf3\x89\x9a\xc2" + b"x" * 40
    for blob, key in ((b"\xff\x00hi", "k"), (aggregate, pk), (lookalike, "k"), (b"", "k")):
        parsed = {"SequenceNumber": SEQ, "Data": blob, "PartitionKey": key, "ApproximateArrivalTimestamp": AT}
        as_sent = dict(parsed, Data=base64.b64encode(blob).decode(), ApproximateArrivalTimestamp=AT.timestamp())
        assert daemon_records(as_sent) == daemon_records(parsed), blob

