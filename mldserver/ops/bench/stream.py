"""``mldserver bench --part stream``: ``mldserver.open_stream`` against its peer, Bloop's
Stream (``engine.stream(Model, "trim_horizon")``), reading the same DynamoDB changes,
in one run, on DynamoDB Local.

A table ``orders`` with a NEW_AND_OLD_IMAGES stream gets ``CHANGES`` changes (3,000;
1,000 with ``--quick``): items put (INSERT), put again (MODIFY) and deleted (REMOVE), of
strings, numbers, sets, lists and maps (no binary or null value: Bloop 3.1.1 reads
neither from a stream). Each side reads the whole stream from its trim horizon to its
head and takes every change's new and old images as Python values (``change.doc`` and
``change.old``; Bloop's ``record["new"]`` and ``["old"]``, model instances), three
rounds each, taking turns. Reported: the median round's CPU a
change (from opening the stream, its clients made, to the last change; the process's
user and system time) and its wall time; beside them the floor, the same changes'
pages parsed by orjson and their images decoded in one loop, no call made.

Bloop pins botocore below 1.35, and aiobotocore (the server's) a newer one, so Bloop
lives in its own folder (``scripts/setup --test``: ``.deps/bloop``; ``MLDSERVER_DEPS``
elsewhere) and its side runs in a process of its own (``bloop_side.py``)::

    reader                                changes  CPU us/change   wall s
    mldserver.open_stream                   3,000             98     0.49
    Bloop's Stream (bloop 3.1.1)            3,000            299     1.05
    floor (orjson, images decoded)          3,000             30
    open_stream against Bloop: 0.33x CPU per change
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from ..emulators import AWS, DynamoDBLocal, deps_dir

CHANGES, ROUNDS, TABLE = 3_000, 3, "orders"
BLOOP = "bloop==3.1.1"  # the version scripts/setup --test installs into .deps/bloop


def bloop_dir() -> Path:
    return deps_dir() / "bloop"


def item(i: int, version: int) -> dict[str, Any]:
    return {"id": {"S": f"order-{i:06d}"}, "customer": {"S": f"customer-{i % 97}"}, "amount": {"N": f"{i * 1.25 + version}"},
            "version": {"N": str(version)}, "note": {"S": "x" * 40},
            "tags": {"SS": ["a", f"t{i % 7}"]}, "lines": {"L": [{"S": "sku-1"}, {"N": "2"}, {"BOOL": True}]},
            "address": {"M": {"city": {"S": "Paris"}, "zip": {"N": "75001"}, "po": {"BOOL": False}}}}


async def fill(endpoint: str, changes: int) -> None:
    """``changes`` changes: 3/5 inserts, then 1/5 modifies and 1/5 removes of them."""
    from ...base.aws import client

    inserts = changes * 3 // 5
    modifies = changes // 5
    removes = changes - inserts - modifies
    async with client("dynamodb", AWS["region_name"], endpoint_url=endpoint) as dynamodb:
        await dynamodb.create_table(
            TableName=TABLE, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"})
        calls = ([dynamodb.put_item(TableName=TABLE, Item=item(i, 1)) for i in range(inserts)]
                 + [dynamodb.put_item(TableName=TABLE, Item=item(i, 2)) for i in range(modifies)]
                 + [dynamodb.delete_item(TableName=TABLE, Key={"id": {"S": f"order-{i:06d}"}})
                    for i in range(inserts - removes, inserts)])
        for start in range(0, len(calls), 32):  # in order, 32 at a time (one item each: no two race)
            await asyncio.gather(*calls[start:start + 32])


async def open_stream_round(endpoint: str) -> tuple[int, float, float]:
    """(changes, CPU us a change, wall s) of one read of the whole stream."""
    from ...sources.stream import open_stream

    wall, cpu = time.perf_counter(), time.process_time()
    changes = 0
    async with open_stream(f"dynamodb:{TABLE}", endpoint_url=endpoint) as stream:
        async for change in stream:
            change.doc, change.old
            changes += 1
    return changes, (time.process_time() - cpu) / max(changes, 1) * 1e6, time.perf_counter() - wall


def bloop_round(endpoint: str) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("bloop_side.py")), endpoint, TABLE],
                         env=dict(os.environ, PYTHONPATH=str(bloop_dir())), capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"Bloop's side failed (rc {out.returncode}): {out.stderr.strip()[-2000:]}")
    answer = orjson.loads(out.stdout.strip().splitlines()[-1])
    return answer["changes"], answer["cpu_us"], answer["wall_s"]


async def floor(endpoint: str) -> tuple[int, float]:
    """(changes, CPU us a change) with no call: the stream's pages, read once as they are sent,
    parsed by orjson and every change's images decoded (``api.dynamodb_json``)."""
    from ...api.dynamodb_json import decode_item
    from ...base.aws import client

    bodies: list[bytes] = []

    def keep(response_dict: dict[str, Any], **_: Any) -> None:
        bodies.append(bytes(response_dict["body"]))

    async with client("dynamodbstreams", AWS["region_name"], endpoint_url=endpoint) as streams:
        streams.meta.events.register_first("before-parse.dynamodb-streams.GetRecords", keep)
        arn = (await streams.list_streams())["Streams"][0]["StreamArn"]
        for shard in (await streams.describe_stream(StreamArn=arn))["StreamDescription"]["Shards"]:
            it = (await streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                                   ShardIteratorType="TRIM_HORIZON"))["ShardIterator"]
            empties = 0
            while it and empties < 3:  # (as open_stream: DynamoDB may answer empty before a shard's head)
                page = await streams.get_records(ShardIterator=it)
                empties = 0 if page.get("Records") else empties + 1
                it = page.get("NextShardIterator")
    changes = 0
    cpu = time.process_time()
    for body in bodies:
        for record in orjson.loads(body).get("Records") or ():
            images = record.get("dynamodb") or {}
            for key in ("NewImage", "OldImage"):
                if images.get(key):
                    decode_item(images[key], key)
            changes += 1
    return changes, (time.process_time() - cpu) / max(changes, 1) * 1e6


