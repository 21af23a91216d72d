"""DynamoDB Streams, the calls a source makes (aioboto3, the standard AWS configuration),
with the service's errors turned into the few that change what a reader does::

    async with DynamoDBStreams("orders", region="us-east-1") as streams:
        arn = await streams.stream_arn()          # a table's latest stream (or the ARN given)
        shards = await streams.shards()           # [ShardInfo("shardId-...", parents=("shardId-...",)), ...]
        it = await streams.iterator("shardId-...", "AFTER_SEQUENCE_NUMBER", "000000000000000000017")
        page = await streams.records(it)          # Page(records=[<the API's Record>, ...], next_iterator="...")

``page.next_iterator`` is None when the shard is closed and read to its end. What
fails is one of:

- ``Throttled`` (``LimitExceededException``, ``ProvisionedThroughputExceededException``,
  ``ThrottlingException``): back off with jitter and read again;
- ``IteratorExpired`` (``ExpiredIteratorException``; an iterator lives 15 minutes):
  a fresh iterator after the last position;
- ``Trimmed`` (``TrimmedDataAccessException``): the position is older than the
  stream keeps (24 hours): start again at the trim horizon, and say what was lost;
- ``Unreachable``: anything else the service or the network says (retried, logged).

The endpoint: ``aws_endpoint_url`` (the setting), else ``AWS_ENDPOINT_URL_DYNAMODB_STREAMS``
or ``AWS_ENDPOINT_URL`` as botocore reads them, else ``AWS_ENDPOINT_URL_DYNAMODB``: DynamoDB
Local serves a table's stream beside the table, on the same port.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from ..base.aws import client
from ..errors import ConfigError, MldserverError

LIMIT = 1000  # records a GetRecords page holds at most (the service's own limit)


class StreamsError(MldserverError):
    retriable = True


class Throttled(StreamsError):
    pass


class IteratorExpired(StreamsError):
    pass


class Trimmed(StreamsError):
    pass


class Unreachable(StreamsError):
    pass


_ERRORS = {
    "LimitExceededException": Throttled,
    "ProvisionedThroughputExceededException": Throttled,
    "ThrottlingException": Throttled,
    "ExpiredIteratorException": IteratorExpired,
    "TrimmedDataAccessException": Trimmed,
}


class ShardInfo(NamedTuple):
    shard_id: str
    parents: tuple[str, ...]  # one after a split; DynamoDB Streams never merges
    closed: bool  # an ending sequence number: no new record will come


class Page(NamedTuple):
    records: list[dict[str, Any]]  # the API's Records, as aioboto3 returns them
    next_iterator: str | None  # None: the shard is closed and read to its end


def endpoint(configured: str | None) -> str | None:
    """The streams endpoint (see the module's docstring)."""
    if configured:
        return configured
    if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB_STREAMS") or os.environ.get("AWS_ENDPOINT_URL"):
        return None  # botocore reads them itself
    return os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or None


class DynamoDBStreams:
    def __init__(self, name: str, *, region: str | None = None, endpoint_url: str | None = None) -> None:
        """``name``: a table (its latest stream) or a stream ARN."""
        self.name = name
        self.region = region
        self.endpoint_url = endpoint(endpoint_url)
        self._table_endpoint = endpoint_url
        self._arn = name if name.startswith("arn:") else None
        self._client: Any = None
        self._opened: Any = None

    async def __aenter__(self) -> "DynamoDBStreams":
        self._opened = client("dynamodbstreams", self.region, endpoint_url=self.endpoint_url, connections=64)
        self._client = await self._opened.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        opened, self._opened, self._client = self._opened, None, None
        if opened is not None:
            await opened.__aexit__(*exc)

    async def stream_arn(self) -> str:
        """The stream's ARN: the one given, or the table's latest stream. A table
        without a stream (or with none enabled) is a ConfigError."""
        if self._arn is not None:
            return self._arn
        try:
            async with client("dynamodb", self.region, endpoint_url=self._table_endpoint) as dynamodb:
                table = (await dynamodb.describe_table(TableName=self.name))["Table"]
        except _service_errors() as exc:
            code = _code(exc)
            if code == "ResourceNotFoundException":
                raise ConfigError(f"--source dynamodb:{self.name}: no such table (in region "
                                  f"{self.region or os.environ.get('AWS_REGION') or 'the default'}): check the name, "
                                  f"the region and the endpoint") from None
            raise Unreachable(f"DescribeTable {self.name}: {_describe(exc)}") from None
        spec = table.get("StreamSpecification") or {}
        arn = table.get("LatestStreamArn")
        if not arn or not spec.get("StreamEnabled"):
            raise ConfigError(f"--source dynamodb:{self.name}: the table has no stream enabled: enable one "
                              f"(StreamViewType NEW_AND_OLD_IMAGES), or give a stream ARN")
        self._arn = arn
        return arn

    async def shards(self) -> list[ShardInfo]:
        """Every shard the stream lists (DescribeStream, page after page)."""
        arn = await self.stream_arn()
        out: list[ShardInfo] = []
        after: str | None = None
        while True:
            args: dict[str, Any] = {"StreamArn": arn}
            if after:
                args["ExclusiveStartShardId"] = after
            description = (await self._call("describe_stream", **args))["StreamDescription"]
            for shard in description.get("Shards", []):
                parent = shard.get("ParentShardId")
                closed = bool((shard.get("SequenceNumberRange") or {}).get("EndingSequenceNumber"))
                out.append(ShardInfo(shard["ShardId"], (parent,) if parent else (), closed))
            after = description.get("LastEvaluatedShardId")
            if not after:
                return out

    async def iterator(self, shard_id: str, kind: str, sequence_number: str | None = None) -> str:
        """``kind``: TRIM_HORIZON, LATEST, AT_SEQUENCE_NUMBER or AFTER_SEQUENCE_NUMBER."""
        args: dict[str, Any] = {"StreamArn": await self.stream_arn(), "ShardId": shard_id, "ShardIteratorType": kind}
        if sequence_number is not None:
            args["SequenceNumber"] = sequence_number
        return (await self._call("get_shard_iterator", **args))["ShardIterator"]

    async def records(self, iterator: str, limit: int = LIMIT) -> Page:
        page = await self._call("get_records", ShardIterator=iterator, Limit=limit)
        return Page(page.get("Records", []), page.get("NextShardIterator"))

    async def _call(self, method: str, **args: Any) -> Any:
        try:
            return await getattr(self._client, method)(**args)
        except _service_errors() as exc:
            kind = _ERRORS.get(_code(exc) or "", Unreachable)
            raise kind(f"{_api(method)}: {_describe(exc)}") from None


def _service_errors() -> tuple[type[BaseException], ...]:
    """What the service or the network may raise (anything else is a bug of ours)."""
    import asyncio

    import aiohttp
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def _code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return (response.get("Error") or {}).get("Code")
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _api(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_"))
