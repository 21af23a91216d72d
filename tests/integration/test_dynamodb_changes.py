"""A change handler over a real DynamoDB stream: DynamoDB Local (streams on, view
``NEW_AND_OLD_IMAGES``), items put, updated and deleted with 38-digit numbers,
decimals, sets, binary, nested maps and lists; the stream's records read with the
real Streams API (``GetRecords``), handed to the server through the fake daemon in
the KCL DynamoDB Streams adapter's format (``testing.adapter_change``), and handled in
a handler process (and in the server's loop). ``on_update`` and ``on_delete`` see
exactly the values written, in order, and the shard is checkpointed."""

from __future__ import annotations

import pickle
import uuid
from decimal import Decimal

import boto3
import pytest
from boto3.dynamodb.types import TypeSerializer

from mldserver.api.testing import adapter_change, dynamodb_record

from ..harness import running
from ..pool.serving import pooled
from .components import AWS, DynamoDBLocal



BIG = 12345678901234567890123456789012345678  # 38 digits: DynamoDB's most
ORDER = {
    "pk": "order#1",
    "sk": 1,
    "big": BIG,
    "negative": -99999999999999999999999999999999999999,
    "decimal": Decimal("1234567890123456789012345678901234567.8"),
    "tiny": Decimal("0.000000000000000000000000000000000000001"),
    "price": Decimal("12.5"),
    "tags": {"new", "gift"},
    "sizes": {1, Decimal("2.5"), BIG},
    "blobs": {b"\x00\x01", b"\xff"},
    "raw": b"\x00raw\xff",
    "paid": True,
    "coupon": None,
    "lines": [
        {"sku": "x-1", "qty": 3, "labels": {"fragile"}},
        {"sku": "y-2", "qty": 1, "extra": {"deep": {"deeper": [1, "two", b"3", Decimal("4.25")]}}},
    ],
    "address": {"city": "Zürich", "geo": {"lat": Decimal("47.3769"), "lon": Decimal("8.5417")}},
}
GIFT = {"pk": "order#2", "sk": 1, "note": "gift", "amount": Decimal("-0.01"), "codes": {"A1", "B2"}}
KEY1 = {"pk": "order#1", "sk": 1}
KEY2 = {"pk": "order#2", "sk": 1}


def same(a, b) -> bool:
    """Equal, with the same kinds of values all the way down (an int is not a
    Decimal, a set not a list, bytes not str)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def make_table(client, name: str) -> str:
    table = client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "sk", "AttributeType": "N"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    return table["TableDescription"]["LatestStreamArn"]


def write(client, name: str) -> list[tuple[str, str, dict | None, dict | None]]:
    """Put, update and delete; what each change should show: (callback, event name,
    the new image, the old image)."""
    ser = TypeSerializer()
    item = lambda values: {k: ser.serialize(v) for k, v in values.items()}  # noqa: E731
    expected = []
    order = dict(ORDER)
    client.put_item(TableName=name, Item=item(order))
    expected.append(("on_update", "INSERT", dict(order), None))
    client.put_item(TableName=name, Item=item(GIFT))
    expected.append(("on_update", "INSERT", dict(GIFT), None))
    client.update_item(
        TableName=name, Key=item(KEY1),
        UpdateExpression="SET #p = :p, #a.geo.lat = :lat, #l[0].qty = :q REMOVE paid ADD tags :t",
        ExpressionAttributeNames={"#p": "price", "#a": "address", "#l": "lines"},
        ExpressionAttributeValues=item({":p": Decimal("99999999999999999999.99999"), ":lat": Decimal("-47.5"),
                                        ":q": 4, ":t": {"late"}}),
    )
    before = order
    order = {**before, "price": Decimal("99999999999999999999.99999"), "tags": before["tags"] | {"late"},
             "address": {"city": "Zürich", "geo": {"lat": Decimal("-47.5"), "lon": Decimal("8.5417")}},
             "lines": [{**before["lines"][0], "qty": 4}, before["lines"][1]]}
    del order["paid"]
    expected.append(("on_update", "MODIFY", dict(order), before))
    client.delete_item(TableName=name, Key=item(KEY2))
    expected.append(("on_delete", "REMOVE", None, dict(GIFT)))
    client.update_item(TableName=name, Key=item(KEY1), UpdateExpression="SET #b = :b",
                       ExpressionAttributeNames={"#b": "big"}, ExpressionAttributeValues=item({":b": -BIG}))
    before, order = order, {**order, "big": -BIG}
    expected.append(("on_update", "MODIFY", dict(order), before))
    client.delete_item(TableName=name, Key=item(KEY1))
    expected.append(("on_delete", "REMOVE", None, dict(order)))
    return expected


def stream_records(dynamodb: DynamoDBLocal, arn: str, n: int) -> tuple[str, list[dict]]:
    """The stream's shard and its first ``n`` records, by the real Streams API."""
    streams = boto3.client("dynamodbstreams", endpoint_url=dynamodb.endpoint, **AWS)
    [shard] = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    records: list[dict] = []
    for _ in range(20):
        page = streams.get_records(ShardIterator=iterator)
        records += page["Records"]
        iterator = page.get("NextShardIterator")
        if len(records) >= n or not iterator:
            break
    assert len(records) == n, f"{len(records)} stream records, expected {n}"
    return shard["ShardId"], records


def seen(path) -> list[dict]:
    out = []
    with open(path, "rb") as f:
        while True:
            try:
                out.append(pickle.load(f))
            except EOFError:
                return out


@pytest.mark.parametrize("workers", [2, 0])
async def test_on_update_and_on_delete_see_exactly_what_was_written_in_order(workers, dynamodb, tmp_path,
                                                                            monkeypatch):
    name = f"orders-{uuid.uuid4().hex[:8]}"
    arn = make_table(dynamodb.client, name)
    expected = write(dynamodb.client, name)
    shard_id, api_records = stream_records(dynamodb, arn, len(expected))
    records = [dynamodb_record(adapter_change(r)) for r in api_records]
    path = tmp_path / "seen.pickle"
    monkeypatch.setenv("MLDSERVER_TEST_SEEN", str(path))

    async with running(tmp_path, **pooled("RecordChanges", sink=False, workers=workers)) as (server, _, daemon):
        shard = await daemon.shard(shard_id)
        await shard.process_records(records[:4])
        assert daemon.checkpoints[shard_id] == (records[3]["sequenceNumber"], 0)  # the first batch: done
        await shard.process_records(records[4:])
        await shard.shutdown_requested()
        await shard.lease_lost()
        assert await shard.close() == 0

    got = seen(path)
    assert [(e["callback"], e["event_name"]) for e in got] == [(c, n) for c, n, _, _ in expected]
    for entry, (_, _, new, old), api in zip(got, expected, api_records):
        assert same(entry["doc"], new), (entry["doc"], new)
        assert same(entry["old"], old), (entry["old"], old)
        keys = {"pk": (new or old)["pk"], "sk": (new or old)["sk"]}
        assert same(entry["keys"], keys)
        assert entry["event_id"] == api["eventID"]
        assert entry["sequence_number"] == api["dynamodb"]["SequenceNumber"]
        assert entry["creation_time_ms"] == round(api["dynamodb"]["ApproximateCreationDateTime"].timestamp() * 1000)
        assert entry["source"] == "dynamodb" and entry["expired"] is False
    assert daemon.checkpoints[shard_id] == (records[-1]["sequenceNumber"], 0)
