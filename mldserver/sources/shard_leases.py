"""A source's shards spread over the servers that share a ``--lease-table``: one lease
per shard, taken when free or expired, balanced as servers come and go (``balance``),
handed over at a clean stop; each shard's position kept in its own lease item::

    mldserver serve --handler app:Clicks --source kinesis:clicks --lease-table clicks-leases   # host a
    mldserver serve --handler app:Clicks --source kinesis:clicks --lease-table clicks-leases   # host b
    # a 4-shard stream: each reads two; a third server joins: 2, 1, 1; one dies: the others
    # take its shards over after about one lease period, from the positions it stored

One item per shard, modelled on the KCL's lease table (the key ``pk`` is the source and
the shard id, so that one table serves several sources; on-demand capacity, created on
first use if absent)::

    {"pk": "kinesis:clicks/shardId-000000000001",
     "source": "kinesis:clicks", "leaseKey": "shardId-000000000001",
     "leaseOwner": "host-a:4242:9f2c1e07",    # absent while free (released, or never held)
     "leaseCounter": 118,                     # +1 on every renewal, take and steal
     "checkpoint": "49590338271490256608559692538361571095921575989136588898",   # or SHARD_END; absent: none yet
     "checkpointSubSequenceNumber": 0,
     "parentShardId": ["shardId-000000000000"],   # (a string set; absent for a first shard)
     "ownerSwitchesSinceCheckpoint": 1,
     "stream": "arn:aws:kinesis:us-east-1:123456789012:stream/clicks", "created": 1769767200000,
     "expires_ms": 1769767210000, "period_ms": 10000}   # for people and --reset-positions

    leases = ShardLeases("clicks-leases", "kinesis:clicks", period_s=10.0, on_lost=stop_shard, on_change=wake)
    async with leases:
        await leases.bind(arn, created)           # the stream read; the checkpoints of another stream are none
        leases.offer(shards)                      # each listing: the shards that exist, with their parents
        running = asyncio.create_task(leases.run(stopping))   # a cycle every period/3: renew, take, steal
        leases.holds("shardId-000000000001")      # read it only while True
        await leases.store("shardId-000000000001", position)  # conditional on holding it: else LeaseNotHeld
        await leases.release_all()                # clean stop: source_shard_lease_released, peers take them at once

- a cycle reads every item of the source (a consistent Scan), renews those held here
  (``leaseCounter + 1`` if ``leaseOwner`` is still this server's name; else the lease was
  stolen: ``on_lost``, at once), creates the items of new shards, then takes and steals
  as ``balance.plan`` says, each a conditional update on the counter read (of two takers,
  one wins). A lease whose counter has not moved for its period, by this server's
  clock, is expired (its owner is dead or cut off). A held lease not renewed for a whole
  period (DynamoDB unreachable) counts as lost too: its owner stops reading it before
  any peer can have taken it;
- only shards that may be read count: listed, not read to their end, and each parent
  read to its end (``SHARD_END`` stored, by whichever server read it) or gone from the
  stream: a child is not leased anywhere before its parents end;
- a shard read to its end stores ``SHARD_END`` and lets its lease go in one write;
- ``store`` writes a shard's position only while ``leaseOwner`` is this server's name
  (``ownerSwitchesSinceCheckpoint`` back to 0): a server that lost the lease cannot write
  over the new owner's position;
- an item made by the earlier one-lease-per-source layout (``pk`` the source alone, its
  ``positions`` document) is read once: the shards it names start from its positions
  when their own items are first made; it is left as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import uuid
from typing import Any, Callable, Iterable, NamedTuple

from ..base.backoff import Backoff
from ..base.durable import wall_clock_ms
from ..base.logs import EventLogger, get_logger
from ..base.positions import Position
from ..errors import ConfigError
from .balance import plan
from .positions import SHARD_END, Saved
from .service import ListedShard, OpenClient, describe, service_errors

RETRY = Backoff(first=0.2, cap=5.0)


class LeaseNotHeld(Exception):
    """This server no longer holds the shard's lease: it must not read it or write its position."""


