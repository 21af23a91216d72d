"""The worker: one per shard connection, the gen_statem role of erlmld.

It drives the sans-IO :class:`~mldserver.protocol.Connection` with what the relay
reads from the daemon, calls the user's handler for each action, and answers every
action with exactly one status. It owns the policies PROTOCOL.md leaves to the child::

    initialize         -> handler.initialize(shard)                       -> status
    processRecords     -> handler.process_records(batch, checkpointer)    -> status
    shutdownRequested  -> handler.shutdown_requested(checkpointer)        -> status
    shardEnded / shutdown TERMINATE
                       -> handler.shard_ended(checkpointer); SHARD_END stored (retried)
                                                                          -> status
    leaseLost / shutdown ZOMBIE -> handler.lease_lost()                  -> status

- A handler call that raises or runs past ``execution_timeout`` is retried
  ``handler_retries`` times with backoff; a batch that still fails is dead-lettered
  (with its data) and the conversation goes on. A ``CheckpointError`` escaping the
  handler ends the action at once, without a retry.
- A line the daemon should never send (not JSON, out of order) is logged with the
  shard and what arrived, dead-lettered if it carried records, and, if it was an
  action, answered with its status so the daemon neither hangs nor exits.
- With a sink configured, each processed batch's rows (``batch.emit``) go to the
  shared coordinator. Every checkpoint is clamped to what the sink has committed; the
  worker itself checkpoints that at most every ``checkpoint_interval`` on
  ``processRecords``, and always on ``shutdownRequested``; on ``shardEnded`` the
  shard's uncommitted rows are spooled before SHARD_END is stored. A shard running
  ahead of the watermark while the coordinator is over its memory cap gets its status
  late (back-pressure); it gives up its in-flight slot first.
- Nothing here touches another connection: every failure stays on its shard.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable

import orjson

from .backoff import Backoff
from .checkpointer import Checkpointer
from .config import Settings
from .deadletter import DeadLetters
from .errors import CheckpointError
from .kpl import deaggregate, is_aggregate
from .logs import EventLogger
from .protocol import (
    NEED_DATA,
    Action,
    Checkpoint,
    CheckpointReply,
    Connection,
    ConnectionClosed,
    Dialect,
    Event,
    Initialize,
    LeaseLost,
    ProcessRecords,
    RemoteProtocolError,
    ShardEnded,
    Shutdown,
    ShutdownRequested,
    State,
    Status,
)
from .records import Batch, Record, ShardInfo

if TYPE_CHECKING:
    from .coordinator import Coordinator

READ_CHUNK = 1 << 20
# Waiting for the daemon's next action: the only time a worker takes a slot.
BETWEEN_ACTIONS = frozenset({State.AWAITING_INITIALIZE, State.READY, State.DRAINING})


def _encode(row: Any) -> bytes:
    # A right-sized copy: orjson's own result sits in an over-allocated, shrunk malloc
    # block; kept by the thousand until their window commits, those fragment the heap
    # (5x slower, several times the memory).
    return bytes(memoryview(orjson.dumps(row)))


class Worker:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        factory: Callable[[Any], Any],
        context: Any,
        settings: Settings,
        dead_letters: DeadLetters,
        log: EventLogger,
        slots: asyncio.Semaphore | None = None,
        coordinator: "Coordinator | None" = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.factory = factory
        self.context = context
        self.settings = settings
        self.dead_letters = dead_letters
        self.log = log
        self.slots = slots  # shared by all workers: bounds decoded batches in memory
        self._holding = False
        self.coordinator = coordinator
        self.delivered: tuple[int, int, str] | None = None  # last record delivered on this connection
        self.stored: tuple[int, int] | None = None  # the lease's checkpoint, as far as we know
        self._last_checkpoint = time.monotonic()
        self.conn = Connection(settings.max_line_size)
        self.handler: Any = None
        self.shard: ShardInfo | None = None
        self.busy = False  # inside an action (between reading it and sending its status)
        self.stopping = False
        self.latest_records: list[Record] = []  # the latest batch, for default sub-sequences
        self._handler_backoff = Backoff(first=settings.handler_backoff, cap=max(settings.handler_backoff, 5.0))
        self._checkpoint_backoff = Backoff(first=settings.checkpoint_backoff, cap=settings.checkpoint_backoff_cap)
        self.batches = 0
        self.records = 0

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        try:
            while not self.stopping:
                event = await self._next_event()
                if isinstance(event, ConnectionClosed):
                    break
                if isinstance(event, CheckpointReply):
                    self.log.error("unexpected_line", error="checkpoint reply with no checkpoint outstanding")
                    continue
                self.busy = True
                try:
                    await self._dispatch(event)
                finally:
                    del event  # a batch must not stay alive while the shard waits for the next
                    self.busy = False
                    self._release()
        finally:
            self._release()
            self.log.info("closed", batches=self.batches, records=self.records, state=self.conn.state.name)
            self.writer.close()

    async def _next_event(self) -> Event:
        while True:
            try:
                event = self.conn.next_event()
            except RemoteProtocolError as exc:
                await self._bad_line(exc)
                continue
            if event is NEED_DATA:
                data = await self.reader.read(READ_CHUNK)
                if data and self.slots is not None and not self._holding and self.conn.state in BETWEEN_ACTIONS:
                    # The first bytes of the next action: wait for a slot before taking
                    # more of it into memory (the daemon sends one action at a time).
                    await self.slots.acquire()
                    self._holding = True
                self.conn.receive_data(data)
                continue
            return event  # type: ignore[return-value]

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.slots.release()  # type: ignore[union-attr]

    async def _send(self, event: Event) -> None:
        self.writer.write(self.conn.send(event))
        await self.writer.drain()

    async def _bad_line(self, exc: RemoteProtocolError) -> None:
        shard_id = self.conn.shard_id
        self.log.error(
            "bad_line",
            error=str(exc),
            action=exc.action,
            line=exc.line[:200].decode("utf-8", "replace"),
            what_to_do="the daemon sent something the protocol does not allow; see the line above",
        )
        if exc.line and (exc.action is None or exc.action == "processRecords"):
            path = await self.dead_letters.line(shard_id, exc.line, reason=str(exc))
            self.log.error("dead_lettered", reason="bad line", path=str(path))
        if exc.action is not None:
            await self._send(Status(response_for=exc.action))

    # -- actions -----------------------------------------------------------------

    async def _dispatch(self, event: Event) -> None:
        if isinstance(event, Initialize):
            await self._initialize(event)
        elif isinstance(event, ProcessRecords):
            await self._process_records(event)
        elif isinstance(event, ShutdownRequested):
            await self._call("shutdown_requested", lambda cp: self.handler.shutdown_requested(cp))
            await self._checkpoint_committed()
        elif isinstance(event, ShardEnded) or (isinstance(event, Shutdown) and event.is_shard_end):
            await self._shard_ended()
        elif isinstance(event, (LeaseLost, Shutdown)):
            self.log.info("lease_lost", action=event.action)
            await self._call("lease_lost", lambda cp: self.handler.lease_lost())
        if isinstance(event, Action):
            await self._send(event.reply())

    async def _initialize(self, event: Initialize) -> None:
        self.shard = ShardInfo(event.shard_id or "", event.sequence_number, event.sub_sequence_number)
        self.log = self.log.bind(shard_id=event.shard_id)
        self.log.info(
            "initialize",
            sequence_number=event.sequence_number,
            sub_sequence_number=event.sub_sequence_number,
            dialect=self.conn.dialect.name,
        )
        try:
            self.handler = self.factory(self.context)
        except Exception as exc:
            self.log.error("handler_create_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
            return
        if (event.sequence_number or "").isdigit():
            self.stored = (int(event.sequence_number), event.sub_sequence_number or 0)  # type: ignore[arg-type]
        shard = self.shard
        await self._call("initialize", lambda cp: self.handler.initialize(shard))
        if self.coordinator is not None:
            await self.coordinator.open_shard(self.shard.shard_id, event.sequence_number)

    async def _process_records(self, event: ProcessRecords) -> None:
        started = time.perf_counter()
        raws = event.records
        # Only the last record is checked here (it sets the delivered position); a bad
        # record elsewhere makes the handler fail, and the batch is dead-lettered whole.
        if raws and not (type(raws[-1]) is dict and type(raws[-1].get("sequenceNumber")) is str):
            await self._dead_letter(raws, "malformed records", "a record is not an object with a sequenceNumber")
            return
        records = self._records(raws)
        self.latest_records = records
        last = (*records[-1].position, records[-1].sequence_number) if records else None
        if last is not None:
            self.delivered = last
        batch = Batch(records, event.millis_behind_latest, self.shard)  # type: ignore[arg-type]

        def attempt(cp: Checkpointer) -> Any:
            if self.coordinator is not None:
                batch.rows = []  # a retried call starts over: no row twice
            return self.handler.process_records(batch, cp)

        try:
            ok = await self._call("process_records", attempt)
        finally:
            self.latest_records = []  # an idle shard holds no batch in memory
        if not ok:
            batch.rows = []
            await self._dead_letter(raws, "handler failed", self._last_error)
        if self.coordinator is not None:
            await self._to_coordinator(batch, last, event.millis_behind_latest)
        self.batches += 1
        self.records += len(records)
        if self.log.is_enabled("debug"):
            self.log.debug(
                "batch",
                records=len(records),
                millis_behind_latest=event.millis_behind_latest,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )

    async def _to_coordinator(
        self, batch: Batch, last: tuple[int, int, str] | None, millis_behind: int | None
    ) -> None:
        """Hand the batch's rows over, wait out back-pressure, checkpoint what is safe."""
        emitted = batch.rows or []
        bad: list[tuple[Record, str]] = []
        try:
            datas = [_encode(row) for _, row, _ in emitted]
        except TypeError:  # some row is not JSON: find which, keep the others
            datas, kept = [], []
            for entry in emitted:
                try:
                    datas.append(_encode(entry[1]))
                    kept.append(entry)
                except TypeError as exc:
                    bad.append((entry[0], f"row not JSON-encodable: {exc}"))
            emitted = kept
        items = [
            (
                record.approximate_arrival_timestamp if event_time is None else event_time,
                int(seq := record.sequence_number),
                record.sub_sequence_number or 0,
                seq,
                data,
            )
            for (record, _, event_time), data in zip(emitted, datas)
        ]
        batch.rows = None
        for record, error in bad:
            await self._dead_letter([record.to_json()], "bad row", error)
        coordinator = self.coordinator
        assert coordinator is not None and self.shard is not None
        coordinator.add_batch(self.shard.shard_id, items, last, millis_behind)
        self._release()  # a delayed shard must not hold a slot the watermark's shard needs
        await coordinator.admit(self.shard.shard_id)
        if time.monotonic() - self._last_checkpoint >= self.settings.checkpoint_interval:
            await self._checkpoint_committed()

    async def _checkpoint_committed(self) -> None:
        if self.coordinator is None or self.shard is None:
            return
        self._last_checkpoint = time.monotonic()
        try:
            await self._checkpointer().checkpoint()
        except CheckpointError as exc:
            self.log.warning("checkpoint_error", error=exc.error, detail=str(exc))

    def _clamp(self, sequence_number: str | None, sub_sequence_number: int | None) -> tuple[str, int] | None:
        """The checkpoint to send instead of this one: no further than what the sink
        committed, nor than this connection was delivered; None if not past the stored."""
        assert self.coordinator is not None and self.shard is not None
        safe = self.coordinator.safe_position(self.shard.shard_id)
        if safe is None or self.delivered is None:
            return None
        if self.delivered[:2] < safe[:2]:
            safe = self.delivered
        if sequence_number is not None and sequence_number.isdigit():
            wanted = (int(sequence_number), sub_sequence_number or 0)
            if wanted < safe[:2]:
                safe = (*wanted, sequence_number)
        if self.stored is not None and safe[:2] <= self.stored:
            return None
        return safe[2], safe[1]

    def _records(self, raws: list[dict[str, Any]]) -> list[Record]:
        mode = self.settings.deaggregate
        if mode == "never" or (mode == "auto" and self.conn.dialect is not Dialect.V1):
            return list(map(Record, raws))
        out: list[Record] = []
        for raw in raws:
            rec = Record(raw)
            if not is_aggregate(rec.data):
                out.append(rec)
                continue
            users = deaggregate(rec.data, raw.get("partitionKey"), raw.get("explicitHashKey"))
            if users.error:
                self.log.error("kpl_aggregate_invalid", error=users.error, sequence_number=raw["sequenceNumber"])
                asyncio.ensure_future(self._dead_letter([raw], "invalid KPL aggregate", users.error))
            for user in users.records:
                fields = dict(raw, partitionKey=user.partition_key, subSequenceNumber=user.sub_sequence_number)
                fields["data"] = None
                if user.explicit_hash_key is not None:
                    fields["explicitHashKey"] = user.explicit_hash_key
                out.append(Record(fields, user.data) if users.aggregated else rec)
        return out

    def delivered_sub(self, sequence_number: str) -> int:
        """The default sub-sequence for checkpoint(seq): the last one delivered under
        ``seq`` in the latest batch (records come in order: the last is the highest)."""
        for rec in reversed(self.latest_records):
            if rec.sequence_number == sequence_number:
                return rec.sub_sequence_number or 0
        return 0

    async def _shard_ended(self) -> None:
        self.log.info("shard_ended")
        if self.coordinator is not None and self.shard is not None:
            await self.coordinator.shard_ended(self.shard.shard_id)  # spooled before SHARD_END
        cp = self._checkpointer(budget=self.settings.shard_end_budget, clamped=False)
        await self._call("shard_ended", lambda _: self.handler.shard_ended(cp), checkpointer=cp)
        if cp.stored_all:
            self.log.info("shard_end_stored")
            return
        if cp.lease_lost:
            self.log.error("shard_end_not_stored", error="ShutdownException: the lease was lost")
            return
        try:
            await cp.checkpoint()
            self.log.info("shard_end_stored", by="server")
        except CheckpointError as exc:
            self.log.error(
                "shard_end_not_stored",
                error=exc.error,
                what_to_do="the daemon will not process this shard's children until SHARD_END is stored; "
                "check the lease table and restart the daemon",
            )

    # -- calling the handler -------------------------------------------------------

    def _checkpointer(self, budget: float | None = None, clamped: bool = True) -> Checkpointer:
        """A checkpointer for one action; clamped to what is committed when a sink is
        configured (not at a shard end, whose rows are spooled: SHARD_END is safe)."""
        def on_retry(error: CheckpointError, delay: float) -> None:
            self.log.warning("checkpoint_retry", error=error.error, delay_ms=round(delay * 1000))

        return Checkpointer(
            self._roundtrip,
            backoff=self._checkpoint_backoff,
            retries=self.settings.checkpoint_retries,
            budget=budget,
            delivered_sub=self.delivered_sub,
            on_retry=on_retry,
            clamp=self._clamp if self.coordinator is not None and clamped else None,
        )

    async def _roundtrip(self, request: Checkpoint) -> CheckpointReply:
        try:
            await self._send(request)
        except Exception as exc:  # LocalProtocolError: not allowed here
            raise CheckpointError("InvalidStateException", request.sequence_number, request.sub_sequence_number,
                                  str(exc)) from None
        event = await self._next_event()
        if isinstance(event, ConnectionClosed):
            raise CheckpointError("ConnectionClosed", request.sequence_number, request.sub_sequence_number,
                                  "the daemon closed the connection")
        assert isinstance(event, CheckpointReply), event
        if event.error is None and (request.sequence_number or "").isdigit():
            self.stored = (int(request.sequence_number), request.sub_sequence_number or 0)  # type: ignore[arg-type]
        if event.error is not None:
            self.log.warning(
                "checkpoint_failed",
                error=event.error,
                sequence_number=request.sequence_number,
                sub_sequence_number=request.sub_sequence_number,
            )
        return event

    _last_error = ""

    async def _call(
        self,
        name: str,
        call: Callable[[Checkpointer], Any],
        *,
        checkpointer: Checkpointer | None = None,
    ) -> bool:
        """Run one handler method with time-out and retries; True if it succeeded."""
        if self.handler is None:
            self._last_error = "no handler (its creation failed)"
            return False
        attempts = self.settings.handler_retries + 1
        for attempt in range(attempts):
            cp = checkpointer or self._checkpointer()
            try:
                async with asyncio.timeout(self.settings.execution_timeout):
                    await call(cp)
                return True
            except CheckpointError as exc:
                self.log.error("checkpoint_error", callback=name, error=exc.error, detail=str(exc))
                return True
            except TimeoutError:
                self._last_error = f"timed out after {self.settings.execution_timeout} s (execution_timeout)"
            except Exception as exc:
                self._last_error = f"{type(exc).__name__}: {exc}"
            retry = attempt + 1 < attempts
            self.log.error(
                "handler_failed",
                callback=name,
                error=self._last_error,
                attempt=attempt + 1,
                attempts=attempts,
                retry=retry,
                exc_info=not retry,
            )
            if retry:
                await asyncio.sleep(self._handler_backoff.delay(attempt))
        return False

    async def _dead_letter(self, raws: list[Any], reason: str, error: str) -> None:
        records = [r if type(r) is dict else {"data": None, "value": r} for r in raws]
        path = await self.dead_letters.records(
            self.conn.shard_id, records, reason, error, attempts=self.settings.handler_retries + 1
        )
        self.log.error("dead_lettered", reason=reason, error=error, records=len(records), path=str(path))
