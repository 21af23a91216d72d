"""One shard of a source read into the server, from its first page to how it ends: a
socket pair attached as a daemon's connection (``Feed``), ``initialize`` at its saved
position or where ``--from`` says (``first_iterator``), its pages handed over as
``processRecords`` (``cursor.ShardCursor``), then ``shardEnded`` (read to its end),
``leaseLost`` (its lease taken elsewhere) or ``shutdownRequested`` (the source stops).
A position the stream does not have stops the server (``source_position_invalid``).

The reader (``reader.py``) makes one per shard it starts, keeps it while it is read,
and runs it in the shard's task::

    reading = ShardReading(reader, shard, halted=reader_stop, wake=wake_discovery)
    reader.shards[shard.shard_id] = reading
    task = asyncio.create_task(reading.run())
    reading.lease_lost = True; reading.stop.set()   # its lease lost: leaseLost after the action under way
    reading.cursor.lag_ms                           # while its pages are read (None before and after)
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Awaitable, Callable, Protocol

from ..base.config import Settings
from ..base.logs import EventLogger
from ..base.positions import Position
from ..errors import ConfigError
from .cursor import ShardCursor, sleep
from .feed import LINE_LIMIT, CheckpointRefused, Feed, FeedClosed
from .positions import SHARD_END, SavedPositions
from .service import Invalid, ListedShard, NotFound, Service, Throttled, Unreachable
from .shard_leases import LeaseNotHeld
from .spec import SourceSpec, Start


class ReaderParts(Protocol):
    """What a shard's reading reads of its source's reader (``reader.SourceReader``)."""

    spec: SourceSpec
    start_at: Start
    settings: Settings
    attach: Callable[[socket.socket], Awaitable[None]]
    empty_batches: bool
    lineage: Callable[[str, tuple[str, ...]], None] | None
    log: EventLogger
    streams: Service | None
    saved: SavedPositions | None  # this term's positions (a ShardLeases with --lease-table)
    stream: str | None  # the stream's identity: its ARN and creation time
    created: int | None
    renewed: bool  # the stream was created again while read: new shards from TRIM_HORIZON
    listed: dict[str, ListedShard]  # the shards of the last listing

    def name(self, shard_id: str) -> str: ...


class ShardReading:
    def __init__(self, reader: ReaderParts, shard: ListedShard, *, halted: asyncio.Event,
                 wake: Callable[[], None]) -> None:
        """``halted``: every shard's reading stops (the reader's stop, the stream made
        again); ``wake``: discovery looks again now."""
        self.reader = reader
        self.shard = shard
        self.halted = halted
        self.wake = wake
        self.log: EventLogger = reader.log.bind(shard_id=shard.shard_id)
        self.stop = asyncio.Event()  # its reading stops: set with ``halted``, or its lease lost
        if halted.is_set():
            self.stop.set()  # (started as the reader stops: it does not read)
        self.lease_lost = False  # its lease was lost: it gets leaseLost
        self.cursor: ShardCursor | None = None  # while its pages are read

    async def run(self) -> None:
        reader, shard = self.reader, self.shard
        assert reader.streams is not None and reader.saved is not None
        shard_id = shard.shard_id
        log = self.log
        saved = reader.saved.get(shard_id)
        ours, theirs = socket.socketpair()
        try:
            await reader.attach(theirs)
        except BaseException:
            theirs.close()
            ours.close()
            raise
        stream_reader, writer = await asyncio.open_unix_connection(sock=ours, limit=LINE_LIMIT)
        positions = reader.saved  # this term's (a lease lost and taken again: new ones)
        assert positions is not None

        async def store(position: Any) -> None:
            try:
                await positions.store(shard_id, position)
            except LeaseNotHeld:
                raise CheckpointRefused("ShutdownException") from None  # as the KCL answers a lost lease
            if position == SHARD_END:  # said now, before discovery can start a child (no await between)
                cursor = self.cursor
                log.info("source_shard_ended", position=feed.delivered.text if feed.delivered else None,
                         children=list(cursor.children if cursor is not None else ()))

        name = reader.name
        if reader.lineage is not None:
            reader.lineage(name(shard_id), tuple(map(name, shard.parents)))
        feed = Feed(stream_reader, writer, name(shard_id), store=store, stored=saved)
        ended = False
        try:
            if isinstance(saved, Position):
                first: tuple[str, str | None] = (reader.streams.resume, saved.text)
                await feed.initialize(saved.text, saved.sub)
            else:
                from_parent = reader.renewed or any(p in reader.listed for p in shard.parents)
                kind = first_iterator(reader.start_at, from_parent=from_parent,
                                      at_timestamp=reader.streams.at_timestamp)
                first = (kind, None)
                await feed.initialize(kind)
            try:
                children = await self._pump(feed, first)
            except (NotFound, Invalid) as exc:
                children = await self._not_found(saved, exc)
            ended = children is not None
            if not ended and self.lease_lost:
                await feed.lease_lost()  # another server reads it now: the handler lets go
                log.info("source_shard_lease_lost", position=feed.stored if feed.stored == SHARD_END
                         else getattr(feed.stored, "text", None))
            elif not ended:
                await feed.shutdown_requested()  # the source stops: the handler may checkpoint
        except FeedClosed as exc:
            if not (self.stop.is_set() or self.halted.is_set()):
                log.warning("source_shard_closed", error=str(exc),
                            what_to_do="the server closed the shard's connection; it is read again at the next start")
            return
        finally:
            await feed.close()
            self.cursor = None
        if not ended:
            return
        # (its lease lost: the SHARD_END checkpoint was refused, and the new owner ends it)
        if feed.stored != SHARD_END and not self.lease_lost:
            log.error("source_shard_end_not_stored", stored=str(feed.stored),
                      what_to_do="the handler's shard_ended did not checkpoint SHARD_END (checkpoint() with no "
                                 "sequence number): the shard's children are not read until a restart reads it "
                                 "to its end again and SHARD_END is stored")

    async def _not_found(self, saved: Any, exc: Exception) -> None:
        """The service says what was asked of the shard does not exist: the stream is
        gone or was created again (discovery sees to it: this shard waits for its stop),
        the shard is gone (trimmed: it ends here), or the position the shard resumes
        after is not in it: ``source_position_invalid`` and a ConfigError (the server
        stops; ``--reset-positions`` is the way on), never a retry for ever."""
        reader, shard = self.reader, self.shard
        assert reader.streams is not None
        cursor = self.cursor
        position = cursor.last if cursor is not None else None
        try:
            same = await reader.streams.identity() == (reader.stream, reader.created)
            listed = same and shard.shard_id in {s.shard_id for s in await reader.streams.shards()}
        except (Throttled, Unreachable, NotFound, Invalid):
            same = listed = False  # not known now: discovery finds out
        if not same:
            self.wake()
            await self.halted.wait()  # discovery stops the shards of a stream gone or created again
            return None
        if not listed:
            self.log.info("source_shard_gone", position=position.text if position is not None else None,
                          error=str(exc))
            return None
        if position is None:
            raise exc  # (no position asked for: nothing a user can do; task_crashed says what)
        settings, spec = reader.settings, reader.spec
        where = (f"the lease table {settings.lease_table}" if settings.lease_table
                 else str(reader.saved.path if reader.saved is not None else "the state dir"))
        whose = "saved position" if position == saved else "position"
        what_to_do = (f"the positions of {spec.text} are not this stream's (another stream's, or edited): "
                      f"pass --reset-positions to delete them and read from --from (records of the stream handled "
                      f"before may be handled again), or repair {where}")
        self.log.error("source_position_invalid", position=position.text, sub=position.sub, where=where,
                       error=str(exc), what_to_do=what_to_do)
        raise ConfigError(f"--source {spec.text}: the {whose} of {shard.shard_id} (after {position.text}, in "
                          f"{where}) is not in the stream ({exc}): {what_to_do}")

    async def _pump(self, feed: Feed, first: tuple[str, str | None]) -> tuple[str, ...] | None:
        """Read the shard into the feed until it ends (its children, as the last page
        names them) or the source stops (None)."""
        reader = self.reader
        streams = reader.streams
        assert streams is not None
        poll = reader.settings.source_poll_interval
        start_at = reader.start_at
        at_ms = start_at.at_ms if start_at.kind == "time" else None
        stop = self.stop
        cursor = ShardCursor(streams, self.shard, first, log=self.log, last=feed.delivered, since_ms=at_ms,
                             at_ms=at_ms, stop=stop)
        self.cursor = cursor
        while not stop.is_set():
            page = await cursor.read()
            if page is None:
                return None
            if page.records:
                await feed.process_records(page.records, page.behind_ms)
                cursor.last = feed.delivered
            elif not cursor.ended and reader.empty_batches and not page.read:
                await feed.process_records([], page.behind_ms or 0)
            # (a page all skipped: --from a time, or a resume's records read again: the iterator moves on)
            if cursor.ended:
                await feed.shard_ended()  # (its SHARD_END stored: source_shard_ended)
                return page.children
            if page.read >= streams.limit or (not page.read and (page.behind_ms or 0) > 0):
                continue  # more is there: read again (no sooner than read_interval)
            await sleep(poll if not page.read else poll / 4, stop)
        return None


def first_iterator(start: Start, *, from_parent: bool, at_timestamp: bool) -> str:
    """Where a shard with no saved position starts: a child of a shard read here at
    its trim horizon whatever ``--from`` says (else ``latest`` would lose what was
    written between the split and its first read); else as ``--from`` says (a time:
    ``AT_TIMESTAMP`` where the service has it, else the trim horizon, skipping)::

        first_iterator(Start("time", 1769767200000), from_parent=False, at_timestamp=True)  # "AT_TIMESTAMP"
    """
    if from_parent or start.kind == "trim_horizon":
        return "TRIM_HORIZON"
    if start.kind == "latest":
        return "LATEST"
    return "AT_TIMESTAMP" if at_timestamp else "TRIM_HORIZON"
