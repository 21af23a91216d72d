"""The worker: one per shard connection, the gen_statem role of erlmld.

It drives the sans-IO :class:`~mldserver.protocol.Connection` with what the relay
reads from the daemon and answers every action with exactly one status; the policy
sits beside it, one job a module::

    initialize         -> handler.initialize(shard)                       -> status
    processRecords     -> decode (batches) -> handler.process_records(batch, checkpointer)
                          -> rows downstream (downstream)                  -> status
    shutdownRequested  -> handler.shutdown_requested(checkpointer)        -> status
    shardEnded / shutdown TERMINATE
                       -> downstream spools -> handler.shard_ended(checkpointer);
                          SHARD_END stored (retried)                      -> status
    leaseLost / shutdown ZOMBIE -> handler.lease_lost()                  -> status

- ``calls``: a handler call that raises or runs past ``execution_timeout`` is retried
  ``handler_retries`` times with backoff; a batch that still fails is dead-lettered
  (with its data) and the conversation goes on.
- ``batches``: records are decoded (KPL aggregates expanded on a KCL 1.x daemon) and
  the handler's rows encoded; what cannot be is dead-lettered here, before the status.
- ``progress``: what was delivered and stored, and the checkpoint clamp.
- ``downstream``: nothing (no sink), or the coordinator: rows, back-pressure (the
  worker gives up its in-flight slot first), checkpoints kept to what is committed.
- A line the daemon should never send (not JSON, out of order) is logged with the
  shard and what arrived, dead-lettered if it carried records, and, if it was an
  action, answered with its status so the daemon neither hangs nor exits.
- Every checkpoint the daemon refuses is logged once, as ``checkpoint`` with an
  ``outcome``: ``retry`` (with ``delay_ms``) or ``failed``.
- Nothing here touches another connection: every failure stays on its shard.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from ..backoff import Backoff
from ..checkpointer import Checkpointer
from ..config import Settings
from ..deadletters import DeadLetters
from ..errors import CheckpointError
from ..logs import EventLogger
from ..positions import Position
from ..protocol import (
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
from ..records import Batch, ShardInfo
from .batches import INVALID_AGGREGATE, BadRecords, decode_records, encode_rows
from .calls import HandlerCalls
from .downstream import Downstream, NoSink
from .progress import ShardProgress

READ_CHUNK = 1 << 20
# Waiting for the daemon's next action: the only time a worker takes a slot.
BETWEEN_ACTIONS = frozenset({State.AWAITING_INITIALIZE, State.READY, State.DRAINING})


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
        downstream: Downstream | None = None,
        calls: Callable[[EventLogger], Any] | None = None,
    ) -> None:
        """``calls`` makes the shard's handler calls (the shard/calls.py seam) from the
        worker's logger: the server's handler processes; default: in this loop."""
        self.reader = reader
        self.writer = writer
        self.settings = settings
        self.dead_letters = dead_letters
        self.log = log
        self.slots = slots  # shared by all workers: bounds decoded batches in memory
        self._holding = False
        self.downstream: Downstream = downstream or NoSink()
        self.conn = Connection(settings.max_line_size)
        self.calls = calls(log) if calls is not None else HandlerCalls(
            factory,
            context,
            retries=settings.handler_retries,
            timeout=settings.execution_timeout,
            backoff=Backoff(first=settings.handler_backoff, cap=max(settings.handler_backoff, 5.0)),
            log=log,
        )
        self.progress = ShardProgress()
        self.shard: ShardInfo | None = None
        self.busy = False  # inside an action (between reading it and sending its status)
        self.stopping = False
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
            self.calls.close()
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

    async def _roundtrip(self, request: Checkpoint) -> CheckpointReply:
        """One checkpoint: the request out, the daemon's reply back, nothing between."""
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
        return event

    # -- dispatch ----------------------------------------------------------------

    async def _dispatch(self, event: Event) -> None:
        if isinstance(event, Initialize):
            await self._initialize(event)
        elif isinstance(event, ProcessRecords):
            await self._process_records(event)
        elif isinstance(event, ShutdownRequested):
            await self.calls.call("shutdown_requested", None, self._checkpointers("shutdown_requested"))
            if self.downstream.holds_checkpoints:
                await self._checkpoint_safe()
        elif isinstance(event, ShardEnded) or (isinstance(event, Shutdown) and event.is_shard_end):
            await self._shard_ended()
        elif isinstance(event, (LeaseLost, Shutdown)):
            self.log.info("lease_lost", action=event.action)
            await self.calls.call("lease_lost", None, self._checkpointers("lease_lost"))
        if isinstance(event, Action):
            await self._send(event.reply())

    async def _initialize(self, event: Initialize) -> None:
        self.shard = shard = ShardInfo(event.shard_id or "", event.sequence_number, event.sub_sequence_number)
        self.log = self.calls.log = self.log.bind(shard_id=event.shard_id)
        self.log.info(
            "initialize",
            sequence_number=event.sequence_number,
            sub_sequence_number=event.sub_sequence_number,
            dialect=self.conn.dialect.name,
        )
        if self.calls.create() is not None:
            return
        checkpoint = Position.parse(event.sequence_number, event.sub_sequence_number)  # None: TRIM_HORIZON...
        self.progress.initialized(checkpoint)
        await self.calls.call("initialize", shard, self._checkpointers("initialize"))
        await self.downstream.open(shard.shard_id, checkpoint)

    async def _process_records(self, event: ProcessRecords) -> None:
        started = time.perf_counter()
        mode = self.settings.deaggregate
        kpl = mode == "always" or (mode == "auto" and self.conn.dialect is Dialect.V1)
        records, bad = decode_records(event.records, deaggregate_kpl=kpl, positions=self.downstream.collects_rows)
        await self._dead_letter_all(bad)
        if not records and bad:
            return
        self.progress.batch(records)
        last = records[-1].position if records else None
        batch = Batch(records, event.millis_behind_latest, self.shard)  # type: ignore[arg-type]
        if not kpl and len(records) == len(event.records):
            batch.line = event.line  # the records as they arrived, for a handler process
        try:
            outcome = await self.calls.call(
                "process_records", batch, self._checkpointers("process_records"),
                collect_rows=self.downstream.collects_rows,
            )
        finally:
            self.progress.batch_done()  # an idle shard holds no batch in memory
        if not outcome.ok:
            await self._dead_letter_all([BadRecords(event.records, "handler failed", outcome.error or "")])
        items, bad = encode_rows(outcome.rows or ())
        await self._dead_letter_all(bad)
        assert self.shard is not None
        if await self.downstream.batch(self.shard.shard_id, items, last, event.millis_behind_latest, self._release):
            await self._checkpoint_safe()
        self.batches += 1
        self.records += len(records)
        if self.log.is_enabled("debug"):
            self.log.debug(
                "batch",
                records=len(records),
                millis_behind_latest=event.millis_behind_latest,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )

    async def _shard_ended(self) -> None:
        self.log.info("shard_ended")
        if self.shard is not None:
            await self.downstream.shard_ended(self.shard.shard_id)  # spooled before SHARD_END
        cp = self._checkpointer("shard_ended", budget=self.settings.shard_end_budget, clamped=False)
        await self.calls.call("shard_ended", None, lambda: cp)
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

    # -- checkpoints and dead letters ------------------------------------------------

    async def _checkpoint_safe(self) -> None:
        """The server's own checkpoint: everything the sink has committed."""
        if self.shard is None:
            return
        try:
            await self._checkpointer("server").checkpoint()
        except CheckpointError:
            pass  # logged by the checkpointer; the next one tries again

    def _checkpointers(self, action: str) -> Callable[[], Checkpointer]:
        return lambda: self._checkpointer(action)

    def _checkpointer(self, action: str, budget: float | None = None, clamped: bool = True) -> Checkpointer:
        """A checkpointer for one action; clamped to what is committed when a sink is
        downstream (not at a shard end, whose rows are spooled: SHARD_END is safe)."""
        log = self.log

        def on_refused(error: CheckpointError, delay: float | None) -> None:
            log.warning(
                "checkpoint",
                outcome="failed" if delay is None else "retry",
                callback=action,
                error=error.error,
                sequence_number=error.sequence_number,
                sub_sequence_number=error.sub_sequence_number,
                delay_ms=None if delay is None else round(delay * 1000),
            )

        safe = None
        if clamped and self.downstream.holds_checkpoints and self.shard is not None:
            shard_id, downstream = self.shard.shard_id, self.downstream
            safe = lambda: downstream.safe(shard_id)  # noqa: E731
        return Checkpointer(
            self._roundtrip,
            backoff=self._checkpoint_backoff,
            retries=self.settings.checkpoint_retries,
            budget=budget,
            progress=self.progress,
            safe=safe,
            on_refused=on_refused,
        )

    async def _bad_line(self, exc: RemoteProtocolError) -> None:
        self.log.error(
            "bad_line",
            error=str(exc),
            action=exc.action,
            line=exc.line[:200].decode("utf-8", "replace"),
            what_to_do="the daemon sent something the protocol does not allow; see the line above",
        )
        if exc.line and (exc.action is None or exc.action == "processRecords"):
            path = await self.dead_letters.line(self.conn.shard_id, exc.line, reason=str(exc))
            self.log.error("dead_lettered", reason="bad line", path=str(path))
        if exc.action is not None:
            await self._send(Status(response_for=exc.action))

    async def _dead_letter_all(self, bad: list[BadRecords]) -> None:
        for raws, reason, error in bad:
            if reason == INVALID_AGGREGATE:
                self.log.error("kpl_aggregate_invalid", error=error, sequence_number=raws[0].get("sequenceNumber"))
            records = [r if type(r) is dict else {"data": None, "value": r} for r in raws]
            path = await self.dead_letters.records(
                self.conn.shard_id, records, reason, error, attempts=self.settings.handler_retries + 1
            )
            self.log.error("dead_lettered", reason=reason, error=error, records=len(records), path=str(path))
