"""Lineage: which shards are a shard's parents (one after a split, two after a merge).

Three sources, the later winning where it answers:

- **what the server has seen**: a shard seen for the first time, starting at the
  stream's edge (no numeric checkpoint), after a shard ended here with fewer than two
  children yet, is taken for that shard's child (a split gives two). Enough for one
  worker reading a stream that splits; a merge needs the stream's own answer.
- **the stream** (``stream`` set to a Kinesis stream name or ARN, or a DynamoDB
  stream ARN): Kinesis ``ListShards`` or DynamoDB Streams ``DescribeStream`` through
  aioboto3, cached, and refreshed when a shard unknown to the cache starts::

    lineage = Lineage(StreamShards("orders", endpoint_url="http://127.0.0.1:4567"))
    await lineage.started("shardId-000000000002", checkpoint=None)   # from TRIM_HORIZON
    lineage.parents_of("shardId-000000000002")   # ("shardId-000000000000",)

The calls are asynchronous (the event loop never waits on them) and bounded by a
time-out; a failure is logged and the shard goes on with what was seen.

- **the reader** (``--source``): it lists the stream's shards itself and tells each
  shard's parents before the shard starts (``given``), so nothing is guessed and no
  lookup is made.

Without ``stream`` and a reader, a split's children are guessed; the first time a
shard ends here that is said once (``lineage_unknown``, with what to set).

A shard gone from here is ``forget``-ten; only the last ``ENDED_KEPT`` ended shards
stay known as parents for children yet to come.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..base.logs import get_logger
from ..base.positions import Position

log = get_logger("mldserver.lineage")

LOOKUP_TIMEOUT = 10.0
ENDED_KEPT = 64  # ended shards still offered as parents to shards seen later


class StreamShards:
    """The parents of every shard of one stream, from the AWS API (aioboto3)."""

    def __init__(self, stream: str, *, region: str | None = None, endpoint_url: str | None = None) -> None:
        self.stream = stream
        self.region = region
        self.endpoint_url = endpoint_url
        self.dynamodb = ":dynamodb:" in stream and "/stream/" in stream
        self.closed: set[str] = set()  # the shards the last fetch found closed (an ending sequence number)

    async def fetch(self) -> dict[str, tuple[str, ...]]:
        from ..base.aws import client as aws_client  # only a server configured with a stream pays for it

        service = "dynamodbstreams" if self.dynamodb else "kinesis"
        async with aws_client(service, self.region, endpoint_url=self.endpoint_url) as client:
            shards = await (self._dynamodb(client) if self.dynamodb else self._kinesis(client))
        self.closed = {s["ShardId"] for s in shards if s.get("SequenceNumberRange", {}).get("EndingSequenceNumber")}
        return {
            s["ShardId"]: tuple(p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p)
            for s in shards
        }

    async def _kinesis(self, client: Any) -> list[dict[str, Any]]:
        arn = self.stream.startswith("arn:")
        args: dict[str, Any] = {"StreamARN": self.stream} if arn else {"StreamName": self.stream}
        shards: list[dict[str, Any]] = []
        while True:
            page = await client.list_shards(**args)
            shards += page["Shards"]
            token = page.get("NextToken")
            if not token:
                return shards
            args = {"NextToken": token}

    async def _dynamodb(self, client: Any) -> list[dict[str, Any]]:
        args: dict[str, Any] = {"StreamArn": self.stream}
        shards: list[dict[str, Any]] = []
        while True:
            page = (await client.describe_stream(**args))["StreamDescription"]
            shards += page["Shards"]
            after = page.get("LastEvaluatedShardId")
            if not after:
                return shards
            args = {"StreamArn": self.stream, "ExclusiveStartShardId": after}


class Lineage:
    def __init__(self, stream: StreamShards | None = None) -> None:
        self.stream = stream
        self.parents: dict[str, tuple[str, ...]] = {}
        self.children: dict[str, list[str]] = {}
        self.seen: set[str] = set()
        self._ended: list[str] = []  # ended here, fewer than two children known yet (the last ENDED_KEPT)
        self._fetched: dict[str, tuple[str, ...]] = {}
        self._lock = asyncio.Lock()
        self.known = stream is not None  # the stream's shards are known (stream, or a reader): nothing guessed
        self._told = False  # lineage_unknown said

    def parents_of(self, shard_id: str) -> tuple[str, ...]:
        return self.parents.get(shard_id, ())

    def children_of(self, shard_id: str) -> list[str]:
        return self.children.get(shard_id, [])

    def given(self, shard_id: str, parents: tuple[str, ...]) -> None:
        """The shard's parents as its reader listed them (``--source``), before it starts."""
        self.known = True
        self.seen.add(shard_id)
        self.learn(shard_id, parents)

    def learn(self, shard_id: str, parents: tuple[str, ...]) -> None:
        old = self.parents.get(shard_id, ())
        for p in old:
            if shard_id in self.children.get(p, []):
                self.children[p].remove(shard_id)
        self.parents[shard_id] = parents
        for p in parents:
            self.children.setdefault(p, []).append(shard_id)

    async def started(self, shard_id: str, checkpoint: Position | None) -> None:
        """A shard initialized here, from this stored checkpoint (None: from the
        stream's edge, TRIM_HORIZON or LATEST or AT_TIMESTAMP)."""
        first_time = shard_id not in self.seen
        self.seen.add(shard_id)
        if self.stream is not None:
            if shard_id not in self._fetched:
                await self._refresh()
            if shard_id in self._fetched:
                self.learn(shard_id, self._fetched[shard_id])
                return
        if first_time and shard_id not in self.parents and checkpoint is None:
            parent = next((p for p in self._ended if p != shard_id), None)
            if parent is not None:
                self.learn(shard_id, (parent,))
                if len(self.children[parent]) >= 2:
                    self._ended.remove(parent)

    async def to_come(self) -> dict[str, tuple[str, ...]]:
        """The shards still to be read, as the stream lists them (``stream`` set): the open
        ones and the closed parents of open ones (they may hold records not yet read),
        each with its parents. Empty without ``stream`` or when the lookup fails."""
        if self.stream is None:
            return {}
        await self._refresh()
        fetched, closed = self._fetched, self.stream.closed
        open_ = {s for s in fetched if s not in closed}
        wanted = open_ | {p for s in open_ for p in fetched[s] if p in fetched}
        for shard_id in wanted:
            self.learn(shard_id, fetched[shard_id])
        return {s: fetched[s] for s in sorted(wanted)}

    def mark_seen(self, shard_id: str) -> None:
        """A shard known here without starting (replayed from the spool at start-up):
        never taken for the child of a shard that ended here, and the stream's answer
        names its links (``started`` and a refresh treat it as seen)."""
        self.seen.add(shard_id)

    def ended(self, shard_id: str) -> None:
        self.seen.add(shard_id)
        if not self.known and not self._told:
            self._told = True
            log.warning("lineage_unknown", shard_id=shard_id,
                        what_to_do="a shard ended and this server does not know the stream's shards: its children "
                                   "are guessed from the shards that start next, and a merge's are not found. Set "
                                   "stream = \"<stream name or ARN>\" in --config (with aws_region and "
                                   "aws_endpoint_url where they apply) so a parent holds its windows until its "
                                   "children report")
        if shard_id not in self._ended and len(self.children_of(shard_id)) < 2:
            self._ended.append(shard_id)
            del self._ended[:-ENDED_KEPT]

    def forget(self, shard_id: str) -> None:
        """A shard gone from here: its own links go (it stays among the last ended
        shards, which its children yet to come may need)."""
        self.seen.discard(shard_id)
        for p in self.parents.pop(shard_id, ()):
            siblings = self.children.get(p)
            if siblings is not None and shard_id in siblings:
                siblings.remove(shard_id)
                if not siblings:
                    del self.children[p]
        self.children.pop(shard_id, None)

    async def _refresh(self) -> None:
        async with self._lock:
            try:
                async with asyncio.timeout(LOOKUP_TIMEOUT):
                    self._fetched = await self.stream.fetch()  # type: ignore[union-attr]
            except Exception as exc:
                log.warning(
                    "lineage_lookup_failed",
                    stream=self.stream.stream,  # type: ignore[union-attr]
                    error=f"{type(exc).__name__}: {exc}",
                    what_to_do="check the stream name, region and endpoint; lineage falls back to what was seen",
                )
                return
            for shard_id, parents in self._fetched.items():
                if shard_id in self.seen or any(p in self.seen for p in parents):
                    self.learn(shard_id, parents)
