"""A timer store several servers share: one DynamoDB table (``timer_store =
"dynamodb:TABLE"``), through aioboto3. Every server that names the table fires its
timers; each due timer is claimed by one server at a time, with a conditional write,
and a claim whose server died expires and is taken over.

One item per timer, keyed as a timer is named; a global secondary index finds what
is due, by bucket (a hash of the key, so the index's partitions share the load)::

    {"pk": "handlers.orders:remind\\norder-7",            # callback, newline, reference
     "callback": "handlers.orders:remind", "reference": "order-7",
     "due_ms": 1763719260000, "context": b'{"order":7}', "version": 4611686018427387911,
     "attempts": 0, "bucket": 5,
     "claim_owner": "host-a:4242:9f2c", "claim_until": 1763719295000}   # while a server fires it

    index "due": partition key bucket (number), sort key due_ms (number), every attribute

- ``put``: unconditional writes (a replacement is a new version, its claim gone);
  ``delete``: unconditional, ``ReturnValues=ALL_OLD`` says whether there was one;
  ``write`` (a call's creates and cancels): each key's end state, so written;
- ``due``: one Query per bucket (``due_ms <= until``), merged in firing order, without
  the timers another server claims;
- ``claim``: ``SET claim_owner = me, claim_until = now + claim_ms`` if the version is
  the one read and no live claim is there (``claim_until < now``); a server that dies
  with claims leaves them to expire (``claim_ms``: ``execution_timeout`` plus a
  margin), then the others take the timers over;
- ``finish``: delete, reschedule or release, each only if the version is the one fired
  and the claim is still this server's (a take-over or a replacement wins).

The table is created on first use (on-demand capacity) if it does not exist. The
endpoint and credentials come from the usual AWS configuration (``AWS_ENDPOINT_URL_DYNAMODB``
or ``AWS_ENDPOINT_URL`` for a local DynamoDB, ``aws_region`` or ``AWS_REGION``);
servers sharing a table need clocks in step (NTP), as claims are wall-clock times.
``pending`` is the table's item count as DynamoDB reports it (refreshed about every
six hours on AWS, at once on DynamoDB Local).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
import zlib
from typing import Any, Callable, Sequence

from ..base.durable import wall_clock_ms
from ..base.aws import client
from .store import After, Op, Timer, net

BUCKETS = 8
INDEX = "due"
CONCURRENCY = 32  # requests in flight per store
CLAIM_SLACK_MS = 10_000  # a claim outlives the call's time-out by this much
COUNT_EVERY_S = 60.0


def _key(callback: str, reference: str) -> dict[str, Any]:
    return {"pk": {"S": f"{callback}\n{reference}"}}


def _bucket(callback: str, reference: str) -> int:
    return zlib.crc32(f"{callback}\n{reference}".encode()) % BUCKETS


def _item(t: Timer) -> dict[str, Any]:
    return {**_key(t.callback, t.reference), "callback": {"S": t.callback}, "reference": {"S": t.reference},
            "due_ms": {"N": str(t.due_ms)}, "context": {"B": t.context}, "version": {"N": str(t.version)},
            "attempts": {"N": str(t.attempts)}, "bucket": {"N": str(_bucket(t.callback, t.reference))}}


def _timer(item: dict[str, Any]) -> Timer:
    return Timer(item["callback"]["S"], item["reference"]["S"], int(item["due_ms"]["N"]), bytes(item["context"]["B"]),
                 int(item["version"]["N"]), int(item["attempts"]["N"]))


class DynamoStore:
    shared = True

    def __init__(self, table: str, *, region: str | None = None, claim_ms: int = 70_000,
                 clock: Callable[[], float] | None = None) -> None:
        """``clock``: epoch milliseconds (the scheduler's), to tell a live claim."""
        self.table = table
        self.clock = clock or wall_clock_ms
        self.region = region
        self.claim_ms = claim_ms
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pending: int | None = None
        self.client: Any = None
        self._client_cm: Any = None
        self._limit = asyncio.Semaphore(CONCURRENCY)
        self._counted = 0.0

    def __repr__(self) -> str:
        return f"dynamodb:{self.table}"

    # -- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        if self.client is not None:
            return
        self._client_cm = client("dynamodb", self.region, connections=CONCURRENCY)
        self.client = await self._client_cm.__aenter__()
        try:
            await self._ensure_table()
            await self._count(force=True)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._client_cm is not None:
            cm, self._client_cm, self.client = self._client_cm, None, None
            await cm.__aexit__(None, None, None)

    async def _ensure_table(self) -> None:
        c = self.client
        try:
            described = (await c.describe_table(TableName=self.table))["Table"]
        except c.exceptions.ResourceNotFoundException:
            try:
                await c.create_table(
                    TableName=self.table, BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                          {"AttributeName": "bucket", "AttributeType": "N"},
                                          {"AttributeName": "due_ms", "AttributeType": "N"}],
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                    GlobalSecondaryIndexes=[{
                        "IndexName": INDEX, "Projection": {"ProjectionType": "ALL"},
                        "KeySchema": [{"AttributeName": "bucket", "KeyType": "HASH"},
                                      {"AttributeName": "due_ms", "KeyType": "RANGE"}]}])
            except c.exceptions.ResourceInUseException:
                pass  # another server created it meanwhile
            await c.get_waiter("table_exists").wait(TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
            described = (await c.describe_table(TableName=self.table))["Table"]
        indexes = {i["IndexName"] for i in described.get("GlobalSecondaryIndexes") or ()}
        keys = [k["AttributeName"] for k in described["KeySchema"]]
        if keys != ["pk"] or INDEX not in indexes:
            raise ValueError(f"table {self.table} is not a timer table (key {keys}, indexes {sorted(indexes)}): "
                             f"name a table of its own for timers; mldserver creates it")

    async def _count(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._counted >= COUNT_EVERY_S:
            self._counted = now
            self.pending = (await self.client.describe_table(TableName=self.table))["Table"].get("ItemCount")

    async def _call(self, method: str, **kwargs: Any) -> Any:
        async with self._limit:
            return await getattr(self.client, method)(TableName=self.table, **kwargs)

    async def _conditional(self, method: str, **kwargs: Any) -> bool:
        """A conditional write: False if its condition did not hold."""
        try:
            await self._call(method, **kwargs)
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    # -- writes -----------------------------------------------------------------------

    async def write(self, ops: Sequence[Op]) -> list[bool]:
        """Not one transaction (DynamoDB has none this wide): the cancels that only the
        table can answer first, then every key's end state, concurrently."""
        final, answers, asked = net(ops)
        found = iter(await asyncio.gather(*(self.delete(*key) for key in asked)))
        gone = set(asked)
        await asyncio.gather(
            self.put([t for t in final.values() if t is not None]),
            *(self._call("delete_item", Key=_key(*key)) for key, t in final.items() if t is None and key not in gone))
        return [next(found) if a is None else a for a in answers]

    async def put(self, timers: Sequence[Timer]) -> None:
        latest = {t.key: t for t in timers}  # a batch write may not name a key twice: the last one wins
        items = [_item(t) for t in latest.values()]
        await asyncio.gather(*(self._batch_write(items[i : i + 25]) for i in range(0, len(items), 25)))

    async def _batch_write(self, items: list[dict[str, Any]]) -> None:
        requests = {self.table: [{"PutRequest": {"Item": item}} for item in items]}
        attempt = 0
        while requests:
            async with self._limit:
                reply = await self.client.batch_write_item(RequestItems=requests)
            requests = reply.get("UnprocessedItems") or {}
            if requests:
                attempt += 1
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))

    async def delete(self, callback: str, reference: str) -> bool:
        reply = await self._call("delete_item", Key=_key(callback, reference), ReturnValues="ALL_OLD")
        return "Attributes" in reply

    async def claim(self, timers: Sequence[Timer], now_ms: int) -> list[Timer]:
        async def one(t: Timer) -> bool:
            return await self._conditional(
                "update_item", Key=_key(t.callback, t.reference),
                UpdateExpression="SET claim_owner = :me, claim_until = :until",
                ConditionExpression="version = :v AND (attribute_not_exists(claim_until) OR claim_until < :now)",
                ExpressionAttributeValues={":me": {"S": self.owner}, ":until": {"N": str(now_ms + self.claim_ms)},
                                           ":v": {"N": str(t.version)}, ":now": {"N": str(now_ms)}})

        won = await asyncio.gather(*(one(t) for t in timers))
        return [t for t, ok in zip(timers, won) if ok]

    async def finish(self, done: Sequence[Timer], retry: Sequence[Timer], release: Sequence[Timer]) -> None:
        def mine(t: Timer) -> dict[str, Any]:
            return {"ConditionExpression": "version = :v AND claim_owner = :me",
                    "ExpressionAttributeValues": {":v": {"N": str(t.version)}, ":me": {"S": self.owner}}}

        def rescheduled(t: Timer) -> dict[str, Any]:
            condition = mine(t)
            condition["ExpressionAttributeValues"].update({":due": {"N": str(t.due_ms)},
                                                           ":a": {"N": str(t.attempts)}})
            return condition

        await asyncio.gather(
            *(self._conditional("delete_item", Key=_key(t.callback, t.reference), **mine(t)) for t in done),
            *(self._conditional("update_item", Key=_key(t.callback, t.reference),
                                UpdateExpression="SET due_ms = :due, attempts = :a REMOVE claim_owner, claim_until",
                                **rescheduled(t)) for t in retry),
            *(self._conditional("update_item", Key=_key(t.callback, t.reference),
                                UpdateExpression="REMOVE claim_owner, claim_until", **mine(t)) for t in release),
        )

    # -- reads ------------------------------------------------------------------------

    async def due(self, until_ms: int, limit: int, after: After = None) -> list[Timer]:
        low = after if isinstance(after, int) else (after[0] if after is not None else None)
        now = int(self.clock())

        async def bucket(b: int) -> list[Timer]:
            if low is None:
                condition, values = "#b = :b AND due_ms <= :until", {":until": {"N": str(until_ms)}}
            else:
                start = low + 1 if isinstance(after, int) else low
                condition = "#b = :b AND due_ms BETWEEN :low AND :until"
                values = {":low": {"N": str(start)}, ":until": {"N": str(until_ms)}}
            out: list[Timer] = []
            kwargs: dict[str, Any] = {"IndexName": INDEX, "KeyConditionExpression": condition,
                                      "ExpressionAttributeNames": {"#b": "bucket"},
                                      "ExpressionAttributeValues": {":b": {"N": str(b)}, **values},
                                      "Limit": limit}
            while len(out) < limit:
                reply = await self._call("query", **kwargs)
                for item in reply.get("Items", ()):
                    if int(item.get("claim_until", {}).get("N", 0)) >= now and \
                            item.get("claim_owner", {}).get("S") != self.owner:
                        continue  # another server fires it now (or did, and will finish it)
                    out.append(_timer(item))
                if "LastEvaluatedKey" not in reply:
                    break
                kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]
            return out

        rows = [t for part in await asyncio.gather(*(bucket(b) for b in range(BUCKETS))) for t in part]
        if isinstance(after, tuple):
            rows = [t for t in rows if t.order > after]
        rows.sort(key=lambda t: t.order)
        await self._count()
        return rows[:limit]