class Lease(NamedTuple):
    """A shard's lease item as last read."""
    owner: str | None
    counter: int
    checkpoint: Saved | None  # None: no position yet (or another stream's)
    parents: tuple[str, ...]


class ShardLeases(OpenClient):
    client_service = "dynamodb"

    def __init__(self, table: str, source: str, *, period_s: float = 10.0, region: str | None = None,
                 endpoint_url: str | None = None, log: EventLogger | None = None,
                 on_lost: Callable[[str], None] = lambda shard_id: None,
                 on_change: Callable[[], None] = lambda: None, max_steal: int = 1) -> None:
        self.table = table
        self.source = source
        self.period = period_s
        self.region = region
        self.endpoint_url = endpoint_url
        self.log = log or get_logger("mldserver.sources").bind(source=source)
        self.on_lost = on_lost
        self.on_change = on_change
        self.max_steal = max_steal
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stream: str | None = None
        self.created: int | None = None
        self.leases: dict[str, Lease] = {}  # every shard's item, as last read
        self.listed: dict[str, ListedShard] = {}  # the stream's shards, as last listed
        self.held: dict[str, float] = {}  # shard id -> monotonic time the last renewal that went through was sent
        self.servers = 1  # live servers, as last counted
        self._seen: dict[str, tuple[int, float]] = {}  # shard id -> (counter, monotonic time first seen at it)
        self._ended: set[str] = set()  # SHARD_END stored here (before the next read shows it)
        self._migrated: dict[str, Saved] = {}  # the old per-source item's positions
        self._poke = asyncio.Event()
        self._streams: dict[str, str | None] = {}  # each item's stream, as last read
        self.draining = False  # the server stops: leases renewed, none taken

    def __repr__(self) -> str:
        return f"ShardLeases({self.table!r}, {self.source!r}, held={sorted(self.held)})"

    async def __aenter__(self) -> "ShardLeases":
        await super().__aenter__()
        try:
            await ensure_table(self._client, self.table)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    def status(self) -> dict[str, Any]:
        """What /status shows::

            {"table": "clicks-leases", "owner": "host-a:...", "held": ["shardId-000000000001"],
             "shards": 4, "servers": 2}

        (``shards``: those that may be read now; ``servers``: this one and those holding a
        live lease of them)."""
        return {"table": self.table, "owner": self.owner, "held": sorted(self.held),
                "shards": len(self._ready()), "servers": self.servers}

    # -- what the reader asks ---------------------------------------------------------

    async def bind(self, stream: str, created: int | None) -> None:
        """The stream read (checkpoints kept for another stream, one deleted and made
        again, count as none); the items read, and the old per-source item's positions."""
        self.stream, self.created = stream, created
        old = (await self._client.get_item(TableName=self.table, Key={"pk": {"S": self.source}},
                                           ConsistentRead=True)).get("Item")
        if old is not None and "positions" in old:
            doc = json.loads(old["positions"]["S"])
            if doc.get("stream") == stream and doc.get("created") == created:
                self._migrated = {k: v if v == SHARD_END else Position.from_json(v) for k, v in doc["shards"].items()}
        await self._read()

    def offer(self, shards: Iterable[ListedShard]) -> None:
        """The stream's shards as just listed (the next cycle makes their items)."""
        self.listed = {s.shard_id: s for s in shards}
        self._poke.set()

    def holds(self, shard_id: str) -> bool:
        return shard_id in self.held

    def get(self, shard_id: str) -> Saved | None:
        lease = self.leases.get(shard_id)
        return SHARD_END if shard_id in self._ended else (lease.checkpoint if lease is not None else None)

    def ended(self, shard_id: str) -> bool:
        """Is the shard read to its end (``SHARD_END`` stored, here or by another server)?"""
        return self.get(shard_id) == SHARD_END

    def shard_ids(self) -> list[str]:
        """The shards with a position kept (by any server)."""
        return sorted(s for s in {*self.leases, *self._ended} if self.get(s) is not None)

    def checkpointed(self) -> int:
        return len(self.shard_ids())

    async def store(self, shard_id: str, saved: Saved) -> None:
        """Keep ``saved`` as the shard's position, if its lease is still held here (else
        LeaseNotHeld); ``SHARD_END`` lets the lease go in the same write. DynamoDB
        unreachable is waited out as long as the lease lasts."""
        ended = saved == SHARD_END
        text, sub = _checkpoint(saved)
        values: dict[str, Any] = {":me": {"S": self.owner}, ":zero": {"N": "0"}, ":cp": {"S": text},
                                  ":sub": {"N": str(sub)}}
        update = "SET #checkpoint = :cp, #checkpointSubSequenceNumber = :sub, #ownerSwitchesSinceCheckpoint = :zero"
        if ended:
            update += " REMOVE #leaseOwner"
        failures = 0
        while True:
            if shard_id not in self.held:
                raise LeaseNotHeld(f"the lease of {shard_id} is not held here")
            try:
                done = await self._update(shard_id, UpdateExpression=update,
                                          ConditionExpression="#leaseOwner = :me", ExpressionAttributeValues=values)
            except service_errors() as exc:
                if failures == 0:
                    self.log.warning("source_positions_write_failed", table=self.table, shard_id=shard_id,
                                     error=describe(exc), what_to_do="retried with backoff while the lease lasts; "
                                                                     "the checkpoint's reply waits for it")
                failures += 1
                await asyncio.sleep(RETRY.delay(failures - 1))
                continue
            if done is None:
                self._lose(shard_id, "taken by another server")
                raise LeaseNotHeld(f"the lease of {shard_id} was taken by another server")
            self.leases[shard_id] = _lease(done, self.stream, self.created)
            if ended:
                self._ended.add(shard_id)
                self.held.pop(shard_id, None)
                self._poke.set()  # its children may be leased now
            return

    async def release_all(self) -> None:
        """Let every lease held here go (a clean stop, the shards' positions stored):
        peers take them at their next cycle."""
        released = []
        for shard_id in sorted(self.held):
            try:
                done = await self._update(shard_id, UpdateExpression="REMOVE #leaseOwner SET #expires_ms = :now",
                                          ConditionExpression="#leaseOwner = :me",
                                          ExpressionAttributeValues={":me": {"S": self.owner},
                                                                     ":now": {"N": str(wall_clock_ms())}})
            except service_errors() as exc:
                self.log.warning("source_lease_release_failed", table=self.table, shard_id=shard_id,
                                 error=describe(exc), what_to_do="a peer takes the lease over once it expires "
                                                                 "(one lease period)")
                continue
            if done is not None:
                released.append(shard_id)
        self.held.clear()
        if released:
            self.log.info("source_shard_lease_released", table=self.table, owner=self.owner, shards=released,
                          count=len(released))

    # -- the cycle --------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        """A cycle every period/3 (sooner when a shard ends or the listing changes)
        until ``stopping``; DynamoDB unreachable is logged once and retried."""
        failures = 0
        while not stopping.is_set():
            self._poke.clear()
            try:
                await self.cycle()
                failures = 0
            except service_errors() as exc:
                if failures == 0:
                    self.log.warning("source_lease_unreachable", table=self.table, error=describe(exc),
                                     what_to_do="retried; check the lease table's region, credentials and "
                                                "endpoint (AWS_ENDPOINT_URL_DYNAMODB); a lease not renewed "
                                                "for a period is lost and its shard stops")
                failures += 1
            self._expire_unrenewed()
            waits = [asyncio.ensure_future(e.wait()) for e in (stopping, self._poke)]
            await asyncio.wait(waits, timeout=self.period / 3, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    async def cycle(self) -> None:
        """One look: read, renew, make new items, take and steal."""
        await self._read()
        for shard_id in sorted(self.held):
            sent = time.monotonic()
            lease = self.leases.get(shard_id)
            if lease is None or lease.owner != self.owner:
                self._lose(shard_id, f"taken by {lease.owner if lease else None}")
                continue
            renewed = await self._update(shard_id, UpdateExpression="SET #leaseCounter = #leaseCounter + :one, "
                                                                    "#expires_ms = :exp",
                                         ConditionExpression="#leaseOwner = :me",
                                         ExpressionAttributeValues={":one": {"N": "1"}, ":me": {"S": self.owner},
                                                                    ":exp": {"N": self._expires()}})
            if renewed is None:
                self._lose(shard_id, "taken by another server")
            elif shard_id in self.held:
                self.held[shard_id] = sent
                self.leases[shard_id] = _lease(renewed, self.stream, self.created)
        if self.draining:
            return
        for shard in self.listed.values():
            if shard.shard_id not in self.leases:
                await self._create(shard)
        ready = self._ready()
        now = time.monotonic()
        expired = {s for s in ready if s not in self.held and now - self._seen[s][1] >= self.period}
        owners = {s: self.leases[s].owner for s in ready}
        self.servers = len({o for s, o in owners.items() if o is not None and s not in expired} | {self.owner})
        wanted = plan(owners, self.owner, expired, max_steal=self.max_steal)
        taken, stolen = [], []
        for shard_id in (*wanted.take, *wanted.steal):
            lease = self.leases[shard_id]
            got = await self._take(shard_id, lease)
            if got is not None:
                (stolen if shard_id in wanted.steal else taken).append((shard_id, lease.owner))
        if taken or stolen:
            self.log.info("source_shard_lease_taken", table=self.table, owner=self.owner,
                          shards=[s for s, _ in taken + stolen], stolen=[s for s, _ in stolen],
                          was=sorted({o for _, o in taken + stolen if o is not None}),
                          held=len(self.held), servers=self.servers, target=-(-len(ready) // self.servers))
            self.on_change()

    def _ready(self) -> list[str]:
        """The shards that may be read now: listed, leased, not ended, parents ended or gone."""
        return sorted(s for s, info in self.listed.items()
                      if s in self.leases and not self.ended(s)
                      and all(p not in self.listed or self.ended(p) for p in info.parents))

    def _expire_unrenewed(self) -> None:
        now = time.monotonic()
        for shard_id, renewed in list(self.held.items()):
            if now - renewed >= self.period:
                self._lose(shard_id, "not renewed within the lease period")

    def _lose(self, shard_id: str, reason: str) -> None:
        if self.held.pop(shard_id, None) is None:
            return
        self.log.warning("source_shard_lease_lost", table=self.table, shard_id=shard_id, owner=self.owner,
                         reason=reason, held=len(self.held),
                         what_to_do="this server stopped reading the shard (its handler gets leaseLost); the "
                                    "server holding it now reads on from the stored position")
        self.on_lost(shard_id)

    def _expires(self) -> str:
        return str(int((time.time() + self.period) * 1000))

    # -- the table --------------------------------------------------------------------

    def _key(self, shard_id: str) -> dict[str, Any]:
        return {"pk": {"S": f"{self.source}/{shard_id}"}}

    async def _read(self) -> None:
        """Every item of the source, as it is now."""
        items, start = [], None
        while True:
            more = {"ExclusiveStartKey": start} if start else {}
            reply = await self._client.scan(TableName=self.table, ConsistentRead=True,
                                            FilterExpression="#source = :source",
                                            ExpressionAttributeNames={"#source": "source"},
                                            ExpressionAttributeValues={":source": {"S": self.source}}, **more)
            items += reply.get("Items", [])
            start = reply.get("LastEvaluatedKey")
            if not start:
                break
        now = time.monotonic()
        self.leases = {}
        for item in items:
            shard_id = item["leaseKey"]["S"]
            lease = self.leases[shard_id] = _lease(item, self.stream, self.created)
            self._streams[shard_id] = item.get("stream", {}).get("S")
            if self._seen.get(shard_id, (None,))[0] != lease.counter:
                self._seen[shard_id] = (lease.counter, now)

    async def _update(self, shard_id: str, **kwargs: Any) -> dict[str, Any] | None:
        """A conditional UpdateItem: the item after it, None if its condition did not
        hold. (Attribute names are written ``#name``, as DynamoDB reserves some.)"""
        return await self._update_key(self._key(shard_id), **kwargs)

    async def _update_key(self, key: dict[str, Any], **kwargs: Any) -> dict[str, Any] | None:
        expressions = f'{kwargs.get("UpdateExpression", "")} {kwargs.get("ConditionExpression", "")}'
        used = set(re.findall(r"#(\w+)", expressions))
        if used:
            kwargs["ExpressionAttributeNames"] = {f"#{name}": name for name in used}
        try:
            reply = await self._client.update_item(TableName=self.table, Key=key, ReturnValues="ALL_NEW", **kwargs)
        except self._client.exceptions.ConditionalCheckFailedException:
            return None
        return reply.get("Attributes") or {}

    async def _create(self, shard: ListedShard) -> None:
        """The item of a shard new to the table, free (its position from the old
        per-source item, if that named it)."""
        item: dict[str, Any] = {**self._key(shard.shard_id), "source": {"S": self.source},
                                "leaseKey": {"S": shard.shard_id}, "leaseCounter": {"N": "0"},
                                "ownerSwitchesSinceCheckpoint": {"N": "0"}, "stream": {"S": self.stream or ""},
                                "period_ms": {"N": str(int(self.period * 1000))}}
        if self.created is not None:
            item["created"] = {"N": str(self.created)}
        if shard.parents:
            item["parentShardId"] = {"SS": list(shard.parents)}
        old = self._migrated.get(shard.shard_id)
        if old is not None:
            text, sub = _checkpoint(old)
            item["checkpoint"], item["checkpointSubSequenceNumber"] = {"S": text}, {"N": str(sub)}
        try:
            await self._client.put_item(TableName=self.table, Item=item,
                                        ConditionExpression="attribute_not_exists(pk)")
        except self._client.exceptions.ConditionalCheckFailedException:
            return  # another server made it meanwhile: the next read has it
        self.leases[shard.shard_id] = _lease(item, self.stream, self.created)
        self._seen[shard.shard_id] = (0, time.monotonic())

    async def _take(self, shard_id: str, lease: Lease) -> dict[str, Any] | None:
        """Take the lease if its counter is still the one read (free, expired or stolen)."""
        sent = time.monotonic()
        values = {":me": {"S": self.owner}, ":one": {"N": "1"}, ":seen": {"N": str(lease.counter)},
                  ":exp": {"N": self._expires()}, ":p": {"N": str(int(self.period * 1000))},
                  ":stream": {"S": self.stream or ""}}
        update = ("SET #leaseOwner = :me, #leaseCounter = #leaseCounter + :one, #expires_ms = :exp, #period_ms = :p, "
                  "#ownerSwitchesSinceCheckpoint = #ownerSwitchesSinceCheckpoint + :one, #stream = :stream")
        if self.created is not None:
            update += ", #created = :created"
            values[":created"] = {"N": str(self.created)}
        if lease.checkpoint is None:  # another stream's position (made again under its name): none
            update += " REMOVE #checkpoint, #checkpointSubSequenceNumber"
        got = await self._update(shard_id, UpdateExpression=update, ConditionExpression="#leaseCounter = :seen",
                                 ExpressionAttributeValues=values)
        if got is not None:
            self.held[shard_id] = sent
            self.leases[shard_id] = _lease(got, self.stream, self.created)
        return got

    async def snapshot(self) -> dict[str, tuple[Saved | None, str | None, str | None]]:
        """Each shard's (position, owner, stream) as the table holds it now, for
        ``mldserver positions``: ``{"shardId-000000000001": (Position(...), "host-a:...", "arn:...")}``."""
        self.stream = None
        await self._read()
        return {shard_id: (lease.checkpoint, lease.owner, self._streams.get(shard_id))
                for shard_id, lease in sorted(self.leases.items())}

    # -- --reset-positions, and the reader's stream bookkeeping --------------------------

    async def reset_positions(self) -> bool:
        """Delete every shard's position (and the old per-source item's), unless a live
        server holds a lease (a ConfigError then); True if there were some."""
        self.stream = None
        await self._read()
        now_ms = wall_clock_ms()
        live = []
        for shard_id, lease in sorted(self.leases.items()):
            reply = await self._client.get_item(TableName=self.table, Key=self._key(shard_id), ConsistentRead=True)
            item = reply.get("Item") or {}
            if "leaseOwner" in item and int(item.get("expires_ms", {}).get("N", 0)) > now_ms:
                live.append(f"{shard_id} by {item['leaseOwner']['S']}")
        if live:
            raise ConfigError(f"--reset-positions: {self.source} is read ({', '.join(live)}: leases in "
                              f"{self.table} are live): stop those servers first, or reset once their leases expire")
        reset = False
        for shard_id in sorted(self.leases):
            done = await self._update(shard_id, UpdateExpression="REMOVE #checkpoint, #checkpointSubSequenceNumber",
                                      ConditionExpression="attribute_exists(#checkpoint)")
            reset = reset or done is not None
        old = await self._update_key({"pk": {"S": self.source}}, UpdateExpression="REMOVE #positions",
                                     ConditionExpression="attribute_exists(#positions)")
        return reset or old is not None

    async def forget(self, shard_ids: list[str]) -> None:
        """Shards gone from the stream (trimmed away; their children wait on them no
        more): their items are deleted, unless another server holds one (a scan of the
        table costs what it holds, and DynamoDB's shards roll over every few hours)."""
        for shard_id in shard_ids:
            try:
                await self._client.delete_item(
                    TableName=self.table, Key=self._key(shard_id),
                    ConditionExpression="attribute_not_exists(#leaseOwner) OR #leaseOwner = :me",
                    ExpressionAttributeNames={"#leaseOwner": "leaseOwner"},
                    ExpressionAttributeValues={":me": {"S": self.owner}})
            except self._client.exceptions.ConditionalCheckFailedException:
                continue
            except service_errors():
                return  # (the next listing tries again)
            self.leases.pop(shard_id, None)
            self._ended.discard(shard_id)
            self.held.pop(shard_id, None)

    async def restart(self, stream: str, created: int | None) -> None:
        """The stream was created again under its name: no position kept is its."""
        self.stream, self.created, self._migrated, self._ended = stream, created, {}, set()
        self.leases = {s: lease._replace(checkpoint=None) for s, lease in self.leases.items()}


def _checkpoint(saved: Saved) -> tuple[str, int]:
    """The item's ``checkpoint`` and ``checkpointSubSequenceNumber`` for a position."""
    if isinstance(saved, Position):
        return saved.text, saved.sub
    return SHARD_END, 0


def _lease(item: dict[str, Any], stream: str | None, created: int | None) -> Lease:
    checkpoint: Saved | None = None
    same = stream is None or (item.get("stream", {}).get("S") == stream
                              and (created is None or item.get("created", {}).get("N") == str(created)))
    if "checkpoint" in item and same:
        text = item["checkpoint"]["S"]
        sub = item.get("checkpointSubSequenceNumber", {}).get("N", "0")
        checkpoint = SHARD_END if text == SHARD_END else Position.parse(text, int(sub))
    return Lease(item.get("leaseOwner", {}).get("S"), int(item.get("leaseCounter", {}).get("N", "0")), checkpoint,
                 tuple(item.get("parentShardId", {}).get("SS", ())))


async def ensure_table(client: Any, table: str) -> None:
    """The lease table, made if absent (a string key ``pk``, on-demand); a table keyed
    otherwise is a ConfigError."""
    try:
        described = (await client.describe_table(TableName=table))["Table"]
    except client.exceptions.ResourceNotFoundException:
        try:
            await client.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                                      AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                                      KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        except client.exceptions.ResourceInUseException:
            pass  # another server made it meanwhile
        await client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        described = (await client.describe_table(TableName=table))["Table"]
    keys = [(k["AttributeName"], k["KeyType"]) for k in described["KeySchema"]]
    if keys != [("pk", "HASH")]:
        raise ConfigError(f"--lease-table {table}: not a lease table (its key is {keys}): name a table of its own "
                          f"for leases; mldserver creates it")
