"""A stream read from a script or a notebook, with no server: ``mldserver.open_stream``,
Bloop's Stream API over the source reader's own pieces (the service calls, the
``cursor``'s throttling, expiry and trimming, parents before children)::

    async with mldserver.open_stream("dynamodb:orders", start="trim_horizon") as stream:
        async for change in stream:          # every shard read to its head, parents first
            print(change.event_name, change.keys, change.doc)
        saved = stream.token                 # JSON-serialisable: where each shard stands
        await stream.move_to(saved)          # or "latest", "trim_horizon", an aware datetime
        await stream.heartbeat()             # keeps idle iterators alive (call it every few minutes)
        stream.lags                          # {"shardId-...": 0}: ms behind each shard's head

    stream.token == {"stream": "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-30T10:00:00.000",
                     "shards": {"shardId-00000001769731200000-6a3f0c2d": "000000000000000000017",
                                "shardId-00000001769716800000-0b8e4a71": "SHARD_END"}}

``open_stream(source, start="trim_horizon", *, region=None, endpoint_url=None)``:
``source`` as ``--source`` takes it (``dynamodb:TABLE``, ``dynamodb:STREAM_ARN``,
``kinesis:STREAM``, ``kinesis:STREAM_ARN``); ``start`` anything ``move_to`` takes;
the AWS configuration is the usual one (``AWS_REGION``, ``AWS_ENDPOINT_URL_DYNAMODB``,
``AWS_ENDPOINT_URL_KINESIS``, the credential chain).

What comes out: a DynamoDB stream yields ``Change``s (a ``ChangeHandler``'s ``doc`` and
``meta``, with the shard's id); a Kinesis stream yields ``StreamRecord``s (a handler's
``mldserver.Record``, KPL aggregates one per user record, with the shard's id).

``async for`` reads each shard until it is at its head (a page not full and nothing
behind; DynamoDB Streams may answer empty before its head, so there three empty pages
in a row) and then ends; iterate again for what came since. Records of several shards
are merged by their time (Kinesis's arrival, DynamoDB's creation, never decreasing
within a shard), page by page; a shard's records keep their order, and a child shard
is read only once each parent's last record has been yielded.

The token says, per shard, where reading goes on: after the last record yielded (its
sequence number; ``[sequence_number, sub]`` for a user record inside a KPL aggregate),
``"SHARD_END"`` (read to its end), or where it starts when nothing was yielded yet:
``"TRIM_HORIZON"``, ``"LATEST"``, ``"AT_TIMESTAMP:<epoch ms>"``, or
``"AT_SEQUENCE_NUMBER:<sequence number>"`` once records are read and not yet yielded.
``open_stream(source, start=token)`` or ``move_to(token)`` goes on exactly there (a
shard the token does not name starts at its trim horizon: a child born since). A
``"LATEST"`` shard from which nothing was read means the latest when moved to again.

``move_to(datetime)``: Kinesis starts each shard ``AT_TIMESTAMP``; DynamoDB Streams
has no such iterator, so each shard is read from its trim horizon (24 hours at most)
and what was created before the time is skipped, shard after shard, up to the first
record at or after it (the creation times are whole seconds: the time is taken down to
its second). ``move_to("latest")`` takes each open shard's iterator at once (what is
written from then on comes out), and closed shards count as read.

``heartbeat()`` reads one page of every shard being read: a fresh iterator (DynamoDB's
expire after 15 minutes, Kinesis's after 5; one at ``LATEST`` could not be taken again
without losing what was written meanwhile), and the records found are kept for the next
iteration.
"""

from __future__ import annotations

import asyncio
import heapq
from datetime import datetime
from typing import Any, NamedTuple, Union

from ..api.changes import Meta, parse_change
from ..api.records import Record
from ..base.logs import EventLogger, get_logger
from ..base.positions import Position
from .cursor import ShardCursor
from .dynamodb import DynamoDBStreams
from .kinesis import KinesisStreams
from .positions import SHARD_END
from .reader import may_start
from .service import ListedShard, Service
from .spec import SourceSpec

__all__ = ["Change", "Stream", "StreamRecord", "open_stream"]

EMPTY_READS_AT_HEAD = {"dynamodb": 3, "kinesis": 1}  # Kinesis says how far behind it is (MillisBehindLatest)
TRIM_HORIZON, LATEST, AT_TIMESTAMP, AT_SEQUENCE_NUMBER = "TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", "AT_SEQUENCE_NUMBER"