async def run(args: Any, tmp: str) -> None:
    changes = 1_000 if args.quick else CHANGES
    if not (bloop_dir() / "bloop" / "__init__.py").exists():
        print(f"stream: Bloop is not installed in {bloop_dir()}: scripts/setup --test installs it "
              f"(pip install --target {bloop_dir()} {BLOOP})")
        return
    os.environ.setdefault("AWS_ACCESS_KEY_ID", AWS["aws_access_key_id"])
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", AWS["aws_secret_access_key"])
    os.environ.setdefault("AWS_REGION", AWS["region_name"])
    print(f"\nstream: {changes:,} DynamoDB changes (inserts, modifies, removes) read from the trim horizon, "
          f"new and old images decoded, by mldserver.open_stream and by Bloop's Stream ({BLOOP}), "
          f"{ROUNDS} rounds each taking turns (DynamoDB Local)")
    dynamodb = DynamoDBLocal(Path(tmp))
    try:
        await fill(dynamodb.endpoint, changes)
        ours, bloops = [], []
        for _ in range(ROUNDS):
            ours.append(await open_stream_round(dynamodb.endpoint))
            bloops.append(await asyncio.to_thread(bloop_round, dynamodb.endpoint))
        parsed, least = await floor(dynamodb.endpoint)
    finally:
        dynamodb.terminate()
    print(f"  {'reader':<36}{'changes':>9}{'CPU us/change':>15}{'wall s':>9}")
    rows = []
    for name, rounds in (("mldserver.open_stream", ours), (f"Bloop's Stream ({BLOOP.replace('==', ' ')})", bloops)):
        read = {n for n, _, _ in rounds}
        if read != {changes}:
            raise RuntimeError(f"{name} read {sorted(read)} changes, not the {changes} made")
        cpu = statistics.median(c for _, c, _ in rounds)
        wall = statistics.median(w for _, _, w in rounds)
        rows.append(cpu)
        print(f"  {name:<36}{changes:>9,}{cpu:>15,.0f}{wall:>9.2f}")
    print(f"  {'floor (orjson, images decoded)':<36}{parsed:>9,}{least:>15,.0f}")
    print(f"  open_stream against Bloop: {rows[0] / rows[1]:.2f}x CPU per change")
