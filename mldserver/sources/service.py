"""What a reader asks of a stream service, whichever it is (``dynamodb``: DynamoDB
Streams; ``kinesis``: Kinesis Data Streams): the shards listed, an iterator taken, a
page of records read, already daemon-shaped, with the service's errors turned into the
few that change what a reader does::

    async with KinesisStreams("orders") as streams:           # or DynamoDBStreams("orders")
        arn = await streams.stream_arn()                       # the stream's identity (saved beside positions)
        shards = await streams.shards()                        # [ListedShard("shardId-000000000002", ("shardId-000000000000",), False), ...]
        it = await streams.iterator("shardId-000000000002", "AT_TIMESTAMP", at_ms=1769767200000)
        page = await streams.records(it)
        page.records      # [{"action": "record", "data": "aGVsbG8=", "partitionKey": "k", "sequenceNumber": "4959...",
                          #   "subSequenceNumber": 0, "approximateArrivalTimestamp": 1769767200123}, ...]
        page.read         # how many records the service returned (a full page: read again at once)
        page.next_iterator, page.behind_ms, page.children

``page.next_iterator`` is None when the shard is closed and read to its end. What
fails is one of:

- ``Throttled`` (``LimitExceededException``, ``ProvisionedThroughputExceededException``,
  ``ThrottlingException``): back off with jitter and read again;
- ``IteratorExpired`` (``ExpiredIteratorException``; DynamoDB's iterators live 15
  minutes, Kinesis's 5): a fresh iterator after the last position;
- ``Trimmed`` (``TrimmedDataAccessException``): the position is older than the stream
  keeps: start again at the trim horizon, and say what was lost;
- ``NotFound`` (``ResourceNotFoundException``): the stream or the shard is gone, or
  (Kinesis) the shard has no record at the sequence number asked for;
- ``Invalid`` (``InvalidArgumentException``, ``ValidationException``, a parameter
  botocore refuses, such as a DynamoDB sequence number shorter than 21 digits): what was
  asked cannot be answered, however often it is asked. These two are never retried:
  the reader finds out which it is (the stream gone or created again, the shard gone,
  or a saved position the stream does not have: ``reader``);
- ``Unreachable``: anything else the service or the network says (retried, logged).

A service also says how it is read (``Service``): how many records a page holds at
most (``limit``), the least time between two reads of one shard (``read_interval``:
Kinesis allows 5 GetRecords a second per shard), how a shard resumes after a saved
position (``resume``), whether it has a timestamp iterator (``at_timestamp``) and
whether a page says how far behind its shard's head it is (``millis_behind``).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Protocol

from ..base.aws import client
from ..errors import MldserverError


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


class NotFound(StreamsError):
    retriable = False


class Invalid(StreamsError):
    retriable = False


ERRORS = {
    "LimitExceededException": Throttled,
    "ProvisionedThroughputExceededException": Throttled,
    "ThrottlingException": Throttled,
    "ExpiredIteratorException": IteratorExpired,
    "TrimmedDataAccessException": Trimmed,
    "ResourceNotFoundException": NotFound,
    "InvalidArgumentException": Invalid,
    "ValidationException": Invalid,
    "ParamValidationError": Invalid,  # botocore's, before anything is sent
}


class OpenClient:
    """The one aioboto3 client of a service's calls, open from ``async with`` to its
    end (``self._client``): ``client_service`` at ``self.region`` / ``self.endpoint_url``."""

    client_service: str
    raw = False  # blobs as base64 text, timestamps as epoch seconds (``base.aws.client``)
    region: str | None
    endpoint_url: str | None
    _client: Any = None
    _opened: Any = None

    async def __aenter__(self) -> Any:
        self._opened = client(self.client_service, self.region, endpoint_url=self.endpoint_url, connections=64,
                              raw=self.raw)
        self._client = await self._opened.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        opened, self._opened, self._client = self._opened, None, None
        if opened is not None:
            await opened.__aexit__(*exc)


class ListedShard(NamedTuple):
    shard_id: str
    parents: tuple[str, ...]  # one after a split, two after a merge (Kinesis), none for a first shard
    closed: bool  # an ending sequence number: no new record will come


class Page(NamedTuple):
    records: list[dict[str, Any]]  # daemon-shaped (a KPL aggregate already one record per user record)
    read: int  # the records the service returned (a page of ``limit``: read again at once)
    next_iterator: str | None  # None: the shard is closed and read to its end
    behind_ms: int | None = None  # how far the shard's reader is behind its head (None: the reader works it out)
    children: tuple[str, ...] = ()  # a closed shard's last page: its children (Kinesis ChildShards)


class Service(Protocol):
    """What ``reader.SourceReader`` needs of a stream service (an async context manager)."""

    limit: int  # records a page holds at most
    read_interval: float  # seconds between two GetRecords on one shard, at least
    resume: str  # AFTER_SEQUENCE_NUMBER, or AT_SEQUENCE_NUMBER (what the reader already has is skipped)
    at_timestamp: bool  # an AT_TIMESTAMP iterator (else a time reads from the trim horizon and skips)
    millis_behind: bool  # a page says how far it is behind the shard's head (Kinesis's MillisBehindLatest)
    endpoint_hint: str  # where to point it at a local emulator, for a message
    # When the stream was created (epoch ms, read by ``stream_arn``) where its ARN does not
    # say: a Kinesis stream created again under its name has the old one's ARN; else None.
    created: int | None

    async def __aenter__(self) -> "Service": ...

    async def __aexit__(self, *exc: Any) -> None: ...

    async def stream_arn(self) -> str: ...

    async def identity(self) -> tuple[str, int | None] | None:
        """The stream as it is now, asked again: (ARN, creation time) or None when it is
        gone (a table's stream: its latest). Differs from ``stream_arn``'s once the
        stream is deleted and created again."""
        ...

    def follow(self, arn: str, created: int | None) -> None:
        """Read the stream ``identity`` found (created again) from now on."""

    async def shards(self) -> list[ListedShard]: ...

    async def iterator(self, shard_id: str, kind: str, sequence_number: str | None = None,
                       at_ms: int | None = None) -> str: ...

    async def records(self, iterator: str) -> Page: ...


async def call(client: Any, method: str, **args: Any) -> Any:
    """``client.method(**args)`` with the service's errors turned into ours."""
    try:
        return await getattr(client, method)(**args)
    except service_errors() as exc:
        kind = ERRORS.get(error_code(exc) or type(exc).__name__, Unreachable)
        raise kind(f"{api_name(method)}: {describe(exc)}") from None


def service_errors() -> tuple[type[BaseException], ...]:
    """What the service or the network may raise (anything else is a bug of ours)."""
    import aiohttp
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return (response.get("Error") or {}).get("Code")
    return None


def describe(exc: BaseException) -> str:
    """One line (botocore's parameter errors span several)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def api_name(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_"))