class Change(NamedTuple):
    """One DynamoDB change, as a ``ChangeHandler``'s callback sees it::

        Change(shard_id="shardId-...", event_name="MODIFY", doc={"id": "o-17", "amount": Decimal("12.50")},
               meta=Meta(dynamodb, MODIFY, ...))
        change.keys == {"id": "o-17"}; change.old  # the item before, when the stream has old images
    """

    shard_id: str
    event_name: str  # INSERT, MODIFY or REMOVE
    doc: Any  # the new image, decoded (None for REMOVE, or a stream without new images)
    meta: Meta  # keys, old image, sequence number, creation time, expired (TTL)...

    @property
    def keys(self) -> dict[str, Any] | None:
        """The item's key, decoded: ``{"id": "o-17"}``."""
        return self.meta.keys

    @property
    def old(self) -> dict[str, Any] | None:
        """The item before the change (a stream with old images), else None."""
        return self.meta.old

    @property
    def sequence_number(self) -> str:
        """The change's sequence number in its shard (a string of digits)."""
        return self.meta.sequence_number

    @property
    def creation_time_ms(self) -> int | None:
        """When DynamoDB made the change, epoch ms (to the second)."""
        return self.meta.creation_time_ms


class StreamRecord(Record):
    """A Kinesis record (``mldserver.Record``: ``data``, ``partition_key``,
    ``sequence_number``, ``sub_sequence_number``, ``approximate_arrival_timestamp``) and
    its shard's id."""

    __slots__ = ("shard_id",)

    def __init__(self, raw: dict[str, Any], shard_id: str, position: Position | None = None) -> None:
        super().__init__(raw, None, position)
        self.shard_id = shard_id

    def __repr__(self) -> str:
        return (f"StreamRecord(shard_id={self.shard_id!r}, sequence_number={self.sequence_number!r}, "
                f"sub_sequence_number={self.sub_sequence_number!r}, partition_key={self.partition_key!r})")


class At(NamedTuple):
    """At this record, it included (read, nothing of the shard yielded yet)."""

    text: str


Where = Union[Position, At, str]  # str: TRIM_HORIZON, LATEST, AT_TIMESTAMP (with since_ms), SHARD_END


class _Shard:
    __slots__ = ("info", "at", "since_ms", "cursor", "buffered", "head", "empties", "clamp")

    def __init__(self, info: ListedShard, at: Where, since_ms: int | None = None) -> None:
        self.info = info
        self.at = at  # where reading goes on, as the token says it
        self.since_ms = since_ms
        self.cursor: ShardCursor | None = None
        self.buffered = 0  # records read, not yet yielded
        self.head = False  # at its head in this pass
        self.empties = 0  # empty pages in a row
        self.clamp = 0  # the last event time pushed (times never decrease within a shard)


def open_stream(source: str, start: Any = "trim_horizon", *, region: str | None = None,
                endpoint_url: str | None = None) -> "Stream":
    """A DynamoDB or Kinesis stream read from a script, with no server and no daemon,
    opened with ``async with``::

        async with mldserver.open_stream("dynamodb:orders", start="trim_horizon") as stream:
            async for change in stream:          # each shard read to its head, parents first; then it ends
                print(change.event_name, change.keys, change.doc)
            saved = stream.token                 # JSON: where each shard stands
        async with mldserver.open_stream("dynamodb:orders", start=saved) as stream:
            ...                                  # goes on exactly after the last change yielded

    ``source`` as ``--source`` takes it: ``dynamodb:TABLE``, ``dynamodb:STREAM_ARN``,
    ``kinesis:STREAM``, ``kinesis:STREAM_ARN``. ``start``: ``"trim_horizon"``,
    ``"latest"``, an aware ``datetime``, or a token. A DynamoDB stream yields ``Change``s,
    a Kinesis stream ``StreamRecord``s (KPL aggregates one per user record). The stream
    also has ``move_to(start)``, ``heartbeat()`` (call it every few minutes while idle:
    iterators expire) and ``lags`` (ms behind each shard's head). The AWS settings are
    the usual ones (``AWS_REGION``, ``AWS_ENDPOINT_URL_DYNAMODB``, the credential
    chain) unless ``region`` or ``endpoint_url`` is given."""
    return Stream(SourceSpec.parse(source), start, region=region, endpoint_url=endpoint_url)


