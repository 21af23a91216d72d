"""Lineage: from what the server has seen, and from the stream's own API through
aioboto3 against moto's server on loopback (a real HTTP endpoint, not a mock)."""

from __future__ import annotations

import urllib.request

import boto3
import pytest
from moto.server import ThreadedMotoServer

from mldserver.coordinator import lineage as lineage_module
from mldserver.coordinator.lineage import Lineage, StreamShards
from mldserver.base.positions import Position

from ..integration.components import free_port

AWS = dict(region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")


@pytest.fixture(scope="module")
def moto_server():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def moto_endpoint(moto_server):
    """The module's moto server, emptied: each test (and each repetition) starts clean."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"), timeout=10).close()
    return moto_server


@pytest.fixture(autouse=True)
def credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


async def test_seen_split_makes_the_next_two_new_shards_children_of_the_ended_one():
    lineage = Lineage()
    await lineage.started("s0", None)
    await lineage.started("s1", None)
    lineage.ended("s0")
    await lineage.started("s1", Position.parse("12345"))  # a restart of a known shard is not a child
    await lineage.started("s2", None)
    await lineage.started("s3", None)
    await lineage.started("s4", None)  # s0 has its two children already
    assert lineage.parents_of("s2") == ("s0",) and lineage.parents_of("s3") == ("s0",)
    assert lineage.parents_of("s4") == () and lineage.parents_of("s1") == ()
    assert lineage.children_of("s0") == ["s2", "s3"]



async def test_a_shard_marked_seen_is_never_taken_for_a_child_of_an_ended_one():
    lineage = Lineage()
    await lineage.started("s0", None)
    lineage.ended("s0")
    lineage.mark_seen("s1")  # replayed from the spool, say: known here without starting
    await lineage.started("s1", None)
    assert lineage.parents_of("s1") == ()
    await lineage.started("s2", None)
    assert lineage.parents_of("s2") == ("s0",)


async def test_kinesis_list_shards_gives_split_and_merge_parents(moto_endpoint):
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, **AWS)
    kinesis.create_stream(StreamName="orders", ShardCount=2)
    shards = kinesis.list_shards(StreamName="orders")["Shards"]
    s0, s1 = shards[0]["ShardId"], shards[1]["ShardId"]
    low = int(shards[0]["HashKeyRange"]["StartingHashKey"])
    high = int(shards[0]["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName="orders", ShardToSplit=s0, NewStartingHashKey=str((low + high) // 2))
    after_split = {s["ShardId"]: s for s in kinesis.list_shards(StreamName="orders")["Shards"]}
    children = sorted(i for i, s in after_split.items() if s.get("ParentShardId") == s0)
    assert len(children) == 2
    kinesis.merge_shards(StreamName="orders", ShardToMerge=children[1], AdjacentShardToMerge=s1)

    lineage = Lineage(StreamShards("orders", region="us-east-1", endpoint_url=moto_endpoint))
    await lineage.started(s0, None)
    await lineage.started(children[0], None)
    assert lineage.parents_of(children[0]) == (s0,)
    merged = [i for i, s in {s["ShardId"]: s for s in kinesis.list_shards(StreamName="orders")["Shards"]}.items()
              if s.get("AdjacentParentShardId")]
    await lineage.started(merged[0], None)  # unknown at the last fetch: refreshed
    assert set(lineage.parents_of(merged[0])) == {children[1], s1}
    assert merged[0] in lineage.children_of(s1)


async def test_the_shards_still_to_come_are_the_open_ones_and_their_closed_parents(moto_endpoint):
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, **AWS)
    kinesis.create_stream(StreamName="orders", ShardCount=2)
    shards = kinesis.list_shards(StreamName="orders")["Shards"]
    s0, s1 = shards[0]["ShardId"], shards[1]["ShardId"]
    low, high = int(shards[0]["HashKeyRange"]["StartingHashKey"]), int(shards[0]["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName="orders", ShardToSplit=s0, NewStartingHashKey=str((low + high) // 2))
    children = sorted(s["ShardId"] for s in kinesis.list_shards(StreamName="orders")["Shards"]
                      if s.get("ParentShardId") == s0)

    lineage = Lineage(StreamShards("orders", region="us-east-1", endpoint_url=moto_endpoint))
    to_come = await lineage.to_come()
    assert to_come == {s0: (), s1: (), children[0]: (s0,), children[1]: (s0,)}  # s0 is closed: a parent to read
    assert sorted(lineage.children_of(s0)) == children
    assert await Lineage().to_come() == {}  # no stream: nothing known


async def test_dynamodb_streams_describe_stream_gives_the_shards(moto_endpoint):
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, **AWS)
    table = dynamodb.create_table(
        TableName="orders",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
    )
    arn = table["TableDescription"]["LatestStreamArn"]
    stream = StreamShards(arn, region="us-east-1", endpoint_url=moto_endpoint)
    assert stream.dynamodb
    shards = await stream.fetch()
    assert shards and all(parents == () for parents in shards.values())


async def test_a_stream_the_api_does_not_know_falls_back_to_what_was_seen(moto_endpoint):
    lineage = Lineage(StreamShards("no-such-stream", region="us-east-1", endpoint_url=moto_endpoint))
    lineage.ended("s0")
    await lineage.started("s1", None)  # ResourceNotFoundException, answered at once
    assert lineage.parents_of("s1") == ("s0",)


async def test_unreachable_stream_api_falls_back_to_what_was_seen_after_the_lookups_time_out(monkeypatch):
    monkeypatch.setattr(lineage_module, "LOOKUP_TIMEOUT", 1.0)  # (10 s: botocore retries a refused connection)
    lineage = Lineage(StreamShards("orders", region="us-east-1", endpoint_url=f"http://127.0.0.1:{free_port()}"))
    lineage.ended("s0")
    await lineage.started("s1", None)
    assert lineage.parents_of("s1") == ("s0",)
