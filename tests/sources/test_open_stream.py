"""``mldserver.open_stream``: a stream read from a script, against DynamoDB Local and
kinesis-local (real services on loopback): records in order per shard, parents before
children, a token that resumes exactly after the last record yielded (inside a KPL
aggregate too), ``move_to("latest")``, ``move_to(datetime)`` skipping what came before,
``heartbeat`` keeping an idle iterator's records; and the token's own form."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import datetime, timezone

import pytest
from aws_kinesis_agg.aggregator import RecordAggregator
from boto3.dynamodb.types import TypeSerializer

import mldserver
from mldserver.base.positions import Position
from mldserver.sources.stream import At, _decode, _encode, _target

from ..harness import bench
from ..integration.components import AWS, KinesisLocal, wait_for
from ..integration.test_dynamodb_changes import make_table

SER = TypeSerializer()
HALF = 2**127


# -- the token's form (no service) ---------------------------------------------------


@pytest.mark.parametrize("at, since, encoded", [
    (Position.parse("000000000000000000017", 0), None, "000000000000000000017"),
    (Position.parse("4959", 2), None, ["4959", 2]),                      # inside a KPL aggregate
    ("SHARD_END", None, "SHARD_END"),
    ("TRIM_HORIZON", None, "TRIM_HORIZON"),
    ("LATEST", None, "LATEST"),
    ("AT_TIMESTAMP", 1769767200000, "AT_TIMESTAMP:1769767200000"),
    (At("4960"), None, "AT_SEQUENCE_NUMBER:4960"),                       # read, nothing yielded yet
])  # fmt: skip
def test_a_shards_place_in_the_token_is_json_and_reads_back_the_same(at, since, encoded):
    assert _encode(at, since) == encoded
    assert _decode(json.loads(json.dumps(encoded))) == (at, since)


@pytest.mark.parametrize("bad", ["12x", "AT_TIMESTAMP:soon", ["1", -1], 17, None])
def test_a_token_position_that_is_none_of_these_is_refused(bad):
    with pytest.raises(ValueError, match="token's shard position"):
        _decode(bad)


def test_move_to_takes_a_name_an_aware_time_or_a_token():
    assert _target("LATEST") == ("latest", None)
    assert _target(datetime(2026, 1, 30, 10, tzinfo=timezone.utc)) == ("time", 1769767200000)
    assert _target({"stream": "arn", "shards": {}})[0] == "token"
    with pytest.raises(ValueError, match="zone"):
        _target(datetime(2026, 1, 30, 10))
    with pytest.raises(ValueError, match="trim_horizon"):
        _target("yesterday")


# -- DynamoDB Local ------------------------------------------------------------------


def put_items(client, table: str, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        client.put_item(TableName=table, Item={k: SER.serialize(v) for k, v in
                                               {"pk": f"item#{i}", "sk": i, "n": i}.items()})


async def drain(stream) -> list:
    return [item async for item in stream]


@pytest.fixture
def table(aws):
    name = f"stream-{uuid.uuid4().hex[:8]}"
    make_table(aws.client, name)
    return name


async def test_changes_come_in_order_and_a_token_resumes_exactly_after_the_last_one_yielded(aws, table):
    put_items(aws.client, table, 5)
    async with mldserver.open_stream(f"dynamodb:{table}") as stream:
        first = []
        async for change in stream:
            first.append(change)
            if len(first) == 3:
                break
        token = json.loads(json.dumps(stream.token))
    assert [c.doc["n"] for c in first] == [0, 1, 2]
    assert {c.event_name for c in first} == {"INSERT"} and first[1].keys == {"pk": "item#1", "sk": 1}
    assert token["stream"].startswith("arn:aws:dynamodb:") and list(token["shards"].values()) == \
        [first[-1].sequence_number]

    put_items(aws.client, table, 2, first=5)
    async with mldserver.open_stream(f"dynamodb:{table}", start=token) as again:
        rest = await drain(again)
        assert [c.doc["n"] for c in rest] == [3, 4, 5, 6]  # nothing twice, nothing lost
        assert await drain(again) == []  # at the head: the next iteration ends at once
        put_items(aws.client, table, 1, first=7)
        last = await drain(again)
        assert [c.doc["n"] for c in last] == [7]  # ... and goes on with what came since
        assert list(again.token["shards"].values()) == [last[0].sequence_number]


async def test_move_to_latest_skips_what_is_there_and_reads_what_comes(aws, table):
    put_items(aws.client, table, 3)
    async with mldserver.open_stream(f"dynamodb:{table}") as stream:
        await stream.move_to("latest")
        assert await drain(stream) == []
        put_items(aws.client, table, 2, first=3)
        assert [c.doc["n"] for c in await drain(stream)] == [3, 4]
        await stream.move_to("trim_horizon")
        assert [c.doc["n"] for c in await drain(stream)] == [0, 1, 2, 3, 4]


async def test_heartbeat_keeps_what_an_idle_latest_iterator_finds_and_the_token_names_it(aws, table):
    async with mldserver.open_stream(f"dynamodb:{table}", start="latest") as stream:
        [shard] = stream._shards.values()
        before = shard.cursor.iterator
        put_items(aws.client, table, 2)
        await stream.heartbeat()
        assert shard.cursor.iterator not in (None, before)  # a fresh iterator
        [where] = stream.token["shards"].values()
        assert where.startswith("AT_SEQUENCE_NUMBER:")  # read, not yet yielded: a reopen reads them too
        async with mldserver.open_stream(f"dynamodb:{table}", start=stream.token) as again:
            assert [c.doc["n"] for c in await drain(again)] == [0, 1]
        assert [c.doc["n"] for c in await drain(stream)] == [0, 1]


@pytest.mark.slow  # DynamoDB Local's creation times are whole minutes: up to a minute's wait
async def test_move_to_a_time_skips_the_changes_made_before_it(aws, table):
    put_items(aws.client, table, 3)
    since = (int(time.time()) // 60 + 1) * 60  # the next minute (DynamoDB Local's times are whole minutes)
    while time.time() < since + 0.5:
        await asyncio.sleep(0.1)
    put_items(aws.client, table, 2, first=3)
    at = datetime.fromtimestamp(since, timezone.utc)
    async with mldserver.open_stream(f"dynamodb:{table}") as stream:
        await stream.move_to(at)
        assert list(stream.token["shards"].values()) == [f"AT_TIMESTAMP:{since * 1000}"]
        assert [c.doc["n"] for c in await drain(stream)] == [3, 4]
    async with mldserver.open_stream(f"dynamodb:{table}", start=at) as stream:
        assert [c.doc["n"] for c in await drain(stream)] == [3, 4]


# -- kinesis-local -------------------------------------------------------------------


@pytest.fixture
def clicks(kinesis, monkeypatch):
    for key, value in {"AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint, "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
                       "AWS_REGION": AWS["region_name"]}.items():
        monkeypatch.setenv(key, value)

    def create(shards: int) -> str:
        name = f"clicks-{uuid.uuid4().hex[:8]}"
        kinesis.create_stream(name, shards)
        return name

    return create


def put(kinesis: KinesisLocal, name: str, n: int, tag: str, hash_keys=(0, HALF)) -> list[tuple]:
    out = []
    for i in range(n):  # one at a time: their order in a shard is the order put
        data = f"{tag}-{i}-".encode() + bytes([0xff, 0x00, i % 256])
        r = kinesis.client.put_record(StreamName=name, Data=data, PartitionKey=f"{tag}-{i}",
                                      ExplicitHashKey=str(hash_keys[i % len(hash_keys)] + i))
        out.append((r["ShardId"], r["SequenceNumber"], 0, data))
    return out


def per_shard(records: list[tuple]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


def seen(records) -> list[tuple]:
    return [(r.shard_id, r.sequence_number, r.sub_sequence_number, r.data) for r in records]


async def test_kinesis_records_come_with_their_exact_bytes_in_order_per_shard(kinesis, clicks):
    name = await asyncio.to_thread(clicks, 2)
    expected = await asyncio.to_thread(put, kinesis, name, 20, "a")
    async with mldserver.open_stream(f"kinesis:{name}") as stream:
        records = await drain(stream)
        assert all(isinstance(r, mldserver.Record) for r in records)
        got = seen(records)
        assert len(per_shard(expected)) == 2 and per_shard(got) == per_shard(expected)
        assert stream.token["shards"] == {shard: rs[-1][1] for shard, rs in per_shard(expected).items()}
        assert stream.lags == dict.fromkeys(per_shard(expected), 0)  # MillisBehindLatest: read to the head


async def test_a_token_inside_a_kpl_aggregate_resumes_at_its_next_user_record(kinesis, clicks):
    name = await asyncio.to_thread(clicks, 1)
    agg = RecordAggregator()
    for i in range(5):
        agg.add_user_record(f"u-{i}", f"user-{i}".encode())
    pk, _, blob = agg.clear_and_get().get_contents()
    r = await asyncio.to_thread(kinesis.client.put_record, StreamName=name, Data=blob, PartitionKey=pk)
    [after] = await asyncio.to_thread(put, kinesis, name, 1, "after")
    async with mldserver.open_stream(f"kinesis:{name}") as stream:
        taken = []
        async for record in stream:
            taken.append(record)
            if len(taken) == 3:
                break
        token = json.loads(json.dumps(stream.token))
    assert [t.sub_sequence_number for t in taken] == [0, 1, 2]
    assert token["shards"] == {"shardId-000000000000": [r["SequenceNumber"], 2]}
    async with mldserver.open_stream(f"kinesis:{name}", start=token) as again:
        assert [(x.sequence_number, x.sub_sequence_number, x.data) for x in await drain(again)] == \
            [(r["SequenceNumber"], 3, b"user-3"), (r["SequenceNumber"], 4, b"user-4"), (after[1], 0, after[3])]


async def test_a_split_and_a_merge_are_read_parents_first(kinesis, clicks):
    name = await asyncio.to_thread(clicks, 1)
    [parent] = kinesis.shards(name)
    expected = await asyncio.to_thread(put, kinesis, name, 10, "p")
    async with mldserver.open_stream(f"kinesis:{name}") as stream:
        got = seen(await drain(stream))  # the parent, open: read to its head
        kinesis.client.split_shard(StreamName=name, ShardToSplit=parent, NewStartingHashKey=str(HALF))
        await asyncio.to_thread(wait_for, lambda: len(kinesis.shards(name)) == 3, 60, "the split")
        children = sorted(set(kinesis.shards(name)) - {parent})
        expected += await asyncio.to_thread(put, kinesis, name, 10, "c")
        kinesis.client.merge_shards(StreamName=name, ShardToMerge=children[0], AdjacentShardToMerge=children[1])
        await asyncio.to_thread(wait_for, lambda: len(kinesis.shards(name)) == 4, 60, "the merge")
        [merged] = sorted(set(kinesis.shards(name)) - {parent, *children})
        expected += await asyncio.to_thread(put, kinesis, name, 5, "m")
        got += seen(await drain(stream))
        assert {s: stream.token["shards"][s] for s in (parent, *children)} == dict.fromkeys((parent, *children),
                                                                                            "SHARD_END")
    assert per_shard(got) == per_shard(expected) and len(got) == len(expected)
    index = {shard: [i for i, r in enumerate(got) if r[0] == shard] for shard in per_shard(got)}
    for child in children:
        assert max(index[parent]) < min(index[child]) and max(index[child]) < min(index[merged])

    async with mldserver.open_stream(f"kinesis:{name}") as fresh:  # all of it at once: parents first too
        again = seen(await drain(fresh))
    assert per_shard(again) == per_shard(expected)
    index = {shard: [i for i, r in enumerate(again) if r[0] == shard] for shard in per_shard(again)}
    for child in children:
        assert max(index[parent]) < min(index[child]) and max(index[child]) < min(index[merged])


async def test_kinesis_move_to_a_time_starts_at_timestamp_and_latest_skips_all(kinesis, clicks):
    name = await asyncio.to_thread(clicks, 2)
    await asyncio.to_thread(put, kinesis, name, 6, "old")
    since = time.time() + 0.3
    while time.time() < since + 0.3:
        await asyncio.sleep(0.05)
    expected = await asyncio.to_thread(put, kinesis, name, 6, "new")
    at = datetime.fromtimestamp(since, timezone.utc)
    async with mldserver.open_stream(f"kinesis:{name}", start=at) as stream:
        assert set(stream.token["shards"].values()) == {f"AT_TIMESTAMP:{round(since * 1000)}"}
        assert per_shard(seen(await drain(stream))) == per_shard(expected)
        await stream.move_to("latest")
        assert await drain(stream) == []
        later = await asyncio.to_thread(put, kinesis, name, 4, "later")
        assert per_shard(seen(await drain(stream))) == per_shard(later)


async def test_a_shard_read_to_its_end_and_gone_from_the_stream_is_forgotten():
    # (a trim takes a day on the real services: the listing is written out here)
    from mldserver.sources.service import ListedShard
    from mldserver.sources.stream import SHARD_END, Stream, _Shard
    from mldserver.sources.spec import SourceSpec

    class Listing:
        async def shards(self):
            return [ListedShard("child", ("parent",), False)]

    stream = Stream(SourceSpec.parse("dynamodb:orders"))
    stream.streams = Listing()
    ended = _Shard(ListedShard("parent", (), True), SHARD_END)
    ended.cursor = object()  # (it was read: its cursor ended)
    waiting = _Shard(ListedShard("other", (), True), Position.parse("5", 0))
    waiting.cursor = object()  # (still yielding what it read)
    stream._shards = {"parent": ended, "other": waiting}
    await stream._list()
    assert set(stream._shards) == {"child", "other"}
    assert set(stream.token["shards"]) == {"child", "other"}


def test_bench_stream_prints_open_stream_beside_bloop_and_the_floor():
    # DynamoDB Local and Bloop (scripts/setup --test: .deps/bloop); both sides must read
    # every change made, or the bench fails instead of printing
    out = bench("--part", "stream", "--quick", timeout=600)
    for reader in ("mldserver.open_stream", r"Bloop's Stream \(bloop 3.1.1\)"):
        assert re.search(rf"^\s+{reader}\s+1,000\s+[\d,]+\s+[\d.]+$", out, re.M), (reader, out)
    assert re.search(r"^\s+floor \(orjson, images decoded\)\s+1,000\s+[\d,]+$", out, re.M), out
    assert re.search(r"open_stream against Bloop: \d+\.\d\dx CPU per change", out), out
