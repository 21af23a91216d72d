"""A source's lease: one reader per source, a standby beside it. Servers started with
the same ``--source`` and ``--lease-table`` share one DynamoDB item per source; the
server whose name is in it reads the source, the others wait, and one of them takes
over within about one lease period when the reader dies::

    mldserver serve --handler app:Orders --source dynamodb:orders --lease-table orders-leases   # host a: reads
    mldserver serve --handler app:Orders --source dynamodb:orders --lease-table orders-leases   # host b: waits

One item per source, keyed by the source's text (the timer store's table style: a
string key ``pk``, on-demand capacity, created on first use if absent)::

    {"pk": "dynamodb:orders",
     "owner": "host-a:4242:9f2c1e07",      # this holding's own name (host:pid:random), absent once released
     "counter": 118,                       # +1 on every renewal and every take-over
     "expires_ms": 1769767210000,          # the owner's wall clock at its last renewal + period_ms (for people,
     "period_ms": 10000,                   #   and for --reset-positions); a standby goes by the counter instead
     "positions": "{\\"source\\": \\"dynamodb:orders\\", \\"stream\\": \\"arn:...\\", \\"shards\\": {...}}"}

    async with SourceLease("orders-leases", "dynamodb:orders", period_s=10.0) as lease:
        positions = await lease.acquire(stopping)    # waits (source_lease_waiting) until held, then
                                                     #   source_lease_acquired; the positions JSON (None: none yet)
        keeping = asyncio.create_task(lease.keep())  # renews every period/3; returns once lost (source_lease_lost)
        await lease.write_positions(data)            # only while held: else LeaseLost
        await lease.release()                        # clean shutdown: source_lease_released, the standby takes it

- acquire: an absent item is created (``attribute_not_exists(pk)``); a released one
  (no owner) is taken at once; a held one is taken once its counter has not moved for
  its ``period_ms`` by this server's clock (so clocks need not agree), each take a
  conditional UpdateItem on the counter read, which returns the item as taken: of two
  standbys one wins, and the positions are the latest the last owner wrote.
- keep: ``SET counter = counter + 1`` if ``owner`` is still this holding's name. A
  renewal that fails that condition means another server took the lease: lost, at
  once. One that cannot reach DynamoDB is retried at the next tick; with no renewal
  through for a whole period (counted from when the last good one was sent: a standby
  cannot have taken it before then) the lease is lost too.
- positions: the source's saved positions (``positions.SavedPositions``, the same JSON
  as ``<state-dir>/sources/<source>.json``) live in the lease item, so the standby that
  takes over, on another machine with its own state dir, resumes where the reader
  stopped. Each write is conditional on ``owner`` being this holding's: a server that
  lost the lease can never write over the new owner's positions. An item holds 400 KB:
  some 3,000 shards' positions.
- release: ``REMOVE owner`` (if still ours); the positions stay.

A lost lease stops the source's reading at once (``reader``): its shards get
``leaseLost`` after the action under way, a checkpoint refused meanwhile
(``ShutdownException``, as the KCL answers a zombie), and the server waits for the
lease again. Without ``--lease-table`` none of this runs: the state dir's lock keeps
two servers off one state dir, and so off one source's positions.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from typing import Any, Literal

from ..base.backoff import Backoff
from ..base.logs import EventLogger, get_logger
from ..errors import ConfigError
from .service import OpenClient, describe, service_errors

RETRY = Backoff(first=0.2, cap=5.0)
State = Literal["idle", "waiting", "holding", "lost", "released"]


class LeaseLost(Exception):
    """This server no longer holds the source's lease: it must not read or write it."""


