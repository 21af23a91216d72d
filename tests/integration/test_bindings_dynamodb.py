"""Table bindings against DynamoDB Local (started here, on loopback): get, put, update
and delete with exact numbers, sets and binary; and the example handler
(``handlers.order_tracker``) fed the orders table's real stream records through the
fake daemon, in handler processes and in the server's loop: its binding writes reach
the customers table, an unpaid order's expiry timer is created and a paid order's
cancelled, and the expiry marks an unpaid order expired (and leaves a paid one)."""

from __future__ import annotations

import sqlite3
import uuid
from decimal import Decimal

import pytest
from boto3.dynamodb.types import TypeSerializer

from mldserver.api import bindings
from mldserver.api.bindings import Bindings
from mldserver.base.config import Settings
from mldserver.api.dynamodb_json import decode_item
from mldserver.examples.order_tracker import expire
from mldserver.api.testing import adapter_change, dynamodb_record

from ..harness import running
from .test_dynamodb_changes import BIG, same, stream_records




def make_table(client, name: str, key: str, stream: bool = False) -> str | None:
    extra = {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}} if stream else {}
    made = client.create_table(TableName=name, KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                               AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                               BillingMode="PAY_PER_REQUEST", **extra)
    return made["TableDescription"].get("LatestStreamArn")


ITEM = {"id": "c-7", "big": BIG, "neg": -BIG, "price": Decimal("1234567890123456789012345678901234567.8"),
        "tiny": Decimal("0.000000000000000000000000000000000000001"), "n": 3, "tags": {"gold", "new"},
        "sizes": {1, Decimal("2.5"), BIG}, "blobs": {b"\x00\x01", b"\xff"}, "raw": b"\x00raw\xff", "ok": True,
        "none": None, "lines": [{"sku": "x", "qty": 2, "deep": {"l": [b"3", Decimal("4.25")]}}]}


async def test_get_put_update_delete_round_trip_exact_values(aws):
    name = f"customers-{uuid.uuid4().hex[:8]}"
    make_table(aws.client, name, "id")
    b = Bindings(Settings(bindings={"c": {"table": name, "access": "read_write"}, "r": {"table": name}}))
    c = b.table("c")
    try:
        assert await c.get({"id": "c-7"}) is None
        await c.put(ITEM)
        assert same(await b.table("r").get({"id": "c-7"}, consistent=True), ITEM)  # read through the read-only one
        after = await c.update({"id": "c-7"}, set={"price": Decimal("-0.01"), "raw": b"\xfe"},
                               add={"n": 2, "tags": {"late"}, "count": BIG}, remove=["none", "ok"])
        expected = {**ITEM, "price": Decimal("-0.01"), "raw": b"\xfe", "n": 5, "tags": {"gold", "new", "late"},
                    "count": BIG}
        del expected["none"], expected["ok"]
        assert same(after, expected)
        assert same(await c.get({"id": "c-7"}, consistent=True), expected)
        assert same(await c.delete({"id": "c-7"}), expected)
        assert await c.delete({"id": "c-7"}) is None
        assert await c.get({"id": "c-7"}, consistent=True) is None
    finally:
        await b.close()
    assert b._client is None


TRACKER = "handlers.order_tracker:OrderTracker"
EXPIRE = "mldserver.examples.order_tracker:expire"  # the timers' callback, by name


@pytest.mark.parametrize("workers", [2, 0])
async def test_the_example_handlers_binding_writes_reach_the_second_table(workers, aws, tmp_path):
    orders, customers = f"orders-{uuid.uuid4().hex[:8]}", f"customers-{uuid.uuid4().hex[:8]}"
    arn = make_table(aws.client, orders, "order_id", stream=True)
    make_table(aws.client, customers, "customer")
    ser = TypeSerializer()
    put = lambda **o: aws.client.put_item(TableName=orders, Item={k: ser.serialize(v) for k, v in o.items()})  # noqa: E731
    put(order_id="o-1", customer="c-7", amount=Decimal("12.50"), status="new")
    put(order_id="o-2", customer="c-7", amount=3, status="paid")
    put(order_id="o-3", customer="c-8", amount=Decimal("1.25"), status="new")
    aws.client.update_item(TableName=orders, Key={"order_id": {"S": "o-1"}}, UpdateExpression="SET #s = :s",
                           ExpressionAttributeNames={"#s": "status"}, ExpressionAttributeValues={":s": {"S": "paid"}})
    shard_id, api_records = stream_records(aws, arn, 4)
    records = [dynamodb_record(adapter_change(r)) for r in api_records]

    config = {"customers": {"table": customers, "access": "read_write"},
              "orders": {"table": orders, "access": "read_write", "allow_recursion": True}}
    async with running(tmp_path, TRACKER, workers=workers, stream=arn, bindings=config) as (server, _, daemon):
        shard = await daemon.shard(shard_id)
        await shard.process_records(records[:3])
        db = sqlite3.connect(tmp_path / "state" / "timers" / "timers.db")
        pending = lambda: {r for (r,) in db.execute("SELECT reference FROM timers WHERE callback = ?", (EXPIRE,))}  # noqa: E731
        assert pending() == {"o-1", "o-3"}  # unpaid: an expiry each; o-2 came paid
        await shard.process_records(records[3:])  # o-1 paid: its timer cancelled
        assert pending() == {"o-3"}
        await shard.shutdown_requested()
        await shard.lease_lost()
        assert await shard.close() == 0
        assert daemon.checkpoints[shard_id] == (records[-1]["sequenceNumber"], 0)
        db.close()

    scan = aws.client.scan(TableName=customers, ConsistentRead=True)["Items"]
    got = {i["customer"]: i for i in (decode_item(x) for x in scan)}
    assert same(got, {
        "c-7": {"customer": "c-7", "orders": 2, "total": Decimal("15.5"), "paid": 2, "paid_total": Decimal("15.5"),
                "last_order": "o-2"},
        "c-8": {"customer": "c-8", "orders": 1, "total": Decimal("1.25"), "last_order": "o-3"},
    }), got

    # The expiry, as a timer fires it (bindings.table in a callback): o-3 expired, paid o-1 left alone.
    b = Bindings(Settings(bindings=config))
    token = bindings.current.set(b)
    try:
        await expire({"order_id": "o-3"})
        await expire({"order_id": "o-1"})
        assert (await b.table("orders").get({"order_id": "o-3"}, consistent=True))["status"] == "expired"
        assert (await b.table("orders").get({"order_id": "o-1"}, consistent=True))["status"] == "paid"
    finally:
        bindings.current.reset(token)
        await b.close()
