"""One source read by the server itself (``mldserver serve --source dynamodb:orders``):
its shards listed on a period and when one ends, each read by a task of its own, parents
before children, and fed to the server as a daemon's connection would be (``feed``)::

    reader = SourceReader(SourceSpec.parse("dynamodb:orders"), Start.parse("trim_horizon"), settings,
                          attach=server.attach, empty_batches=True)
    reader.prepare()          # the saved positions read; --from with saved positions: ConfigError
    await reader.start()      # the stream found, the shards listed, their tasks started
    ...                       # reader.task: the discovery loop (owned by the server)
    await reader.stop()       # each shard: its action finished, shutdownRequested, closed

A shard:

- starts once each parent is read to its end (``SHARD_END`` saved) or gone from the
  stream (trimmed): parents before children, always;
- starts after its saved position (``initialize`` carries it, the iterator is
  ``AFTER_SEQUENCE_NUMBER``), else where ``--from`` says: ``TRIM_HORIZON``, ``LATEST``,
  or, for a time, ``TRIM_HORIZON`` with every record created before the time skipped.
  DynamoDB Streams has no ``AT_TIMESTAMP`` iterator, so a time reads the shard from its
  trim horizon (up to 24 hours of records), and the creation time is the service's
  ``ApproximateCreationDateTime``, in whole seconds: the time is taken down to its
  second, so a record created in that second before it is kept and none after it is
  skipped (DynamoDB Local's times are whole minutes). A child of a shard read here starts at
  ``TRIM_HORIZON`` whatever ``--from`` says (else ``latest`` would lose the records
  written between the split and the child's first read);
- reads a page (up to 1,000 records), hands it over as one ``processRecords`` and
  waits for its status; then reads again at once when the page was full, after a
  quarter of ``source_poll_interval`` when it was not, after the whole interval when it
  was empty (with a sink, an empty page is handed over too, as an empty batch caught up,
  ``millisBehindLatest`` 0: the shard's watermark follows the clock);
- throttled (``source_throttled``): backs off with jitter, up to 30 s; an expired iterator
  (``source_iterator_expired``): a fresh one after the last record handed over; records
  trimmed away before they were read (``source_records_trimmed``, an error: what was lost,
  between which positions): starts again at the trim horizon; the service unreachable
  (``source_read_failed``): retried with backoff, logged once until it recovers;
- ends when the stream closes it and it is read to its end: ``shardEnded``, whose
  ``SHARD_END`` checkpoint is saved (``source_shard_ended``), and the stream is listed again.

``millisBehindLatest``: 0 after a page that was not full, else the time since the
last record's creation (DynamoDB Streams does not say how far behind a reader is).
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..api.adapter import adapter_change, dynamodb_record
from ..base.backoff import Backoff
from ..base.config import Settings
from ..base.logs import EventLogger, get_logger
from ..base.positions import Position
from ..errors import ConfigError
from .dynamodb import LIMIT, DynamoDBStreams, IteratorExpired, ShardInfo, Throttled, Trimmed, Unreachable
from .feed import LINE_LIMIT, Feed, FeedClosed
from .positions import SHARD_END, SavedPositions
from .spec import SourceSpec, Start

THROTTLE = Backoff(first=0.5, cap=30.0)
UNREACHABLE = Backoff(first=1.0, cap=30.0)
STOP_WAIT_S = 5.0  # past shutdown_timeout: how long a shard's feed gets once cancelled


class SourceReader:
    def __init__(self, spec: SourceSpec, start: Start, settings: Settings, *,
                 attach: Callable[[socket.socket], Awaitable[None]], empty_batches: bool = False,
                 qualify: bool = False, given_from: bool = False) -> None:
        """``attach`` serves a socket as an accepted connection (``Server.attach``);
        ``empty_batches``: hand caught-up empty pages over (a sink's watermarks);
        ``qualify``: shard ids as ``NAME/shardId`` (several sources in one server);
        ``given_from``: ``--from`` was given (refused where positions are saved)."""
        self.spec = spec
        self.start_at = start
        self.settings = settings
        self.attach = attach
        self.empty_batches = empty_batches
        self.qualify = qualify
        self.given_from = given_from
        self.log: EventLogger = get_logger("mldserver.sources").bind(source=spec.text)
        self.saved: SavedPositions | None = None
        self.streams: DynamoDBStreams | None = None
        self.task: asyncio.Task[None] | None = None
        self.listed: dict[str, ShardInfo] = {}
        self.reading: dict[str, asyncio.Task[None]] = {}
        self.feeds: dict[str, Feed] = {}
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------

    def prepare(self) -> None:
        """Read the saved positions; ``--from`` where some are saved is a ConfigError."""
        self.saved = SavedPositions.open(Path(self.settings.state_dir), self.spec.text)
        if self.given_from and len(self.saved):
            raise ConfigError(
                f"--from {self.settings.source_from}: {self.spec.text} has saved positions ({self.saved.path}), "
                f"where it resumes: pass --reset-positions to delete them and start from --from, or leave --from out")

    async def start(self) -> None:
        """Find the stream, list its shards and start reading (a table without a stream
        is a ConfigError; a service not answering yet is retried by the discovery loop)."""
        if self.saved is None:
            self.prepare()
        assert self.saved is not None
        s = self.settings
        self.streams = DynamoDBStreams(self.spec.name, region=s.aws_region, endpoint_url=s.aws_endpoint_url)
        await self.streams.__aenter__()
        try:
            arn = await self.streams.stream_arn()
        except Unreachable as exc:
            raise ConfigError(f"--source {self.spec.text}: {exc}: check the region, the credentials and the "
                              f"endpoint (AWS_ENDPOINT_URL_DYNAMODB for DynamoDB Local)") from None
        if self.saved.stream not in (None, arn) and len(self.saved):
            self.log.warning("source_stream_replaced", was=self.saved.stream, now=arn,
                             what_to_do="the table's stream was replaced (disabled and enabled again): the saved "
                                        "positions name the old stream's shards and are kept for them; the new "
                                        "stream's shards start from --from")
        await self.saved.set_stream(arn)
        self.log.info("source_started", stream=arn, start=self.start_at.kind, saved_shards=len(self.saved))
        self.task = asyncio.create_task(self._discover(), name=f"source {self.spec.text}")

    async def stop(self) -> None:
        """Each shard finishes the action under way, gets ``shutdownRequested`` (it may
        checkpoint) and is closed; past ``shutdown_timeout`` the rest is cancelled."""
        self._stop.set()
        tasks = list(self.reading.values())
        if self.task is not None:
            tasks.append(self.task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=STOP_WAIT_S)
        if self.streams is not None:
            await self.streams.__aexit__(None, None, None)
        self.log.info("source_stopped", shards=len(self.reading))

    # -- discovery ------------------------------------------------------------------

    async def _discover(self) -> None:
        """List the shards now, on the period, and when a shard ends; start those whose
        parents are done. A shard's task that fails (a bug) ends this one: the server
        logs task_crashed."""
        assert self.streams is not None and self.saved is not None
        failures = 0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                shards = await self.streams.shards()
            except (Throttled, Unreachable) as exc:
                if failures == 0:
                    self.log.warning("source_list_failed", error=str(exc),
                                     what_to_do="retried with backoff; check the endpoint, region and credentials")
                failures += 1
                await self._sleep(UNREACHABLE.delay(failures - 1))
                continue
            failures = 0
            self.listed = {s.shard_id: s for s in shards}
            gone = [s for s in self.saved.shard_ids() if s not in self.listed]
            if gone:
                await self.saved.forget(gone)
            for shard in shards:
                if shard.shard_id not in self.reading and self._may_start(shard):
                    self._start_shard(shard)
            for shard_id, task in list(self.reading.items()):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await self._sleep(self.settings.source_discovery_interval, wake=True)

    def _may_start(self, shard: ShardInfo) -> bool:
        assert self.saved is not None
        return may_start(shard, self.listed, self.saved.ended)

    def _start_shard(self, shard: ShardInfo) -> None:
        task = asyncio.create_task(self._read_shard(shard), name=f"source {self.spec.text} {shard.shard_id}")
        self.reading[shard.shard_id] = task
        task.add_done_callback(lambda _: self._wake.set())

    async def _sleep(self, seconds: float, *, wake: bool = False) -> None:
        """Sleep, cut short by stop (and by a shard's end, with ``wake``)."""
        waits = [asyncio.ensure_future(self._stop.wait())]
        if wake:
            waits.append(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _until_stopped(self, aw: Awaitable[Any]) -> Any:
        """``aw``'s result, or None if the source stops first (``aw`` cancelled)."""
        call = asyncio.ensure_future(aw)
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([call, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not call.done():
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            return None
        return call.result()

    # -- one shard ------------------------------------------------------------------

    async def _read_shard(self, shard: ShardInfo) -> None:
        assert self.streams is not None and self.saved is not None
        shard_id = shard.shard_id
        log = self.log.bind(shard_id=shard_id)
        saved = self.saved.get(shard_id)
        ours, theirs = socket.socketpair()
        try:
            await self.attach(theirs)
        except BaseException:
            theirs.close()
            ours.close()
            raise
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=LINE_LIMIT)

        async def store(position: Any) -> None:
            await self.saved.store(shard_id, position)  # type: ignore[union-attr]

        feed = Feed(reader, writer, f"{self.spec.name}/{shard_id}" if self.qualify else shard_id,
                    store=store, stored=saved)
        self.feeds[shard_id] = feed
        ended = False
        try:
            if isinstance(saved, Position):
                first: tuple[str, str | None] = ("AFTER_SEQUENCE_NUMBER", saved.text)
                await feed.initialize(saved.text, saved.sub)
            else:
                from_parent = any(p in self.listed for p in shard.parents)
                kind = "TRIM_HORIZON" if from_parent or self.start_at.kind != "latest" else "LATEST"
                first = (kind, None)
                await feed.initialize(kind)
            ended = await self._pump(shard, feed, first, log)
            if not ended:
                await feed.shutdown_requested()  # the source stops: the handler may checkpoint
        except FeedClosed as exc:
            if not self._stop.is_set():
                log.warning("source_shard_closed", error=str(exc),
                            what_to_do="the server closed the shard's connection; it is read again at the next start")
            return
        finally:
            await feed.close()
            self.feeds.pop(shard_id, None)
        if not ended:
            return
        if self.saved.ended(shard_id):
            log.info("source_shard_ended", position=feed.delivered.text if feed.delivered else None)
        else:
            log.error("source_shard_end_not_stored", stored=str(self.saved.get(shard_id)),
                      what_to_do="the handler's shard_ended did not checkpoint SHARD_END (checkpoint() with no "
                                 "sequence number): the shard's children are not read until a restart reads it "
                                 "to its end again and SHARD_END is stored")

    async def _pump(self, shard: ShardInfo, feed: Feed, first: tuple[str, str | None], log: EventLogger) -> bool:
        """Read the shard into the feed until it ends (True) or the source stops (False)."""
        shard_id = shard.shard_id
        streams = self.streams
        assert streams is not None
        poll = self.settings.source_poll_interval
        since = self.start_at.at_ms if self.start_at.kind == "time" else None
        if since is not None:
            since -= since % 1000  # the service's creation times are whole seconds
        iterator: str | None = None
        throttled = failures = 0
        started = False
        last: Position | None = feed.delivered
        while not self._stop.is_set():
            try:
                if iterator is None:
                    kind, after = ("AFTER_SEQUENCE_NUMBER", last.text) if last is not None else first
                    iterator = await self._until_stopped(streams.iterator(shard_id, kind, after))
                    if iterator is None:
                        return False
                    if not started:  # from here on, nothing written to the shard is missed
                        log.info("source_shard_started", start=kind, position=after, parents=list(shard.parents))
                        started = True
                page = await self._until_stopped(streams.records(iterator))
                if page is None:
                    return False
            except Throttled as exc:
                log.warning("source_throttled", error=str(exc), attempt=throttled)
                throttled += 1
                await self._sleep(THROTTLE.delay(throttled - 1))
                continue
            except IteratorExpired:
                log.info("source_iterator_expired", position=last.text if last else None)
                iterator = None
                continue
            except Trimmed as exc:
                log.error("source_records_trimmed", after=last.text if last else first[1], error=str(exc),
                          what_to_do="records between this position and the shard's trim horizon were removed by "
                                     "the stream (kept 24 hours) before they were read, and are lost; reading "
                                     "goes on at the trim horizon. Keep the server running, or read faster")
                iterator, last, first = None, None, ("TRIM_HORIZON", None)
                continue
            except Unreachable as exc:
                if failures == 0:
                    log.warning("source_read_failed", error=str(exc),
                                what_to_do="retried with backoff; check the endpoint, region and credentials")
                failures += 1
                await self._sleep(UNREACHABLE.delay(failures - 1))
                continue
            if failures:
                log.info("source_read_recovered", attempts=failures)
            throttled = failures = 0
            records = page.records
            if since is not None:
                records = [r for r in records if _created_ms(r) is None or _created_ms(r) >= since]  # type: ignore[operator]
            if records:
                batch = [dynamodb_record(adapter_change(r)) for r in records]
                full = len(page.records) >= LIMIT
                created = batch[-1].get("approximateArrivalTimestamp")
                behind = max(0, int(time.time() * 1000) - created) if full and created else 0
                await feed.process_records(batch, behind)
                last = feed.delivered
            elif page.next_iterator is not None and self.empty_batches and not page.records:
                await feed.process_records([], 0)
            elif page.records:  # all skipped (--from a time): the iterator moves on past them
                pass
            iterator = page.next_iterator
            if iterator is None:
                await feed.shard_ended()
                return True
            if len(page.records) >= LIMIT:
                continue
            await self._sleep(poll if not page.records else poll / 4)
        return False


def may_start(shard: ShardInfo, listed: dict[str, ShardInfo] | set[str], ended: Callable[[str], bool]) -> bool:
    """May ``shard`` be read now? Not if it is read to its end already; else once each
    parent is read to its end (``ended``) or gone from the stream (not ``listed``)::

        may_start(ShardInfo("child", ("parent",), False), {"parent", "child"}, ended={"parent"}.__contains__)  # True
    """
    if ended(shard.shard_id):
        return False
    return all(p not in listed or ended(p) for p in shard.parents)


def _created_ms(api_record: dict[str, Any]) -> int | None:
    created = (api_record.get("dynamodb") or {}).get("ApproximateCreationDateTime")
    if created is None:
        return None
    seconds = created.timestamp() if hasattr(created, "timestamp") else float(created)
    return round(seconds * 1000)
