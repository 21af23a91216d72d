"""The shard driver: one per shard connection, the gen_statem role of erlmld.

It drives the sans-IO :class:`~mldserver.protocol.Connection` with what the daemon
sends (read from the ``slots`` wire, a batch holding an in-flight slot) and answers
every action with exactly one status; the policy sits beside it, one job a module::

    initialize         -> handler.initialize(shard) (calls)               -> status
    processRecords     -> decode (batches) -> handler.process_records(batch, checkpointer)
                          -> rows downstream (downstream)                  -> status
    shutdownRequested  -> handler.shutdown_requested(checkpointer)        -> status
    shardEnded / shutdown TERMINATE
                       -> downstream spools -> handler.shard_ended(checkpointer);
                          SHARD_END stored (checkpoints, retried)         -> status
    leaseLost / shutdown ZOMBIE -> downstream drops the uncommitted rows
                          -> handler.lease_lost()                         -> status

What cannot be processed (a batch whose handler still fails after its retries, records
that do not decode, rows that do not encode, a line the daemon should never send) is
dead-lettered with its data before the status. ``status()`` is what ``/status`` reads.

Every action read is answered, whatever the handler, the disk or the conversation did
(invariant 1): a bug of ours inside an action is logged (``action_failed_internally``),
its batch dead-lettered and the action answered; a bad line (not JSON, out of order,
over ``max_line_size``) is logged with what arrived and answered when its first bytes
name an action, so the daemon neither hangs nor exits. Only the end of input, a peer gone
(``disconnected``) or the server's shutdown end a connection; a line that names no action
at all (``bad_line_unanswerable``) owes no status and gets none: it is dead-lettered and
the conversation goes on. Nothing here touches another connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from ..base.config import Settings
from ..base.deadletters import DeadLetters
from ..base.durable import on_blocked
from ..base.logs import EventLogger
from .pausing import Pause
from .pieces import LineReader
from ..base.positions import Position
from ..protocol import (
    Action, CheckpointReply, Connection, ConnectionClosed, Dialect, Event, Initialize, LeaseLost, ProcessRecords,
    RemoteProtocolError, ShardEnded, Shutdown, ShutdownRequested, Status,
)
from ..api.checkpointer import Checkpointer
from ..api.records import Batch, Record, ShardInfo
from ..rows.batch import RowBatch
from .batches import INITIALIZE_FAILED, INVALID_AGGREGATE, BadRecords, LineRecords, decode_records, encode_rows
from .bisect import Failed, bisect
from .calls import SKIPPED, Calls, Outcome
from .checkpoints import Checkpoints
from .downstream import Downstream, NoSink
from .slots import Lost, Slots, Stopped, Wire
from .status import Meter, ShardStatus, Tally


class ShardDriver:
    def __init__(self, reader: LineReader, writer: asyncio.StreamWriter, *, calls: Calls, settings: Settings,
                 dead_letters: DeadLetters, log: EventLogger, metrics: Meter, slots: Slots | None = None,
                 downstream: Downstream | None = None, pause: Pause | None = None, conn_id: int | None = None) -> None:
        """``calls`` logs to ``log``; ``slots`` and ``pause`` (POST /pause) are the server's."""
        self.conn = Connection(settings.max_line_size, lines=reader.lines)  # the reader writes its lines in place
        self.conn.lazy = calls.reads_line  # a handler process reads the records from the line
        self.settings = settings
        self.log = log
        self.calls = calls
        self.downstream: Downstream = downstream or NoSink()
        self.conn.positions = self.downstream.collects_rows  # every row's record's position: read with the check
        self.dead_letters = dead_letters
        self.metrics = metrics  # the server's (admin endpoint): recorded here, the seam's server side
        self.pause = pause
        self.wire = Wire(reader, writer, self.conn, slots, log, running=lambda: calls.running,
                         on_bad_line=self._bad_line, ready=self.downstream.ready)
        self.checkpoints = Checkpoints(self.conn, self.wire, settings=settings, downstream=self.downstream,
                                       metrics=metrics, log=log)
        self.shard: ShardInfo | None = None
        self.initialized: str | None = "initialize not received"  # None: the handler is initialized; else why not
        self.tally = Tally(conn_id)

    @property
    def busy(self) -> bool:
        """Inside an action, or part of the next one received."""
        return self.conn.owes_status is not None or self.conn.buffered > 0 or self.conn.overflowing

    @property
    def stopping(self) -> bool:
        return self.wire.stopping

    def status(self) -> ShardStatus:
        """What /status and /metrics read of this connection, taken at once."""
        return self.tally.status(self.conn, self.calls, self.checkpoints.progress.stored)

    def stop(self) -> None:
        """The server stops: an action that has arrived (even partly) is answered, then
        the driver closes; an idle one closes at once."""
        self.wire.stop()

    def abort(self) -> None:
        """Past ``shutdown_timeout``: the handler call is cancelled (the action answered
        as failed), and no slot waited for, no handler called, no action read further."""
        self.calls.abort("the server is shutting down (shutdown_timeout passed)")
        self.wire.abort()

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        wire, tally = self.wire, self.tally
        wire.started()
        on_blocked(wire.release)  # a write waiting out a full disk gives the slot back
        try:
            while not wire.drained():
                try:
                    event = await wire.next_event()
                except Stopped:
                    break
                if isinstance(event, ConnectionClosed):
                    break
                if isinstance(event, CheckpointReply):
                    self.log.error("unexpected_line", error="checkpoint reply with no checkpoint outstanding")
                    continue
                tally.owed = event.action if isinstance(event, Action) else None
                if tally.owed is not None:
                    tally.last_action, tally.last_action_at = tally.owed, time.time()
                try:
                    await self._dispatch(event)
                except (Lost, Stopped):
                    raise
                except Exception as exc:  # a bug of ours ends this action, never the connection
                    await self._failed_internally(event, exc)
                finally:
                    del event  # a batch must not stay alive while the shard waits for the next
                    wire.release()
                tally.owed = None
        except Lost as exc:
            self.log.warning("disconnected", error=str(exc), owed=tally.owed)
        else:
            if wire.lost is not None:
                self.log.info("disconnected", error=f"{type(wire.lost).__name__}: {wire.lost}")
        finally:
            self.checkpoints.close()
            for step in (wire.release, self.calls.close,
                         self.downstream.close):  # the coordinator may forget the shard once it is done
                try:
                    step()
                except Exception:  # each step is done whatever the one before raised
                    self.log.error("close_failed_internally", step=step.__qualname__, exc_info=True)
            if self.shard is not None:
                self.metrics.forget(self.shard.shard_id)
            self.log.info("closed", batches=tally.batches, records=tally.records, state=self.conn.state.name)
            wire.close()

    async def _failed_internally(self, event: Event, exc: Exception) -> None:
        """A bug of ours inside an action: logged, its batch dead-lettered, the action answered once."""
        action = event.action if isinstance(event, Action) else None
        self.log.error("action_failed_internally", action=action, error=f"{type(exc).__name__}: {exc}",
                       exc_info=exc, what_to_do="a bug in mldserver: the action is answered and the "
                       "connection goes on; please report it with this traceback")
        if isinstance(event, ShardEnded) or (isinstance(event, Shutdown) and event.is_shard_end):
            self.log.error("shard_end_not_stored", error=f"{type(exc).__name__}: {exc}",
                           what_to_do="the shard's rows could not be made safe, so SHARD_END was not stored; "
                           "the daemon will not process this shard's children until it is: restart the daemon")
        if isinstance(event, ProcessRecords) and event.records:
            bad = BadRecords(event.records, "internal error", f"{type(exc).__name__}: {exc}")
            await self._step_of_failed(action, "dead_letter", self._dead_letter_all([bad]))
        if action is not None and self.conn.owes_status == action:  # sent even if the dead letter was not
            await self._step_of_failed(action, "status", self._answer(action))

    async def _step_of_failed(self, action: str | None, step: str, work: Any) -> None:
        """One step of that answer; its own failure is logged, and the next step still taken."""
        try:
            await work
        except (Lost, Stopped):
            raise
        except Exception as again:
            self.log.error("action_failed_internally", action=action, step=step,
                           error=f"{type(again).__name__}: {again}", exc_info=again)

    async def _answer(self, action: str) -> None:
        """The action's status, once its checkpoints are settled (Lost if it cannot go)."""
        async with self.checkpoints.settled(action):
            await self.wire.write(self.conn.send(Status(response_for=action)))

    async def _bad_line(self, exc: RemoteProtocolError) -> None:
        self.log.error("bad_line", error=str(exc), action=exc.action, line=exc.line[:200].decode("utf-8", "replace"),
                       what_to_do="the daemon sent something the protocol does not allow; see the line above")
        if exc.too_long:
            await self.dead_letters.overlong(self.conn.shard_id, str(exc), self.wire.overflow(), self.log)
        elif exc.line and (exc.action is None or exc.action == "processRecords"):
            path = await self.dead_letters.line(self.conn.shard_id, exc.line, reason=str(exc))
            self.log.error("dead_lettered", reason="bad line", path=str(path))
        if await self.checkpoints.answered_in_roundtrip(exc.action):
            return
        if exc.names_no_action:  # no status answers it, and none is owed: the conversation goes on
            self.log.error("bad_line_unanswerable", error=str(exc), state=self.conn.state.name,
                           what_to_do="a line that names no action (not JSON, no \"action\") owes no status and "
                                      "gets none; it is dead-lettered and the connection goes on (the real daemon "
                                      "never sends one): look at what sent it")
        if exc.action is not None:
            self.tally.owed = exc.action
            await self._answer(exc.action)
            self.tally.owed = None
        self.wire.release()  # nothing of it stays in memory: the slot goes back

    # -- dispatch ----------------------------------------------------------------

    async def _dispatch(self, event: Event) -> None:
        if self.pause is not None and self.pause.paused and isinstance(event, Action):
            meanwhile = self.checkpoints.checkpoint_safe if isinstance(event, ProcessRecords) else None
            await self.pause.hold(event.action, self.log, meanwhile=meanwhile, stop=self.wire.aborted)
        if isinstance(event, Initialize):
            await self._initialize(event)
        elif isinstance(event, ProcessRecords):
            await self._process_records(event)
        elif isinstance(event, ShutdownRequested):
            if await self._ready("shutdown_requested"):
                await self._call("shutdown_requested", None, self.checkpoints.for_action("shutdown_requested"))
            if self.downstream.holds_checkpoints:
                await self.checkpoints.checkpoint_safe()
        elif isinstance(event, ShardEnded) or (isinstance(event, Shutdown) and event.is_shard_end):
            await self._shard_ended()
        elif isinstance(event, (LeaseLost, Shutdown)):
            self.log.info("lease_lost", action=event.action)
            self.downstream.lease_lost()  # its uncommitted rows go: the new owner reads them again
            if await self._ready("lease_lost"):
                await self._call("lease_lost", None, self.checkpoints.for_action("lease_lost"))
        if isinstance(event, Action):
            await self._answer(event.action)

    async def _initialize(self, event: Initialize) -> None:
        self.shard = shard = ShardInfo(event.shard_id or "", event.sequence_number, event.sub_sequence_number)
        self.checkpoints.open()
        log = self.log = self.log.bind(shard_id=event.shard_id)
        self.calls.log = self.wire.log = self.checkpoints.log = log  # every part of the shard logs its id
        log.info("initialize", sequence_number=event.sequence_number, sub_sequence_number=event.sub_sequence_number,
                 dialect=self.conn.dialect.name)
        if (error := self.calls.create()) is not None:
            self._not_initialized(error, "initialize")
            return
        checkpoint = Position.parse(event.sequence_number, event.sub_sequence_number)  # None: TRIM_HORIZON...
        self.checkpoints.progress.initialized(checkpoint)
        outcome = await self._call("initialize", shard, self.checkpoints.for_action("initialize"))
        if outcome.ok:
            self.initialized = None
        else:
            self._not_initialized(outcome.error or "", "initialize")
        await self.downstream.open(shard.shard_id, checkpoint)

    async def _ready(self, callback: str) -> bool:
        """Is the shard's handler initialized? One whose ``initialize`` failed (every
        attempt) is made and initialized afresh before each later action, at the
        checkpoint stored since (a database that was down may be up); while that fails
        too, no other callback of it is called (``initialize_failed``)."""
        if self.initialized is None:
            return True
        if self.shard is None:
            return False  # (initialize never arrived: an out-of-order action is answered without a call)
        error = self.calls.create()
        if error is None:
            stored = self.checkpoints.progress.stored
            shard = self.shard if stored is None else ShardInfo(self.shard.shard_id, stored.text, stored.sub)
            outcome = await self._call("initialize", shard, self.checkpoints.for_action("initialize"))
            if outcome.ok:
                self.initialized = None
                self.log.info("initialized_again", before=callback)
                return True
            error = outcome.error or ""
        self._not_initialized(error, callback)
        return False

    def _not_initialized(self, error: str, callback: str) -> None:
        self.initialized = error
        self.log.error("initialize_failed", error=error, callback=callback,
                       what_to_do="the handler's initialize failed every attempt: its shard's batches are "
                                  "dead-lettered whole (reason \"initialize failed\") and no other callback is called "
                                  "until an initialize, tried again before each action, succeeds; the connection "
                                  "stays open (a status the daemon does not get ends every shard of its worker)")

    async def _process_records(self, event: ProcessRecords) -> None:
        started = time.perf_counter()
        if not await self._ready("process_records"):  # the handler cannot take it: kept whole, its data with it
            if event.records:
                await self._dead_letter_all([BadRecords(event.records, INITIALIZE_FAILED, self.initialized or "")])
            return
        mode = self.settings.deaggregate
        kpl = mode == "always" or (mode == "auto" and self.conn.dialect is Dialect.V1)
        collect = self.downstream.collects_rows
        # With a sink every record needs its position before the handler sees it: a line's
        # are read while its handler process parses it (``check``), not before the call.
        records, bad = decode_records(event.records, deaggregate_kpl=kpl, positions=collect, later=collect)
        check = records.read_positions if collect and type(records) is LineRecords else None
        outcome = await self._handled(event, records, bad, kpl, check)
        if outcome is not None and outcome.result == SKIPPED:  # a record without a position: read whole
            records, bad = decode_records(event.records, deaggregate_kpl=kpl, positions=True)
            outcome = await self._handled(event, records, bad, kpl, None)
        if outcome is None:
            return
        last = records[-1].position if records else None
        if not outcome.ok:  # the records that fail alone are found and dead-lettered, the others handled
            items, bad = await self._bisected(event, records, outcome)
        else:
            if outcome.failed:  # before any checkpoint can pass them
                await self.dead_letters.failed_records(self.conn.shard_id, records, outcome.failed, self.log)
            items, bad = encode_rows(outcome.rows)
        await self._dead_letter_all(bad)
        assert self.shard is not None
        n = len(records)
        del records, bad, outcome, check  # what held the line: its slot goes, and the line with it

        def handed_on() -> None:  # the rows are the coordinator's: the line goes with the slot
            event.let_go()
            self.wire.release()

        if await self.downstream.batch(items, last, event.millis_behind_latest, handed_on,
                                       meanwhile=self.checkpoints.checkpoint_safe):
            await self.checkpoints.checkpoint_safe()
        self.tally.batch(n, event.millis_behind_latest)
        self.metrics.batch(self.shard.shard_id, n)
        if self.log.is_enabled("debug"):
            self.log.debug("batch", records=n, millis_behind_latest=event.millis_behind_latest,
                           duration_ms=round((time.perf_counter() - started) * 1000, 3))

    async def _handled(self, event: ProcessRecords, records: list[Record], bad: list[BadRecords], kpl: bool,
                       check: Callable[[], bool] | None) -> Outcome | None:
        """The malformed records dead-lettered, then the handler called with the others
        (None: there were none)."""
        await self._dead_letter_all(bad)
        if not records and bad:
            return None
        progress = self.checkpoints.progress
        progress.batch(records)
        batch = Batch(records, event.millis_behind_latest, self.shard)  # type: ignore[arg-type]
        if not kpl and len(records) == len(event.records):
            batch.line = event.line  # the records as they arrived, for a handler process
        try:
            return await self._call("process_records", batch, self.checkpoints.for_action("process_records"),
                                    collect_rows=self.downstream.collects_rows, check=check)
        finally:
            progress.batch_done()  # an idle shard holds no batch in memory

    async def _bisected(self, event: ProcessRecords, records: list[Record], failed: Outcome
                        ) -> tuple[RowBatch, list[BadRecords]]:
        """A batch that failed whole, bisected (``shard.bisect``): the rows of the records
        handled, and the bad rows among them. Its parts are called in a process of their
        own when the batch killed its process or ran too long."""
        async def call(part: Any) -> Outcome:
            batch = Batch(list(part), event.millis_behind_latest, self.shard)  # type: ignore[arg-type]
            return await self._call("process_records", batch, self.checkpoints.for_action("process_records"),
                                    collect_rows=self.downstream.collects_rows, retries=0,
                                    quarantine=failed.isolate)

        async def dead_letter(failed: list[Failed]) -> None:
            await self.dead_letters.failed_records(self.conn.shard_id, records, failed, self.log)

        attempts = self.settings.handler_retries + 1
        error = failed.error or ""
        done = await bisect(call, records, error, attempts=attempts, on_failed=dead_letter,
                            deadline=time.monotonic() + self.settings.execution_timeout)
        self.log.warning("batch_bisected", records=len(records), failed=len(done.failed), calls=done.calls,
                         error=error)
        encoded = [encode_rows(rows) for rows in done.rows]
        return RowBatch.concat([rows for rows, _ in encoded if len(rows)]), [b for _, bad in encoded for b in bad]

    async def _call(self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer],
                    **kwargs: Any) -> Outcome:
        """The handler-call seam, metered on the server's side (retries included)."""
        started = time.perf_counter()
        outcome = await self.calls.call(action, arg, checkpointer, **kwargs)
        if outcome.result == SKIPPED:
            return outcome  # not called: nothing to meter
        discarded = self.metrics.call(action, outcome.result, outcome.error, time.perf_counter() - started,
                                      self.calls.take_stats())
        if discarded and not self.tally.rows_discarded:
            self.log.warning("rows_discarded", rows=discarded,
                             what_to_do="the handler emits rows but no sink keeps them: add --sink parquet:DIR "
                                        "(or file:DIR, iceberg:DIR); counted in mldserver_rows_discarded_total, "
                                        "said once per shard")
        self.tally.rows_discarded += discarded
        return outcome

    async def _shard_ended(self) -> None:
        self.log.info("shard_ended")
        if self.shard is not None:
            await self.downstream.shard_ended()  # spooled before SHARD_END
        cp = self.checkpoints.for_shard_end()
        try:
            if await self._ready("shard_ended"):
                await self._call("shard_ended", None, lambda: cp)
        except Exception as exc:  # SHARD_END is stored whatever the call did
            self.log.error("action_failed_internally", action="shardEnded", error=f"{type(exc).__name__}: {exc}",
                           exc_info=exc, what_to_do="a bug in mldserver: SHARD_END is stored all the same")
        await self.checkpoints.store_shard_end(cp)

    async def _dead_letter_all(self, bad: list[BadRecords]) -> None:
        for raws, reason, error in bad:
            if reason == INVALID_AGGREGATE:
                self.log.error("kpl_aggregate_invalid", error=error, sequence_number=raws[0].get("sequenceNumber"))
            await self.dead_letters.batch_records(self.conn.shard_id, raws, reason, error,
                                                  self.settings.handler_retries + 1, self.log)