class Stream:
    def __init__(self, spec: SourceSpec, start: Any = "trim_horizon", *, region: str | None = None,
                 endpoint_url: str | None = None) -> None:
        self.spec = spec
        self.start = start
        service = KinesisStreams if spec.kind == "kinesis" else DynamoDBStreams
        self.streams: Service = service(spec.name, region=region, endpoint_url=endpoint_url)
        self.arn: str | None = None
        self.log: EventLogger = get_logger("mldserver.stream").bind(source=spec.text)
        self._shards: dict[str, _Shard] = {}
        self._since_ms: int | None = None  # the last move_to(datetime): where a shard born since starts
        self._heap: list[tuple[Any, ...]] = []
        self._pushed = 0
        self._relist = True

    async def __aenter__(self) -> "Stream":
        await self.streams.__aenter__()
        try:
            self.arn = await self.streams.stream_arn()
            await self.move_to(self.start)
        except BaseException:
            await self.streams.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.streams.__aexit__(*exc)

    # -- where it stands --------------------------------------------------------------

    @property
    def token(self) -> dict[str, Any]:
        """Where each shard goes on (see the module): JSON, for ``move_to`` or ``start``."""
        return {"stream": self.arn, "shards": {sid: _encode(s.at, s.since_ms) for sid, s in self._shards.items()}}

    @property
    def lags(self) -> dict[str, int | None]:
        """Each shard being read: how far behind its head its last page was, in ms
        (Kinesis's MillisBehindLatest; DynamoDB, the age of the last change read; None
        before its first page)."""
        return {sid: s.cursor.lag_ms for sid, s in self._shards.items() if s.cursor is not None and not s.cursor.ended}

    async def move_to(self, position: Any) -> None:
        """Go to ``"trim_horizon"``, ``"latest"``, an aware ``datetime`` or a ``token``;
        what was read and not yet yielded is dropped."""
        kind, value = _target(position)
        if kind == "token" and value.get("stream") not in (None, self.arn):
            raise ValueError(f"move_to(token): the token is of stream {value.get('stream')}, this is {self.arn} "
                             f"(a table's stream replaced: start again from trim_horizon or a time)")
        shards = await self.streams.shards()
        self._heap.clear()
        self._since_ms = value if kind == "time" else None
        saved = {str(k): _decode(v) for k, v in value.get("shards", {}).items()} if kind == "token" else {}
        self._shards = {}
        for info in shards:
            if kind == "token":
                at, since = saved.get(info.shard_id, (TRIM_HORIZON, None))
            elif kind == "latest":
                at, since = (SHARD_END if info.closed else LATEST), None
            elif kind == "time":
                at, since = AT_TIMESTAMP, value
            else:
                at, since = TRIM_HORIZON, None
            self._shards[info.shard_id] = _Shard(info, at, since)
        self._next_pass()
        self._start_ready()
        latest = [s for s in self._shards.values() if s.at == LATEST and s.cursor is not None]
        await asyncio.gather(*(self._read(s) for s in latest))  # the iterators taken now: from now on

    async def heartbeat(self) -> None:
        """One page of every shard being read (see the module); what it holds is yielded
        by the next iteration."""
        await asyncio.gather(*(self._read(s) for s in self._shards.values()
                               if s.cursor is not None and not s.cursor.ended))

    # -- iteration --------------------------------------------------------------------

    def __aiter__(self) -> "Stream":
        return self

    async def __anext__(self) -> Any:
        while not self._heap:
            if not await self._fill():
                self._next_pass()
                raise StopAsyncIteration
        _, shard_id, _, _, _, position, raw = heapq.heappop(self._heap)
        shard = self._shards[shard_id]
        shard.buffered -= 1
        if position is not None:
            shard.at = position
        if shard.buffered == 0 and shard.cursor is not None and shard.cursor.ended:
            self._ended(shard)
        if self.spec.kind == "kinesis":
            return StreamRecord(raw, shard_id, position)
        _, doc, meta = parse_change(Record(raw, None, position))
        return Change(shard_id, meta.event_name, doc, meta)

    def _next_pass(self) -> None:
        self._relist = True
        for s in self._shards.values():
            s.head, s.empties = False, 0

    async def _fill(self) -> bool:
        """Read a page of every shard being read and not at its head (starting those
        whose parents are done); False when there is none."""
        if self._relist:
            await self._list()
        self._start_ready()
        reading = [s for s in self._shards.values() if s.cursor is not None and not s.cursor.ended and not s.head]
        if not reading:
            return False
        await asyncio.gather(*(self._read(s) for s in reading))
        return True

    async def _list(self) -> None:
        """The shards listed again: a shard born since starts at its trim horizon (after
        ``move_to(datetime)``, at that time); one gone from the stream is forgotten."""
        listed = {info.shard_id: info for info in await self.streams.shards()}
        for shard_id, info in listed.items():
            shard = self._shards.get(shard_id)
            if shard is None:
                since = self._since_ms
                self._shards[shard_id] = _Shard(info, AT_TIMESTAMP if since is not None else TRIM_HORIZON, since)
            else:
                shard.info = info
        for shard_id in [sid for sid, s in self._shards.items()
                         if sid not in listed and (s.cursor is None or s.at == SHARD_END)]:
            del self._shards[shard_id]  # gone, and nothing of it left to yield
        self._relist = False

    def _start_ready(self) -> None:
        listed = set(self._shards)
        ended = lambda shard_id: self._shards[shard_id].at == SHARD_END  # noqa: E731
        for shard in self._shards.values():
            if shard.cursor is None and may_start(shard.info, listed, ended):
                shard.cursor = self._cursor(shard)

    def _cursor(self, shard: _Shard) -> ShardCursor:
        log = self.log.bind(shard_id=shard.info.shard_id)
        at = shard.at
        if isinstance(at, Position):
            return ShardCursor(self.streams, shard.info, (TRIM_HORIZON, None), log=log, last=at)
        if isinstance(at, At):
            return ShardCursor(self.streams, shard.info, (AT_SEQUENCE_NUMBER, at.text), log=log)
        if at == AT_TIMESTAMP:
            first = AT_TIMESTAMP if self.streams.at_timestamp else TRIM_HORIZON
            return ShardCursor(self.streams, shard.info, (first, None), log=log, since_ms=shard.since_ms,
                               at_ms=shard.since_ms)
        return ShardCursor(self.streams, shard.info, (at, None), log=log)

    async def _read(self, shard: _Shard) -> None:
        cursor = shard.cursor
        assert cursor is not None
        page = await cursor.read()
        assert page is not None  # (no stop: a cursor of ours reads until it has a page)
        records = page.records
        if records:
            if not isinstance(shard.at, (Position, At)):  # the first records: the token names them from now on
                shard.at, shard.since_ms, cursor.since_ms = At(records[0]["sequenceNumber"]), None, None
            for raw in records:
                position = Position.parse(raw.get("sequenceNumber"), raw.get("subSequenceNumber") or 0)
                shard.clamp = t = max(shard.clamp, raw.get("approximateArrivalTimestamp") or 0)
                self._pushed += 1
                heapq.heappush(self._heap, (t, shard.info.shard_id, position.seq if position else 0,
                                            position.sub if position else 0, self._pushed, position, raw))
                if position is not None:
                    cursor.last = position
            shard.buffered += len(records)
            shard.empties = 0
        if cursor.ended:
            if shard.buffered == 0:
                self._ended(shard)
        elif page.read >= self.streams.limit or (page.behind_ms or 0) > 0:
            shard.head = False
        elif page.read:
            shard.head = True
        else:
            shard.empties += 1
            shard.head = shard.empties >= EMPTY_READS_AT_HEAD[self.spec.kind]

    def _ended(self, shard: _Shard) -> None:
        """Read to its end and every record yielded: its children may start."""
        shard.at, shard.since_ms = SHARD_END, None
        self._relist = True


