"""One source read by the server itself (``mldserver serve --source dynamodb:orders``,
``--source kinesis:clicks``):
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
- starts after its saved position (``initialize`` carries it; the iterator is the
  service's ``resume``: DynamoDB ``AFTER_SEQUENCE_NUMBER``, Kinesis ``AT_SEQUENCE_NUMBER``
  with every user record up to the saved one skipped, so a position inside a KPL
  aggregate resumes at its next user record), else where ``--from`` says
  (``first_iterator``): ``TRIM_HORIZON``, ``LATEST``, or, for a time, Kinesis's
  ``AT_TIMESTAMP`` (the SDK sends it in whole seconds, so the records of that second
  that arrived before the time are skipped here). DynamoDB Streams has none, so there a
  time reads the shard from its trim horizon (up to 24 hours of records), and the
  creation time is the service's ``ApproximateCreationDateTime``, in whole seconds: the
  time is taken down to its second, so a record created in that second before it is
  kept and none after it is skipped (DynamoDB Local's times are whole minutes). A child
  of a shard read here starts at ``TRIM_HORIZON`` whatever ``--from`` says (else
  ``latest`` would lose the records written between the split and the child's first read);
- reads a page (up to 1,000 DynamoDB records, 10,000 Kinesis ones), hands it over as
  one ``processRecords`` and waits for its status; then reads again at once when the
  page was full, after a quarter of ``source_poll_interval`` when it was not, after the
  whole interval when it was empty (with a sink, an empty page is handed over too, as
  an empty batch caught up, ``millisBehindLatest`` 0: the shard's watermark follows the
  clock);
- is read through a ``cursor.ShardCursor`` (shared with the Python API, ``stream``):
  throttled (``source_throttled``): backs off with jitter, up to 30 s; an expired iterator
  (``source_iterator_expired``): a fresh one after the last record handed over; records
  trimmed away before they were read (``source_records_trimmed``, an error: what was lost,
  between which positions): starts again at the trim horizon; the service unreachable
  (``source_read_failed``): retried with backoff, logged once until it recovers;
- ends when the stream closes it and it is read to its end: ``shardEnded``, whose
  ``SHARD_END`` checkpoint is saved (``source_shard_ended``), and the stream is listed again;
- whose position the stream does not have (the service's ``ResourceNotFoundException``,
  ``InvalidArgumentException``, ``ValidationException``: a sequence number past the
  shard's end, or another shard's) stops the server with one line, exit 2, never a retry
  for ever (``source_position_invalid``)::

    mldserver: --source kinesis:clicks: the saved position of shardId-000000000000 (after 4968...,
    in state/sources/kinesis_3aclicks.json) is not in the stream (...): ... pass --reset-positions ...

  (a shard gone from the stream meanwhile just ends, ``source_shard_gone``; records
  trimmed away are the cursor's ``source_records_trimmed``).

The stream itself is asked for again at each listing (``identity``): deleted, its shards
wait for it (``source_stream_deleted``); created again under its name (a Kinesis stream's
creation time, a table's latest stream), every shard's reading stops (``shutdownRequested``),
the coordinator forgets the old shards (``restart``: the same ids name new shards), the
old positions are dropped and the new stream is read from its trim horizon
(``source_stream_recreated`` with ``running``).

With ``--lease-table`` (``shard_leases``) the reader reads only the shards whose lease
this server holds: their leases are kept in a task of their own (a cycle every third
of a lease period: renewed, taken, stolen as ``balance`` says), each shard's reading
starts once its lease is taken here (from the position in its lease item) and stops at
once when it is lost (``source_shard_lease_lost``: its shard gets ``leaseLost`` after
the action under way; a checkpoint meanwhile is refused with ``ShutdownException``, as
the KCL answers a zombie). A child shard is leased nowhere before its parents'
``SHARD_END`` is stored, whichever server read them. At a clean stop the shards finish
(their leases renewed meanwhile, none taken), their positions are written, and the
leases are released for the other servers to take at once.

Two reads of one shard are ``read_interval`` apart at least (Kinesis allows 5
GetRecords a second per shard). ``millisBehindLatest``: Kinesis's own; for DynamoDB 0
after a page that was not full, else the time since the last record's creation.
The services are ``service.Service``s (``dynamodb``, ``kinesis``); all else is shared.
Each shard's own reading, from its feed's ``initialize`` to how it ends, is
``shard_reading.ShardReading``; this module lists, starts and stops them.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..base.config import Settings
from ..base.logs import EventLogger, get_logger
from ..errors import ConfigError
from .dynamodb import DynamoDBStreams
from .kinesis import KinesisStreams
from .cursor import UNREACHABLE, sleep
from .service import Invalid, ListedShard, NotFound, Service, Throttled, Unreachable
from .shard_leases import ShardLeases
from .shard_reading import ShardReading
from .positions import SavedPositions
from .spec import SourceSpec, Start

STOP_WAIT_S = 5.0  # past shutdown_timeout: how long a shard's feed gets once cancelled


class SourceReader:
    def __init__(self, spec: SourceSpec, start: Start, settings: Settings, *,
                 attach: Callable[[socket.socket], Awaitable[None]], empty_batches: bool = False,
                 qualify: bool = False, given_from: bool = False,
                 lineage: Callable[[str, tuple[str, ...]], None] | None = None,
                 restart: Callable[[str], None] | None = None) -> None:
        """``attach`` serves a socket as an accepted connection (``Server.attach``);
        ``empty_batches``: hand caught-up empty pages over (a sink's watermarks);
        ``qualify``: shard ids as ``NAME/shardId`` (several sources in one server);
        ``given_from``: ``--from`` was given (refused where positions are saved);
        ``lineage``: told each shard's parents before the shard starts (the
        coordinator's ``Lineage.given``: no parent guessed); ``restart``: told each
        shard id of a stream deleted and created again while read (the coordinator's
        ``restart_shard``: the id names a new shard)."""
        self.spec = spec
        self.start_at = start
        self.settings = settings
        self.attach = attach
        self.empty_batches = empty_batches
        self.qualify = qualify
        self.given_from = given_from
        self.lineage = lineage
        self.restart = restart
        self.log: EventLogger = get_logger("mldserver.sources").bind(source=spec.text)
        self.saved: SavedPositions | None = None
        self.streams: Service | None = None
        self.task: asyncio.Task[None] | None = None
        self.listed: dict[str, ListedShard] = {}
        self.reading: dict[str, asyncio.Task[None]] = {}
        self.shards: dict[str, ShardReading] = {}  # the shards started (``shard_reading.py``)
        self.stream: str | None = None  # the stream's ARN, once found
        self.created: int | None = None  # its creation time, where the ARN does not say (Kinesis)
        self.renewed = False  # the stream was created again while read: its shards from TRIM_HORIZON
        self._deleted_logged = False
        self.leases: ShardLeases | None = None  # --lease-table
        self._stop = asyncio.Event()  # every shard's reading stops: the reader's stop, the stream made again
        self._closing = asyncio.Event()  # the reader's stop
        self._wake = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------

    def prepare(self) -> None:
        """Read the saved positions; ``--from`` where some are saved is a ConfigError
        (with a lease table, both at ``start``: the positions are in the table)."""
        if self.settings.lease_table:
            return
        self.saved = SavedPositions.open(Path(self.settings.state_dir), self.spec.text)
        if self.given_from and len(self.saved):
            raise ConfigError(
                f"--from {self.settings.source_from}: {self.spec.text} has saved positions ({self.saved.path}), "
                f"where it resumes: pass --reset-positions to delete them and start from --from, or leave --from out")

    async def start(self) -> None:
        """Find the stream, list its shards and start reading (a table without a stream
        is a ConfigError; a service not answering yet is retried by the discovery loop)."""
        s = self.settings
        if self.saved is None and not s.lease_table:
            self.prepare()
        service = KinesisStreams if self.spec.kind == "kinesis" else DynamoDBStreams
        self.streams = service(self.spec.name, region=s.aws_region, endpoint_url=s.aws_endpoint_url)
        await self.streams.__aenter__()
        try:
            arn = await self.streams.stream_arn()
        except Unreachable as exc:
            raise ConfigError(f"--source {self.spec.text}: {exc}: check the region, the credentials and the "
                              f"endpoint ({self.streams.endpoint_hint})") from None
        self.stream, self.created = arn, self.streams.created
        if s.lease_table:
            await self._open_leases()
            self.task = asyncio.create_task(self._lead(), name=f"source {self.spec.text}")
            return
        await self._begin()
        self.task = asyncio.create_task(self._discover(), name=f"source {self.spec.text}")

    async def _begin(self) -> None:
        """The saved positions tied to the stream found; ``source_started``."""
        assert self.saved is not None and self.stream is not None
        arn, created, saved = self.stream, self.streams.created, self.saved
        if saved.stream not in (None, arn) and len(saved):
            self.log.warning("source_stream_replaced", was=saved.stream, now=arn,
                             what_to_do="the table's stream was replaced (disabled and enabled again): the saved "
                                        "positions name the old stream's shards and are kept for them; the new "
                                        "stream's shards start from --from")
        elif saved.stream == arn and None not in (saved.created, created) and saved.created != created and len(saved):
            self.log.warning("source_stream_recreated", stream=arn, was_created=saved.created, created=created,
                             shards=len(saved),
                             what_to_do="the stream was deleted and created again under its name: its shards have "
                                        "the old shards' ids but none of their records, so the old positions are "
                                        "dropped and every shard starts from --from (records the server handled "
                                        "from the old stream are not read again)")
            await saved.restart(arn, created)
        await saved.set_stream(arn, created)
        self.created = created
        self.log.info("source_started", stream=arn, start=self.start_at.kind, saved_shards=len(self.saved))

    async def stop(self) -> None:
        """Each shard finishes the action under way, gets ``shutdownRequested`` (it may
        checkpoint) and is closed; past ``shutdown_timeout`` the rest is cancelled."""
        self._closing.set()
        if self.leases is not None:
            self.leases.draining = True  # renewed while the shards finish; none taken
        self._halt()
        await self._finish([*self.reading.values(), *([self.task] if self.task is not None else [])])
        if self.leases is not None:
            await self.leases.release_all()  # the shards' last positions written: peers take them at once
            await self.leases.__aexit__(None, None, None)
        if self.streams is not None:
            await self.streams.__aexit__(None, None, None)
        self.log.info("source_stopped", shards=len(self.reading))

    def lags(self) -> dict[str, int | None]:
        """Each shard being read: how far behind its head its last page was, in ms
        (``cursor.lag_ms``: Kinesis's MillisBehindLatest; DynamoDB, the age of the last
        change read; None before its first page)::

            reader.lags() == {"shardId-000000000000": 0, "shardId-000000000001": 5200}
        """
        return {shard_id: reading.cursor.lag_ms for shard_id, reading in list(self.shards.items())
                if reading.cursor is not None}

    def status(self) -> dict[str, Any]:
        """What /status shows of the source::

            {"source": "dynamodb:orders", "stream": "arn:aws:dynamodb:...",
             "shards": [{"shard_id": "shardId-...", "lag_ms": 0}],
             "lease": {"table": "orders-leases", "owner": "host-a:4242:9f2c1e07",
                       "held": ["shardId-..."], "shards": 4, "servers": 2}}

        (``lease``: the shards' leases held here, of ``shards`` that may be read now, and
        the servers holding live leases of them, this one included; null without
        ``--lease-table``)."""
        out: dict[str, Any] = {"source": self.spec.text, "stream": self.stream,
                               "shards": [{"shard_id": shard_id, "lag_ms": lag}
                                          for shard_id, lag in sorted(self.lags().items())],
                               "lease": None}
        if self.leases is not None:
            out["lease"] = self.leases.status()
        return out

    def _halt(self) -> None:
        """Every shard's reading stops."""
        self._stop.set()
        for reading in self.shards.values():
            reading.stop.set()

    # -- the shards' leases (--lease-table) -------------------------------------------

    async def _open_leases(self) -> None:
        """Open the lease table (created if absent) and read the source's leases;
        ``--from`` where positions are kept there is a ConfigError, as with the state dir's."""
        s = self.settings
        assert s.lease_table is not None and self.stream is not None
        leases = ShardLeases(s.lease_table, self.spec.text, period_s=s.lease_period, region=s.aws_region,
                             log=self.log, on_lost=self._shard_lease_lost, on_change=self._wake.set)
        try:
            await leases.__aenter__()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"--lease-table {s.lease_table}: cannot open it ({type(exc).__name__}: {exc}): check "
                              f"the region, the credentials and the endpoint (AWS_ENDPOINT_URL_DYNAMODB)") from None
        try:
            await leases.bind(self.stream, self.created)
        except Exception as exc:
            await leases.__aexit__(None, None, None)
            raise ConfigError(f"--lease-table {s.lease_table}: cannot read it ({type(exc).__name__}: {exc}): check "
                              f"the region, the credentials and the endpoint (AWS_ENDPOINT_URL_DYNAMODB)") from None
        self.leases = self.saved = leases
        if self.given_from and leases.checkpointed():
            await leases.__aexit__(None, None, None)
            raise ConfigError(
                f"--from {s.source_from}: {self.spec.text} has saved positions (in the lease table "
                f"{s.lease_table}), where it resumes: pass --reset-positions to delete them and start from --from, "
                f"or leave --from out")
        self.log.info("source_started", stream=self.stream, start=self.start_at.kind,
                      saved_shards=leases.checkpointed(), lease_table=s.lease_table, owner=leases.owner)

    async def _lead(self) -> None:
        """Keep the shards' leases (a cycle every period/3) and read the shards held
        here, until the reader stops; then the shards finish while the leases are
        renewed (``stop`` releases them)."""
        leases = self.leases
        assert leases is not None
        kept = asyncio.Event()  # renewals go on until the shards have finished (their last checkpoints)
        keeping = asyncio.create_task(leases.run(kept), name=f"source {self.spec.text} leases")
        discovering = asyncio.create_task(self._discover(), name=f"source {self.spec.text} shards")
        try:
            await asyncio.wait([keeping, discovering], return_when=asyncio.FIRST_COMPLETED)
            if discovering.done():
                discovering.result()  # a shard's task failed (a bug): the server logs task_crashed
            if keeping.done():
                keeping.result()  # (a bug: it returns only once kept)
            await asyncio.wait([*self.reading.values(), discovering])  # the reader stops: its shards finish
        finally:
            kept.set()
            await asyncio.gather(keeping, return_exceptions=True)
            discovering.cancel()
            await asyncio.gather(discovering, return_exceptions=True)

    def _shard_lease_lost(self, shard_id: str) -> None:
        """A shard's lease is gone: its reading stops at once (after the action under
        way, ``leaseLost``)."""
        reading = self.shards.get(shard_id)
        if reading is not None:
            reading.lease_lost = True
            reading.stop.set()
        self._wake.set()

    async def _finish(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Wait up to ``shutdown_timeout`` for ``tasks``; cancel what is left, and give
        it ``STOP_WAIT_S`` to end."""
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT_S)

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
                if not await self._same_stream():
                    continue
                shards = await self.streams.shards()
            except (Throttled, Unreachable, NotFound, Invalid) as exc:
                if failures == 0:
                    self.log.warning("source_list_failed", error=str(exc),
                                     what_to_do="retried with backoff; check the endpoint, region and credentials")
                failures += 1
                await self._sleep(UNREACHABLE.delay(failures - 1))
                continue
            failures = 0
            self.listed = {s.shard_id: s for s in shards}
            if self.leases is not None:
                self.leases.offer(shards)
            gone = [s for s in self.saved.shard_ids() if s not in self.listed]
            if gone:
                await self.saved.forget(gone)
            for shard_id, task in list(self.reading.items()):
                if not task.done():
                    continue
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
                # ended or gone: never read again, not kept (shards roll over for months); with
                # leases, a shard let go may be taken again, and is then read again at once
                if shard_id not in self.listed or self.saved.ended(shard_id) or self.leases is not None:
                    del self.reading[shard_id]
                    self.shards.pop(shard_id, None)
            for shard in shards:
                if shard.shard_id not in self.reading and self._may_start(shard) and self._held(shard.shard_id):
                    self._start_shard(shard)
            await self._sleep(self.settings.source_discovery_interval, wake=True)

    async def _same_stream(self) -> bool:
        """Is the stream still the one being read? Deleted: wait for it (logged once);
        created again under its name (Kinesis: its creation time; a table: its latest
        stream): every shard's reading stops, the old positions are dropped, and the new
        stream's shards are read from their trim horizon."""
        assert self.streams is not None and self.saved is not None
        now = await self.streams.identity()
        if now == (self.stream, self.created):
            self._deleted_logged = False
            return True
        if now is None:
            if not self._deleted_logged:
                self.log.warning("source_stream_deleted", stream=self.stream,
                                 what_to_do="the stream (or the table's stream) is gone: its shards are not read; "
                                            "once it is created again, it is read from its trim horizon")
                self._deleted_logged = True
            await self._sleep(self.settings.source_discovery_interval, wake=True)
            return False
        arn, created = now
        self._halt()  # every shard's reading stops: its action finished, shutdownRequested
        await self._finish(list(self.reading.values()))
        if self._closing.is_set():
            return False  # (stop stays set: the reader stops)
        old = set(self.reading) | set(self.saved.shard_ids())
        self.reading, self.listed, self.shards = {}, {}, {}
        if self.restart is not None:
            for shard_id in sorted(old):
                self.restart(self.name(shard_id))
        self.log.warning("source_stream_recreated", stream=arn, was=self.stream, was_created=self.created,
                         created=created, shards=len(old), running=True,
                         what_to_do="the stream was deleted and created again while read: the old positions are "
                                    "dropped and the new stream is read from its trim horizon")
        await self.saved.restart(arn, created)
        self.streams.follow(arn, created)
        self.stream, self.created, self.renewed, self._deleted_logged = arn, created, True, False
        self._stop.clear()
        return False

    def name(self, shard_id: str) -> str:
        """The shard's id as the server knows it (``NAME/shardId`` with several sources)."""
        return f"{self.spec.name}/{shard_id}" if self.qualify else shard_id

    def _may_start(self, shard: ListedShard) -> bool:
        assert self.saved is not None
        return may_start(shard, self.listed, self.saved.ended)

    def _held(self, shard_id: str) -> bool:
        """May this server read the shard (without ``--lease-table``, every one)?"""
        return self.leases is None or self.leases.holds(shard_id)

    def _start_shard(self, shard: ListedShard) -> None:
        self.shards[shard.shard_id] = ShardReading(self, shard, halted=self._stop, wake=self._wake.set)
        task = asyncio.create_task(self._read_shard(shard), name=f"source {self.spec.text} {shard.shard_id}")
        self.reading[shard.shard_id] = task
        task.add_done_callback(lambda _: self._wake.set())

    async def _sleep(self, seconds: float, *, wake: bool = False) -> None:
        """Sleep, cut short by stop (and by a shard's end, with ``wake``)."""
        await sleep(seconds, self._stop, *([self._wake] if wake else []))

    # -- one shard ------------------------------------------------------------------

    async def _read_shard(self, shard: ListedShard) -> None:
        await self.shards[shard.shard_id].run()


def may_start(shard: ListedShard, listed: dict[str, ListedShard] | set[str], ended: Callable[[str], bool]) -> bool:
    """May ``shard`` be read now? Not if it is read to its end already; else once each
    parent is read to its end (``ended``) or gone from the stream (not ``listed``)::

        may_start(ListedShard("child", ("parent",), False), {"parent", "child"}, ended={"parent"}.__contains__)  # True
    """
    if ended(shard.shard_id):
        return False
    return all(p not in listed or ended(p) for p in shard.parents)

