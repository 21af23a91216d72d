"""Kinesis Data Streams, the calls a source makes (aioboto3, the standard AWS
configuration; ``AWS_ENDPOINT_URL_KINESIS`` or ``AWS_ENDPOINT_URL`` as botocore reads
them, or the ``aws_endpoint_url`` setting)::

    async with KinesisStreams("orders") as streams:            # a name, or arn:aws:kinesis:...:stream/orders
        arn = await streams.stream_arn()                        # DescribeStreamSummary's StreamARN
        streams.created                                         # its StreamCreationTimestamp, epoch ms
        shards = await streams.shards()                         # ListShards, page after page (NextToken)
        # [ListedShard("shardId-000000000000", (), True),
        #  ListedShard("shardId-000000000001", ("shardId-000000000000",), False), ...]   (a merge: two parents)
        it = await streams.iterator("shardId-000000000001", "AT_TIMESTAMP", at_ms=1769767200000)
        page = await streams.records(it)                        # GetRecords
        page.records[0] == {"action": "record", "data": "aGVsbG8=", "partitionKey": "k",
                            "sequenceNumber": "49590338271490256608559692538361571095921575989136588898",
                            "subSequenceNumber": 0, "approximateArrivalTimestamp": 1769767200123}

A KPL aggregate (``shard.kpl``) becomes one record per user record, as the KCL's
daemon delivers them: the aggregate's sequence number, ``subSequenceNumber`` 0, 1, 2...,
each user record's own partition key (and ``explicitHashKey``), its data. A page holds up
to 10,000 Kinesis records; ``behind_ms`` is the service's ``MillisBehindLatest``;
``next_iterator`` is None when the shard is closed and read to its end, and the last
page names its ``ChildShards``. A shard allows 5 GetRecords a second, for all its
readers together: the reader waits ``read_interval`` (0.2 s) between two.

A saved position resumes ``AT_SEQUENCE_NUMBER``, as the KCL does: the record at it is
read again and the reader skips every user record up to the saved (sequence number,
sub-sequence number), so a position inside an aggregate resumes at its next user record.
Errors are ``service``'s; ``ExpiredIteratorException`` comes after 5 minutes.

A stream deleted and created again under its name keeps its ARN and its shard ids
(``shardId-000000000000``...) but none of the old stream's records: only its creation
time tells the two apart (``created``, saved beside the positions: ``reader``).
"""

from __future__ import annotations

import base64
import re
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigError
from ..shard.kpl import MAGIC, deaggregate
from .service import ListedShard, OpenClient, Page, Unreachable, call, describe, error_code, service_errors

LIMIT = 10_000  # records a GetRecords page holds at most (the service's own limit)
READ_INTERVAL = 0.2  # 5 GetRecords a second per shard

_ARN = re.compile(r"arn:aws[a-z-]*:kinesis:([a-z0-9-]+):\d{12}:stream/([A-Za-z0-9_.-]{1,128})")


def stream_name(name_or_arn: str) -> str:
    """The stream's name, from a name or an ARN."""
    match = _ARN.fullmatch(name_or_arn)
    return match.group(2) if match else name_or_arn