def _target(position: Any) -> tuple[str, Any]:
    if isinstance(position, dict) and isinstance(position.get("shards"), dict):
        return "token", position
    if isinstance(position, datetime):
        if position.tzinfo is None:
            raise ValueError(f"move_to({position!r}): give the time's zone (tzinfo), as in "
                             f"datetime(2026, 1, 30, 10, tzinfo=timezone.utc)")
        return "time", round(position.timestamp() * 1000)
    if isinstance(position, str) and position.lower() in ("trim_horizon", "latest"):
        return position.lower(), None
    raise ValueError(f"move_to({position!r}): use 'trim_horizon', 'latest', an aware datetime or a token "
                     f"(stream.token)")


def _encode(at: Where, since_ms: int | None) -> Any:
    if isinstance(at, Position):
        return at.text if at.sub == 0 else [at.text, at.sub]
    if isinstance(at, At):
        return f"{AT_SEQUENCE_NUMBER}:{at.text}"
    if at == AT_TIMESTAMP:
        return f"{AT_TIMESTAMP}:{since_ms}"
    return at


def _position(value: list[Any]) -> Position | None:
    try:
        return Position.from_json(value)
    except ValueError:
        return None


def _decode(value: Any) -> tuple[Where, int | None]:
    """A token's shard value: (where, since_ms); ValueError for anything else."""
    if isinstance(value, list) and (position := _position(value)) is not None:
        return position, None
    if isinstance(value, str):
        if value in (TRIM_HORIZON, LATEST, SHARD_END):
            return value, None
        kind, _, rest = value.partition(":")
        if kind == AT_TIMESTAMP and rest.isdigit():
            return AT_TIMESTAMP, int(rest)
        if kind == AT_SEQUENCE_NUMBER and rest.isdigit():
            return At(rest), None
        position = Position.parse(value, 0)
        if position is not None:
            return position, None
    raise ValueError(f"a token's shard position {value!r}: expected a sequence number, [sequence_number, sub], "
                     f"SHARD_END, TRIM_HORIZON, LATEST, AT_TIMESTAMP:<ms> or AT_SEQUENCE_NUMBER:<sequence number>")