class SourceLease(OpenClient):
    client_service = "dynamodb"

    def __init__(self, table: str, source: str, *, period_s: float = 10.0, region: str | None = None,
                 endpoint_url: str | None = None, log: EventLogger | None = None) -> None:
        self.table = table
        self.source = source
        self.period = period_s
        self.region = region
        self.endpoint_url = endpoint_url
        self.log = log or get_logger("mldserver.sources").bind(source=source)
        self.state: State = "idle"
        self.owner: str | None = None  # this holding's name while held
        self.holder: str | None = None  # who holds it, as last seen (status)
        self.lost = asyncio.Event()
        self._renewed_at = 0.0  # monotonic: when the last renewal that went through was sent

    def __repr__(self) -> str:
        return f"SourceLease({self.table!r}, {self.source!r}, {self.state})"

    async def __aenter__(self) -> "SourceLease":
        await super().__aenter__()
        try:
            await self._ensure_table()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    def status(self) -> dict[str, Any]:
        """What /status shows of it: ``{"table": "orders-leases", "lease": "holding", "holder": "host-a:..."}``."""
        return {"table": self.table, "lease": self.state, "holder": self.holder}

    # -- the table --------------------------------------------------------------------

    async def _ensure_table(self) -> None:
        c = self._client
        try:
            described = (await c.describe_table(TableName=self.table))["Table"]
        except c.exceptions.ResourceNotFoundException:
            try:
                await c.create_table(TableName=self.table, BillingMode="PAY_PER_REQUEST",
                                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                                     KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
            except c.exceptions.ResourceInUseException:
                pass  # another server created it meanwhile
            await c.get_waiter("table_exists").wait(TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
            described = (await c.describe_table(TableName=self.table))["Table"]
        keys = [(k["AttributeName"], k["KeyType"]) for k in described["KeySchema"]]
        if keys != [("pk", "HASH")]:
            raise ConfigError(f"--lease-table {self.table}: not a lease table (its key is {keys}): name a table "
                              f"of its own for leases; mldserver creates it")

    def _key(self) -> dict[str, Any]:
        return {"pk": {"S": self.source}}

    async def read(self) -> dict[str, Any] | None:
        """The lease item as it is now (a consistent read), or None."""
        reply = await self._client.get_item(TableName=self.table, Key=self._key(), ConsistentRead=True)
        return reply.get("Item")

    async def _update(self, **kwargs: Any) -> dict[str, Any] | None:
        """A conditional UpdateItem: the item after it (ReturnValues ALL_NEW), None if
        its condition did not hold."""
        try:
            reply = await self._client.update_item(TableName=self.table, Key=self._key(), ReturnValues="ALL_NEW",
                                                   **kwargs)
        except self._client.exceptions.ConditionalCheckFailedException:
            return None
        return reply.get("Attributes") or {}

    # -- acquire ----------------------------------------------------------------------

    async def acquire(self, stopping: asyncio.Event) -> bytes | None:
        """Wait until this server holds the lease (or ``stopping`` is set: then
        LeaseLost); the positions the item holds (None: none yet)."""
        self.state, self.lost = "waiting", asyncio.Event()
        seen: tuple[int, float] | None = None  # (counter, when first seen at that value)
        failures = 0
        waiting_logged = False
        while not stopping.is_set():
            try:
                item = await self.read()
                owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
                if item is None:
                    taken = await self._create(owner)
                else:
                    counter, now = int(item["counter"]["N"]), time.monotonic()
                    self.holder = item.get("owner", {}).get("S")
                    period = int(item.get("period_ms", {}).get("N", 0)) / 1000
                    if seen is None or seen[0] != counter:
                        seen = (counter, now)
                    taken = None
                    if self.holder is None or now - seen[1] >= max(period, self.period):
                        taken = await self._take(owner, counter)
            except service_errors() as exc:
                if failures == 0:
                    self.log.warning("source_lease_unreachable", table=self.table, error=describe(exc),
                                     what_to_do="retried with backoff; check the lease table's region, "
                                                "credentials and endpoint (AWS_ENDPOINT_URL_DYNAMODB)")
                failures += 1
                await _sleep(stopping, RETRY.delay(failures - 1))
                continue
            failures = 0
            if taken is not None:
                self.owner, self.holder, self.state = owner, owner, "holding"
                self.log.info("source_lease_acquired", table=self.table, owner=owner,
                              counter=int(taken["counter"]["N"]), was=(item or {}).get("owner", {}).get("S"))
                positions = taken.get("positions", {}).get("S")
                return positions.encode() if positions is not None else None
            if not waiting_logged:
                self.log.info("source_lease_waiting", table=self.table, holder=self.holder,
                              period_s=self.period)
                waiting_logged = True
            await _sleep(stopping, self.period / 3)
        self.state = "idle"
        raise LeaseLost("stopped while waiting for the lease")

    async def _create(self, owner: str) -> dict[str, Any] | None:
        item = {**self._key(), **self._holding(owner), "counter": {"N": "1"}}
        try:
            await self._client.put_item(TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(pk)")
        except self._client.exceptions.ConditionalCheckFailedException:
            return None
        self._renewed_at = time.monotonic()
        return item

    async def _take(self, owner: str, counter: int) -> dict[str, Any] | None:
        sent = time.monotonic()
        values = {f":{k}": v for k, v in self._holding(owner).items()}
        taken = await self._update(
            UpdateExpression="SET #o = :owner, expires_ms = :expires_ms, period_ms = :period_ms, "
                             "#c = #c + :one",
            ConditionExpression="#c = :seen",
            ExpressionAttributeNames={"#o": "owner", "#c": "counter"},
            ExpressionAttributeValues={**values, ":one": {"N": "1"}, ":seen": {"N": str(counter)}})
        if taken is not None:
            self._renewed_at = sent
        return taken

    def _holding(self, owner: str) -> dict[str, Any]:
        return {"owner": {"S": owner}, "expires_ms": {"N": str(int((time.time() + self.period) * 1000))},
                "period_ms": {"N": str(int(self.period * 1000))}}

    # -- hold -------------------------------------------------------------------------

    async def keep(self) -> None:
        """Renew every period/3 while held; return once the lease is lost (logged
        ``source_lease_lost``). Cancelled at release."""
        failures = 0
        while self.state == "holding":
            try:
                await _within(self.lost.wait(), self.period / 3)
                return  # a positions write found it taken
            except asyncio.TimeoutError:
                pass
            left = self._renewed_at + self.period - time.monotonic()
            sent = time.monotonic()
            try:
                renewed = await _within(self._renew(), max(left, 0.001))
            except asyncio.TimeoutError:
                self._lose("not renewed within the lease period: DynamoDB did not answer in time")
                return
            except service_errors() as exc:
                if time.monotonic() >= self._renewed_at + self.period:
                    self._lose(f"not renewed within the lease period ({describe(exc)})")
                    return
                if failures == 0:
                    self.log.warning("source_lease_renew_failed", table=self.table, error=describe(exc),
                                     what_to_do="retried at the next renewal; past the lease period the lease "
                                                "counts as lost and reading stops")
                failures += 1
                continue
            if renewed is None:
                await self._taken_by_another()
                return
            failures = 0
            self._renewed_at = sent

    async def _renew(self) -> dict[str, Any] | None:
        return await self._update(
            UpdateExpression="SET #c = #c + :one, expires_ms = :expires_ms",
            ConditionExpression="#o = :me",
            ExpressionAttributeNames={"#o": "owner", "#c": "counter"},
            ExpressionAttributeValues={":one": {"N": "1"}, ":me": {"S": self.owner},
                                       ":expires_ms": {"N": str(int((time.time() + self.period) * 1000))}})

    async def _taken_by_another(self) -> None:
        try:
            item = await self.read()
            self.holder = (item or {}).get("owner", {}).get("S")
        except service_errors():
            self.holder = None
        self._lose(f"taken by another server ({self.holder})")

    def _lose(self, reason: str) -> None:
        if self.state != "holding":
            return
        self.state = "lost"
        self.lost.set()
        self.log.warning("source_lease_lost", table=self.table, owner=self.owner, reason=reason,
                         what_to_do="this server stopped reading the source (its shards get leaseLost) and waits "
                                    "for the lease again; another server reads it from the saved positions")

    async def write_positions(self, data: bytes) -> None:
        """Store the source's positions (the JSON document) in the lease item, if the
        lease is still ours (else LeaseLost); DynamoDB unreachable is waited out, as
        long as the lease lasts."""
        failures = 0
        while True:
            if self.state != "holding":
                raise LeaseLost(f"the lease of {self.source} is {self.state}")
            try:
                written = await self._update(
                    UpdateExpression="SET positions = :p", ConditionExpression="#o = :me",
                    ExpressionAttributeNames={"#o": "owner"},
                    ExpressionAttributeValues={":p": {"S": data.decode()}, ":me": {"S": self.owner}})
            except service_errors() as exc:
                if failures == 0:
                    self.log.warning("source_positions_write_failed", table=self.table, error=describe(exc),
                                     what_to_do="retried with backoff while the lease lasts; the checkpoint's "
                                                "reply waits for it")
                failures += 1
                await _sleep(self.lost, RETRY.delay(failures - 1))
                continue
            if written is None:
                await self._taken_by_another()
                raise LeaseLost(f"the lease of {self.source} was taken by {self.holder}")
            return

    async def release(self) -> None:
        """Let the lease go (clean shutdown): the standby takes it at its next look."""
        if self.state != "holding":
            return
        self.state = "released"
        try:
            released = await self._update(
                UpdateExpression="REMOVE #o SET expires_ms = :now", ConditionExpression="#o = :me",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":me": {"S": self.owner}, ":now": {"N": str(int(time.time() * 1000))}})
        except service_errors() as exc:
            self.log.warning("source_lease_release_failed", table=self.table, error=describe(exc),
                             what_to_do="a standby takes the lease over once it expires (one lease period)")
            return
        if released is not None:
            self.holder = None
            self.log.info("source_lease_released", table=self.table, owner=self.owner)

    # -- --reset-positions ------------------------------------------------------------

    async def reset_positions(self) -> bool:
        """Delete the positions kept in the lease item, unless a live server holds it
        (a ConfigError then); True if there were some."""
        now_ms = int(time.time() * 1000)
        try:
            done = await self._update(
                UpdateExpression="REMOVE positions",
                ConditionExpression="attribute_exists(positions) AND "
                                    "(attribute_not_exists(#o) OR expires_ms < :now)",
                ExpressionAttributeNames={"#o": "owner"}, ExpressionAttributeValues={":now": {"N": str(now_ms)}})
        except service_errors() as exc:
            raise ConfigError(f"--reset-positions: cannot reach the lease table {self.table} ({describe(exc)}): "
                              f"check its region, credentials and endpoint") from None
        if done is not None:
            return True
        item = await self.read()
        if item is None or "positions" not in item:
            return False
        raise ConfigError(f"--reset-positions: {self.source} is read by {item['owner']['S']} (its lease in "
                          f"{self.table} is live): stop that server first, or reset once its lease expires")


async def _sleep(stopping: asyncio.Event, seconds: float) -> None:
    try:
        await _within(stopping.wait(), seconds)
    except asyncio.TimeoutError:
        pass


async def _within(aw: Any, seconds: float) -> Any:
    """``aw``'s result if it completes within ``seconds``, else TimeoutError (``aw``
    cancelled). Not ``asyncio.wait_for``: on Python 3.11 a cancellation that arrives as
    its timeout fires can be swallowed, and a renewal loop cancelled then (``keep`` at
    release) went on renewing, its canceller waiting for ever."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait([task], timeout=seconds)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise asyncio.TimeoutError
    return task.result()
