"""DynamoDB Streams, the calls a source makes (aioboto3, the standard AWS configuration),
with the service's errors turned into the few that change what a reader does::

    async with DynamoDBStreams("orders", region="us-east-1") as streams:
        arn = await streams.stream_arn()          # a table's latest stream (or the ARN given)
        shards = await streams.shards()           # [ListedShard("shardId-...", parents=("shardId-...",)), ...]
        it = await streams.iterator("shardId-...", "AFTER_SEQUENCE_NUMBER", "000000000000000000017")
        page = await streams.records(it)          # Page(records=[<daemon-shaped, the KCL adapter's>], ...)

Its errors are ``service``'s (``Throttled``, ``IteratorExpired`` after 15 minutes,
``Trimmed`` past the stream's 24 hours, ``Unreachable``). A page holds up to 1,000
records; the service has no ``AT_TIMESTAMP`` iterator, so a ``--from`` time reads from
the trim horizon and the reader skips what was created before it.

The endpoint: ``aws_endpoint_url`` (the setting), else ``AWS_ENDPOINT_URL_DYNAMODB_STREAMS``
or ``AWS_ENDPOINT_URL`` as botocore reads them, else ``AWS_ENDPOINT_URL_DYNAMODB``: DynamoDB
Local serves a table's stream beside the table, on the same port.
"""

from __future__ import annotations

import os
from typing import Any

from ..protocol.dynamodb_records import adapter_change, dynamodb_record
from ..base.durable import wall_clock_ms
from ..base.aws import client
from ..errors import ConfigError
from .service import ListedShard, OpenClient, Page, Throttled, Unreachable, call, describe, error_code, service_errors

__all__ = ["LIMIT", "DynamoDBStreams", "ListedShard", "Page", "Throttled", "Unreachable", "endpoint"]

LIMIT = 1000  # records a GetRecords page holds at most (the service's own limit)


def endpoint(configured: str | None) -> str | None:
    """The streams endpoint (see the module's docstring)."""
    if configured:
        return configured
    if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB_STREAMS") or os.environ.get("AWS_ENDPOINT_URL"):
        return None  # botocore reads them itself
    return os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or None


class DynamoDBStreams(OpenClient):
    limit = LIMIT
    read_interval = 0.0  # (at most two readers a shard: this is the one)
    resume = "AFTER_SEQUENCE_NUMBER"
    at_timestamp = False  # no AT_TIMESTAMP iterator: a time reads from the trim horizon and skips
    millis_behind = False  # (a reader's lag: the age of the last change read)
    client_service = "dynamodbstreams"
    raw = True  # binary attributes as the base64 the adapter format carries, times as epoch seconds
    endpoint_hint = "AWS_ENDPOINT_URL_DYNAMODB for DynamoDB Local"
    created = None  # (a stream's ARN ends in its creation time: a new stream is a new ARN)

    def __init__(self, name: str, *, region: str | None = None, endpoint_url: str | None = None) -> None:
        """``name``: a table (its latest stream) or a stream ARN."""
        self.name = name
        self.region = region
        self.endpoint_url = endpoint(endpoint_url)
        self._table_endpoint = endpoint_url
        self._arn = name if name.startswith("arn:") else None

    async def stream_arn(self) -> str:
        """The stream's ARN: the one given, or the table's latest stream. A table
        without a stream (or with none enabled) is a ConfigError."""
        if self._arn is not None:
            return self._arn
        try:
            async with client("dynamodb", self.region, endpoint_url=self._table_endpoint) as dynamodb:
                table = (await dynamodb.describe_table(TableName=self.name))["Table"]
        except service_errors() as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException":
                raise ConfigError(f"--source dynamodb:{self.name}: no such table (in region "
                                  f"{self.region or os.environ.get('AWS_REGION') or 'the default'}): check the name, "
                                  f"the region and the endpoint") from None
            raise Unreachable(f"DescribeTable {self.name}: {describe(exc)}") from None
        spec = table.get("StreamSpecification") or {}
        arn = table.get("LatestStreamArn")
        if not arn or not spec.get("StreamEnabled"):
            raise ConfigError(f"--source dynamodb:{self.name}: the table has no stream enabled: enable one "
                              f"(StreamViewType NEW_AND_OLD_IMAGES), or give a stream ARN")
        self._arn = arn
        return arn

    async def identity(self) -> tuple[str, int | None] | None:
        """The table's latest stream now (None: the table or its stream gone); a stream
        ARN given is the stream for good."""
        if self.name.startswith("arn:"):
            return self.name, None
        try:
            async with client("dynamodb", self.region, endpoint_url=self._table_endpoint) as dynamodb:
                table = (await dynamodb.describe_table(TableName=self.name))["Table"]
        except service_errors() as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return None
            raise Unreachable(f"DescribeTable {self.name}: {describe(exc)}") from None
        arn = table.get("LatestStreamArn")
        if not arn or not (table.get("StreamSpecification") or {}).get("StreamEnabled"):
            return None
        return arn, None

    def follow(self, arn: str, created: int | None) -> None:
        """Read the table's new stream (``identity``'s) from now on."""
        self._arn = arn

    async def shards(self) -> list[ListedShard]:
        """Every shard the stream lists (DescribeStream, page after page)."""
        arn = await self.stream_arn()
        out: list[ListedShard] = []
        after: str | None = None
        while True:
            args: dict[str, Any] = {"StreamArn": arn}
            if after:
                args["ExclusiveStartShardId"] = after
            description = (await self._call("describe_stream", **args))["StreamDescription"]
            for shard in description.get("Shards", []):
                parent = shard.get("ParentShardId")
                closed = bool((shard.get("SequenceNumberRange") or {}).get("EndingSequenceNumber"))
                out.append(ListedShard(shard["ShardId"], (parent,) if parent else (), closed))
            after = description.get("LastEvaluatedShardId")
            if not after:
                return out

    async def iterator(self, shard_id: str, kind: str, sequence_number: str | None = None,
                       at_ms: int | None = None) -> str:
        """``kind``: TRIM_HORIZON, LATEST, AT_SEQUENCE_NUMBER or AFTER_SEQUENCE_NUMBER."""
        args: dict[str, Any] = {"StreamArn": await self.stream_arn(), "ShardId": shard_id, "ShardIteratorType": kind}
        if sequence_number is not None:
            args["SequenceNumber"] = sequence_number
        return (await self._call("get_shard_iterator", **args))["ShardIterator"]

    async def records(self, iterator: str, limit: int = LIMIT) -> Page:
        """A page, daemon-shaped (the KCL adapter's records); behind: 0 after a page that
        was not full, else the time since its last record's creation (the service does
        not say how far behind a reader is)."""
        page = await self._call("get_records", ShardIterator=iterator, Limit=limit)
        api = page.get("Records", [])
        records = [dynamodb_record(adapter_change(r, as_sent=True)) for r in api]  # (raw: binary as sent, base64)
        created = records[-1].get("approximateArrivalTimestamp") if records else None
        behind = max(0, wall_clock_ms() - created) if len(api) >= limit and created else 0
        return Page(records, len(api), page.get("NextShardIterator"), behind)

    async def _call(self, method: str, **args: Any) -> Any:
        return await call(self._client, method, **args)