class KinesisStreams(OpenClient):
    limit = LIMIT
    read_interval = READ_INTERVAL
    resume = "AT_SEQUENCE_NUMBER"
    at_timestamp = True
    millis_behind = True  # MillisBehindLatest
    client_service = "kinesis"
    raw = True  # Data as the base64 the daemon protocol carries: decoded only for a KPL aggregate
    endpoint_hint = "AWS_ENDPOINT_URL_KINESIS for a local Kinesis"

    def __init__(self, name: str, *, region: str | None = None, endpoint_url: str | None = None) -> None:
        """``name``: a stream's name or ARN (an ARN's region is used unless one is set)."""
        match = _ARN.fullmatch(name)
        self.name = stream_name(name)
        self.region = region or (match.group(1) if match else None)
        self.endpoint_url = endpoint_url
        self._arn: str | None = None
        self.created: int | None = None  # the stream's creation time, epoch ms (``stream_arn`` reads it)

    async def stream_arn(self) -> str:
        """The stream's ARN, and its creation time in ``created``; a stream that does
        not exist is a ConfigError."""
        if self._arn is not None:
            return self._arn
        try:
            summary = (await self._client.describe_stream_summary(StreamName=self.name))["StreamDescriptionSummary"]
        except service_errors() as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise ConfigError(f"--source kinesis:{self.name}: no such stream (in region {self.region or 'the default'}"
                                  f"): check the name, the region and the endpoint") from None
            raise Unreachable(f"DescribeStreamSummary {self.name}: {describe(exc)}") from None
        self._arn = summary["StreamARN"]
        self.created = _epoch_ms(summary["StreamCreationTimestamp"])
        return self._arn

    async def identity(self) -> tuple[str, int | None] | None:
        """DescribeStreamSummary again: (ARN, creation time), None once deleted."""
        try:
            summary = (await self._client.describe_stream_summary(StreamName=self.name))["StreamDescriptionSummary"]
        except service_errors() as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return None
            raise Unreachable(f"DescribeStreamSummary {self.name}: {describe(exc)}") from None
        if summary.get("StreamStatus") == "DELETING":
            return None
        return summary["StreamARN"], _epoch_ms(summary["StreamCreationTimestamp"])

    def follow(self, arn: str, created: int | None) -> None:
        """Read the stream created again (``identity``'s) from now on."""
        self._arn, self.created = arn, created

    async def shards(self) -> list[ListedShard]:
        """Every shard the stream lists (ListShards, page after page: a NextToken alone
        asks for the next page)."""
        out: list[ListedShard] = []
        args: dict[str, Any] = {"StreamName": self.name}
        while True:
            page = await call(self._client, "list_shards", **args)
            for shard in page.get("Shards", []):
                parents = tuple(p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p)
                closed = bool((shard.get("SequenceNumberRange") or {}).get("EndingSequenceNumber"))
                out.append(ListedShard(shard["ShardId"], parents, closed))
            token = page.get("NextToken")
            if not token:
                return out
            args = {"NextToken": token}

    async def iterator(self, shard_id: str, kind: str, sequence_number: str | None = None,
                       at_ms: int | None = None) -> str:
        """``kind``: TRIM_HORIZON, LATEST, AT_TIMESTAMP (``at_ms``), AT_SEQUENCE_NUMBER or
        AFTER_SEQUENCE_NUMBER (``sequence_number``)."""
        args: dict[str, Any] = {"StreamName": self.name, "ShardId": shard_id, "ShardIteratorType": kind}
        if sequence_number is not None:
            args["StartingSequenceNumber"] = sequence_number
        if at_ms is not None:
            args["Timestamp"] = datetime.fromtimestamp(at_ms / 1000, timezone.utc)
        return (await call(self._client, "get_shard_iterator", **args))["ShardIterator"]

    async def records(self, iterator: str) -> Page:
        page = await call(self._client, "get_records", ShardIterator=iterator, Limit=LIMIT)
        api = page.get("Records", [])
        records = [user for r in api for user in daemon_records(r)]
        children = tuple(c["ShardId"] for c in page.get("ChildShards") or ())
        return Page(records, len(api), page.get("NextShardIterator"), page.get("MillisBehindLatest"), children)


def daemon_records(api_record: dict[str, Any]) -> list[dict[str, Any]]:
    """A GetRecords record as the daemon sends it: one record, or one per user record
    of a KPL aggregate (sub-sequence numbers 0, 1, ...; a blob that is no aggregate
    stays one record, as the KCL keeps it; an aggregate with a bad table index keeps
    the user records before it and loses the rest, as the KCL's daemon does: handing it
    over whole, for the server to dead-letter, would deliver sub-sequence numbers past
    the one this record names, which a checkpoint could not reach)."""
    arrived = api_record.get("ApproximateArrivalTimestamp")
    base = {"action": "record", "sequenceNumber": api_record["SequenceNumber"],
            "approximateArrivalTimestamp": _epoch_ms(arrived) if arrived is not None else None}
    data = api_record["Data"]
    if type(data) is str:  # base64, as sent (a raw client): most records are no aggregate
        if not data.startswith(_AGGREGATE_B64):
            return [dict(base, data=data, partitionKey=api_record.get("PartitionKey"), subSequenceNumber=0)]
        data = base64.b64decode(data)
    users = deaggregate(data, api_record.get("PartitionKey"))
    out = []
    for user in users.records:
        record = dict(base, data=base64.b64encode(user.data).decode(), partitionKey=user.partition_key,
                      subSequenceNumber=user.sub_sequence_number if users.aggregated else 0)
        if user.explicit_hash_key is not None:
            record["explicitHashKey"] = user.explicit_hash_key
        out.append(record)
    return out


_AGGREGATE_B64 = base64.b64encode(MAGIC[:3]).decode()  # "84ma": every KPL aggregate's data starts so


def _epoch_ms(at: Any) -> int:
    seconds = at.timestamp() if hasattr(at, "timestamp") else float(at)
    return round(seconds * 1000)
