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
    leaseLost / shutdown ZOMBIE -> downstream drops the uncommitted rows
                          -> handler.lease_lost()                         -> status

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

Every action read is answered, whatever the handler, the disk or the conversation did
(invariant 1):

- The checkpoint round trip is the worker's (``_roundtrip``): one outstanding at a
  time, in its own task, so a caller that is cancelled (``execution_timeout``, the
  handler's own ``wait_for``) leaves it running; it is settled (its reply read,
  within ``REPLY_TIMEOUT_S``) before the next checkpoint and before any status. A reply
  that cannot be read is a failed checkpoint (the protocol core's ``MALFORMED_REPLY``).
- The action's checkpointers are closed before its status (``_answer``).
- A line over ``max_line_size`` is answered when its first bytes name an action, and
  streamed whole to its own dead-letter file as it arrives.
- A peer that resets or goes away is ``disconnected``, not a crash.
- In-flight slots (``Slots``): only a batch takes one (an action named in a line's first
  bytes as anything else never does); a holder whose line stops growing for
  ``STALL_S`` gives it back (``peer_stalled``); waiting longer than ``SLOT_WAIT_LOG_S``
  logs ``slots_held`` with who holds them, for how long, in which callback.
- ``stop()`` (the server stops) lets an action that has arrived, even partly, be
  answered, and closes an idle worker at once; ``abort()`` (past ``shutdown_timeout``)
  cancels the handler call so the action is answered as failed.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from ..backoff import Backoff
from ..checkpointer import Checkpointer
from ..config import Settings
from ..deadletters import DeadLetters
from ..durable import on_blocked, utc_timestamp
from ..errors import CheckpointError
from ..failures import RECORD_FAILED
from ..logs import EventLogger
from ..metrics import Metrics, call_outcome
from ..pausing import Pause
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
    LocalProtocolError,
    ProcessRecords,
    RemoteProtocolError,
    ShardEnded,
    Shutdown,
    ShutdownRequested,
    State,
    Status,
    action_in,
)
from ..pieces import PieceReader
from ..records import Batch, ShardInfo
from .batches import INVALID_AGGREGATE, BadRecords, decode_records, encode_rows
from .calls import HandlerCalls, Outcome
from .downstream import Downstream, NoSink
from .progress import ShardProgress

# Read a quarter MiB at a time: below the fixed mmap threshold (``malloc.py``), so
# each piece reuses heap memory; the line is joined from them once (``LineBuffer``).
READ_CHUNK = 1 << 18
# Waiting for the daemon's next action: the only time a worker takes a slot.
BETWEEN_ACTIONS = frozenset({State.AWAITING_INITIALIZE, State.READY, State.DRAINING})
# Actions that carry no batch: they never take an in-flight slot (named in a line's
# first bytes; a line that has not named its action within PEEK bytes takes one).
SMALL_ACTIONS = frozenset({"initialize", "leaseLost", "shutdownRequested", "shardEnded", "shutdown"})
PEEK = 256
# A slot holder whose action line has not grown for this long gives its slot back.
STALL_S = 5.0
# Waiting this long for a slot logs who holds the slots (and again, 4 times longer, ...).
SLOT_WAIT_LOG_S = 2.0
# Paused, a batch waiting at the gate checkpoints what the sink committed this often.
PAUSED_CHECKPOINT_S = 1.0
# A checkpoint reply that has not come after this long: the connection has failed.
REPLY_TIMEOUT_S = 120.0


class Slots:
    """The in-flight slots all workers share (``max_batches_in_flight``): they bound
    the batches held in memory. Who holds one, since when, is known, so a shard that
    waits for one longer than ``SLOT_WAIT_LOG_S`` logs ``slots_held`` naming the holders."""

    def __init__(self, n: int) -> None:
        self.total = n
        self._sem = asyncio.Semaphore(n)
        self.holders: dict[Worker, float] = {}

    async def acquire(self, worker: Worker, aborted: asyncio.Event) -> bool:
        """Take a slot for ``worker``; False if ``aborted`` is set first."""
        if not self._sem.locked():
            await self._sem.acquire()
            self.holders[worker] = time.monotonic()
            return True
        started = time.monotonic()
        waiting = asyncio.ensure_future(self._sem.acquire())
        stop = asyncio.ensure_future(aborted.wait())
        took = False
        try:
            log_after = SLOT_WAIT_LOG_S
            while True:
                left = max(started + log_after - time.monotonic(), 0.0)
                done, _ = await asyncio.wait((waiting, stop), timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if waiting in done:
                    took = True
                    self.holders[worker] = time.monotonic()
                    return True
                if stop in done:
                    return False
                now = time.monotonic()
                worker.log.warning(
                    "slots_held",
                    waited_s=round(now - started, 1),
                    slots=self.total,
                    holders=[h.describe(now, since) for h, since in sorted(self.holders.items(), key=lambda i: i[1])],
                    what_to_do="every in-flight slot (max_batches_in_flight) is held: slow handler calls or "
                    "stalled peers, named here, hold the other shards up",
                )
                log_after *= 4
        finally:
            stop.cancel()
            if not waiting.done():
                waiting.cancel()
            elif not took and not waiting.cancelled():
                self._sem.release()

    def release(self, worker: Worker) -> None:
        if self.holders.pop(worker, None) is not None:
            self._sem.release()


def _as_daemon_wrote(records: Any, i: int) -> dict[str, Any]:
    """Record ``i`` of a batch as the daemon wrote it, for a dead letter; one that is
    not a JSON object (which the handler saw as such) as ``{"data": null, "value": ...}``."""
    try:
        return records[i].to_json()
    except (AttributeError, TypeError, ValueError):  # not an object: its value from the line read whole
        raws = getattr(records, "raws", None)
        value = raws.records()[i] if raws is not None else getattr(records[i], "_raw", None)
        return value if type(value) is dict else {"data": None, "value": value}


class _Stopped(Exception):
    """The server stops and this worker has nothing to answer."""


class _Lost(Exception):
    """The connection cannot go on (the peer went away, or never replied)."""


class Worker:
    def __init__(
        self,
        reader: PieceReader,  # the server's connections (pieces.serve_tcp, serve_unix)
        writer: asyncio.StreamWriter,
        *,
        factory: Callable[[Any], Any],
        context: Any,
        settings: Settings,
        dead_letters: DeadLetters,
        log: EventLogger,
        slots: Slots | None = None,
        downstream: Downstream | None = None,
        metrics: Metrics | None = None,
        pause: Pause | None = None,
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
        # A handler process reads the records from the line: this loop reads only what it needs.
        self.conn.lazy = self.calls.reads_line
        self.progress = ShardProgress()
        self.shard: ShardInfo | None = None
        self.stopping = False
        self._aborted = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self._idle = False  # reading, with nothing of the next action received
        self._reading: asyncio.Task[Any] | None = None  # the task in _read, if any
        self._cp_lock = asyncio.Lock()  # one checkpoint round trip at a time; none across a status
        self._outstanding: asyncio.Task[CheckpointReply] | None = None
        self._issued: list[Checkpointer] = []  # this action's checkpointers, closed before its status
        self._lost: BaseException | None = None  # the peer went away (a reset, a broken pipe)
        self._owed: str | None = None  # the action being answered
        self._grew = time.monotonic()  # when the line being read last grew
        self._checkpoint_backoff = Backoff(first=settings.checkpoint_backoff, cap=settings.checkpoint_backoff_cap)
        self.batches = 0
        self.records = 0
        self.metrics = metrics  # the server's (admin endpoint): recorded here, the seam's server side
        self._discard_warned = False  # rows_discarded said once per shard
        self.pause = pause  # the server's gate (POST /pause): waited at before an action's handler call
        self.conn_id: int | None = None  # the server's number for this connection (logs' ``conn``)
        self.last_action: str | None = None  # for /status: the action and when it arrived (epoch s)
        self.last_action_at: float | None = None
        self.millis_behind_latest: int | None = None

    @property
    def busy(self) -> bool:
        """Inside an action, or part of the next one received."""
        return self.conn.owes_status is not None or self.conn.buffered > 0 or self.conn.overflowing

    def describe(self, now: float, since: float) -> dict[str, Any]:
        """For ``slots_held``: who this is and what it does with its slot."""
        return {
            "shard_id": self.conn.shard_id,
            "held_s": round(now - since, 1),
            "state": self.conn.state.name,
            "callback": getattr(self.calls, "running", None),
            "line_bytes": self.conn.buffered,
            "idle_s": round(now - self._grew, 1),
        }

    # -- stopping ------------------------------------------------------------------

    def stop(self) -> None:
        """The server stops: finish the action that has arrived (even partly), then
        close; an idle worker closes at once."""
        self.stopping = True
        if self._idle and self._task is not None:
            self._task.cancel()

    def abort(self) -> None:
        """The server will not wait longer: cancel the handler call (the action is
        answered as failed), stop waiting for a slot, call no handler again, and stop
        reading an action that has not arrived whole."""
        self.stop()
        self._aborted.set()
        self.calls.abort("the server is shutting down (shutdown_timeout passed)")
        if self._reading is not None and self._reading is self._task and not self._idle:
            self._task.cancel()

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        self._task = asyncio.current_task()
        on_blocked(self._release)  # a write waiting out a full disk gives the slot back
        try:
            while True:
                if self.stopping and not self.conn.buffered and not self.reader.unread:
                    break
                try:
                    event = await self._next_event()
                except _Stopped:
                    break
                if isinstance(event, ConnectionClosed):
                    break
                if isinstance(event, CheckpointReply):
                    self.log.error("unexpected_line", error="checkpoint reply with no checkpoint outstanding")
                    continue
                self._owed = event.action if isinstance(event, Action) else None
                if self._owed is not None:
                    self.last_action, self.last_action_at = self._owed, time.time()
                try:
                    await self._dispatch(event)
                except (_Lost, _Stopped):
                    raise
                except Exception as exc:  # a bug of ours ends this action, never the connection
                    await self._failed_internally(event, exc)
                finally:
                    del event  # a batch must not stay alive while the shard waits for the next
                    self._release()
                self._owed = None
        except _Lost as exc:
            self.log.warning("disconnected", error=str(exc), owed=self._owed)
        else:
            if self._lost is not None:
                self.log.info("disconnected", error=f"{type(self._lost).__name__}: {self._lost}")
        finally:
            if self._outstanding is not None and not self._outstanding.done():
                self._outstanding.cancel()
            for step in (self._release, self.calls.close,
                         self.downstream.close):  # the coordinator may forget the shard once it is done
                try:
                    step()
                except Exception:  # each step is done whatever the one before raised
                    self.log.error("close_failed_internally", step=step.__qualname__, exc_info=True)
            if self.metrics is not None and self.shard is not None:
                self.metrics.forget(self.shard.shard_id)
            self.log.info("closed", batches=self.batches, records=self.records, state=self.conn.state.name)
            self.writer.close()

    async def _failed_internally(self, event: Event, exc: Exception) -> None:
        """An exception of ours inside one action: logged with its traceback, the batch
        dead-lettered with its data, the action answered once; the next action is read
        as usual. Only the daemon's end of input, a lost connection or the server's
        shutdown end a connection."""
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
        """One step of answering an action that failed internally; its own failure is
        logged, and the next step is still taken."""
        try:
            await work
        except (_Lost, _Stopped):
            raise
        except Exception as again:
            self.log.error("action_failed_internally", action=action, step=step,
                           error=f"{type(again).__name__}: {again}", exc_info=again)

    async def _next_event(self) -> Event:
        while True:
            try:
                event = self.conn.next_event()
            except RemoteProtocolError as exc:
                await self._bad_line(exc)
                continue
            if event is NEED_DATA:
                data = await self._read()
                self.conn.receive_data(data)
                if data and self.slots is not None and not self._holding and self.conn.state in BETWEEN_ACTIONS:
                    await self._maybe_take_slot()
                continue
            if isinstance(event, ProcessRecords) and self.slots is not None and not self._holding:
                await self._take_slot()  # a batch small enough to arrive in one read
            return event  # type: ignore[return-value]

    async def _maybe_take_slot(self) -> None:
        """The first bytes of the next action: a batch waits for a slot before more of
        it is taken into memory (the daemon sends one action at a time); a small
        action never does."""
        if self.conn.buffered == 0:
            return
        name = action_in(self.conn.peek(PEEK))
        if name in SMALL_ACTIONS or (name is None and self.conn.buffered < PEEK):
            return
        await self._take_slot()

    async def _take_slot(self) -> None:
        assert self.slots is not None
        if await self.slots.acquire(self, self._aborted):
            self._holding = True
            self._grew = time.monotonic()

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.slots.release(self)  # type: ignore[union-attr]

    async def _read(self) -> bytes:
        """The next bytes from the daemon (b"" at the end). A slot holder whose line
        stops growing gives the slot back; an idle worker can be stopped here."""
        idle = self.conn.state in BETWEEN_ACTIONS and self.conn.buffered == 0 and not self.conn.overflowing
        if idle and self.stopping and not self.reader.unread:
            raise _Stopped
        self._idle = idle
        self._reading = asyncio.current_task()
        try:
            if self._holding and not idle:
                try:
                    async with asyncio.timeout(STALL_S):
                        return await self._received(self.reader.read(READ_CHUNK))
                except TimeoutError:
                    self.log.warning(
                        "peer_stalled",
                        line_bytes=self.conn.buffered,
                        idle_s=STALL_S,
                        what_to_do="the daemon's side stopped sending in the middle of an action; "
                        "its in-flight slot is given back until it sends again",
                    )
                    self._release()
            return await self._received(self.reader.read(READ_CHUNK))
        except asyncio.CancelledError:
            task = self._task
            if task is None or asyncio.current_task() is not task or not self.stopping:
                raise
            if self._aborted.is_set() and not self._idle:  # past shutdown_timeout, the action still arriving
                task.uncancel()
                self.log.warning("unanswered_at_shutdown", line_bytes=self.conn.buffered,
                                 what_to_do="the daemon's side had not sent the whole action by shutdown_timeout")
                raise _Stopped from None
            if not self._idle:
                raise
            task.uncancel()
            if not self.reader.unread:
                raise _Stopped from None
            self._idle = False
            return await self._received(self.reader.read(READ_CHUNK))
        finally:
            self._idle = False
            self._reading = None

    async def _received(self, read: Any) -> bytes:
        try:
            data = await read
        except ConnectionError as exc:  # a reset peer: the end of input, not a crash
            self._lost = exc
            return b""
        self._grew = time.monotonic()
        return data

    async def _write(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError as exc:
            self._lost = exc
            raise _Lost(f"{type(exc).__name__}: {exc}") from None

    async def _answer(self, action: str) -> None:
        """The action's status: its checkpointers closed, the outstanding checkpoint
        (if a cancelled call left one) settled first, nothing between them."""
        for cp in self._issued:
            cp.close()
        self._issued.clear()
        async with self._cp_lock:
            await self._settle()
            if self._lost is not None:
                raise _Lost(f"no status for {action!r}: {type(self._lost).__name__}: {self._lost}")
            if self.conn.state is State.CLOSED:
                raise _Lost(f"no status for {action!r}: the daemon closed the connection first")
            if self.conn.state is State.CHECKPOINTING and self.conn.owes_status is None:
                raise _Lost(f"no status for {action!r}: a checkpoint is still outstanding (no reply "
                            f"within {REPLY_TIMEOUT_S} s)")
            data = self.conn.send(Status(response_for=action))
            await self._write(data)

    async def _settle(self) -> None:
        """Wait for the outstanding checkpoint's reply (bounded by its round trip)."""
        task = self._outstanding
        if task is None or task is asyncio.current_task():
            return
        await asyncio.wait((task,))  # (a caller cancelled here leaves it outstanding)
        if self._outstanding is task:
            self._outstanding = None
        if not task.cancelled():
            task.exception()  # its caller, if still there, has it; nobody else needs it

    async def _roundtrip(self, request: Checkpoint) -> CheckpointReply:
        """One checkpoint, owned by the worker: the request out, the daemon's reply
        back, nothing between. The caller may be cancelled (a time-out); the round
        trip is not, and is settled before the next checkpoint or status."""
        async with self._cp_lock:
            await self._settle()
            try:
                data = self.conn.send(request)
            except LocalProtocolError as exc:  # not allowed here (between actions, ...)
                raise CheckpointError("InvalidStateException", request.sequence_number,
                                      request.sub_sequence_number, str(exc)) from None
            task = self._outstanding = asyncio.ensure_future(self._exchange(request, data))
        reply = await asyncio.shield(task)
        if reply.error is None and self.metrics is not None:
            self.metrics.checkpoint("stored")
        return reply

    async def _exchange(self, request: Checkpoint, data: bytes) -> CheckpointReply:
        seq, sub = request.sequence_number, request.sub_sequence_number
        try:
            await self._write(data)
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                event = await self._next_event()
        except _Lost as exc:
            raise CheckpointError("ConnectionClosed", seq, sub, str(exc)) from None
        except TimeoutError:
            self.log.error("checkpoint_reply_timeout", timeout_s=REPLY_TIMEOUT_S,
                           what_to_do="the daemon did not answer a checkpoint; the connection is closed")
            raise CheckpointError("ConnectionClosed", seq, sub, f"no reply within {REPLY_TIMEOUT_S} s") from None
        if isinstance(event, ConnectionClosed):
            raise CheckpointError("ConnectionClosed", seq, sub, "the daemon closed the connection")
        if not isinstance(event, CheckpointReply):  # an action while CHECKPOINTING: the daemon never does this
            raise CheckpointError("ConnectionClosed", seq, sub, f"{event.action} arrived instead of the reply")
        if event.malformed is not None:
            self.log.error("bad_line", error=event.malformed, action="checkpoint",
                           what_to_do="the daemon's checkpoint reply could not be read: the checkpoint failed")
        return event

    # -- dispatch ----------------------------------------------------------------

    async def _dispatch(self, event: Event) -> None:
        if self.pause is not None and self.pause.paused and isinstance(event, Action):
            await self._paused(event)
        if isinstance(event, Initialize):
            await self._initialize(event)
        elif isinstance(event, ProcessRecords):
            await self._process_records(event)
        elif isinstance(event, ShutdownRequested):
            await self._call("shutdown_requested", None, self._checkpointers("shutdown_requested"))
            if self.downstream.holds_checkpoints:
                await self._checkpoint_safe()
        elif isinstance(event, ShardEnded) or (isinstance(event, Shutdown) and event.is_shard_end):
            await self._shard_ended()
        elif isinstance(event, (LeaseLost, Shutdown)):
            self.log.info("lease_lost", action=event.action)
            self.downstream.lease_lost()  # its uncommitted rows go: the new owner reads them again
            await self._call("lease_lost", None, self._checkpointers("lease_lost"))
        if isinstance(event, Action):
            await self._answer(event.action)

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
        await self._call("initialize", shard, self._checkpointers("initialize"))
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
            outcome = await self._call(
                "process_records", batch, self._checkpointers("process_records"),
                collect_rows=self.downstream.collects_rows,
            )
        finally:
            self.progress.batch_done()  # an idle shard holds no batch in memory
        if not outcome.ok:
            await self._dead_letter_all([BadRecords(event.records, "handler failed", outcome.error or "")])
        elif outcome.failed:
            await self._dead_letter_failed(records, outcome.failed)  # before any checkpoint can pass them
        items, bad = encode_rows(outcome.rows or ())
        await self._dead_letter_all(bad)
        assert self.shard is not None
        if await self.downstream.batch(items, last, event.millis_behind_latest, self._release):
            await self._checkpoint_safe()
        self.batches += 1
        self.records += len(records)
        self.millis_behind_latest = event.millis_behind_latest
        if self.metrics is not None:
            self.metrics.batch(self.shard.shard_id, len(records))
        if self.log.is_enabled("debug"):
            self.log.debug(
                "batch",
                records=len(records),
                millis_behind_latest=event.millis_behind_latest,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )

    async def _call(self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer],
                    **kwargs: Any) -> Outcome:
        """The handler-call seam, metered on the server's side (retries included)."""
        started = time.perf_counter()
        outcome = await self.calls.call(action, arg, checkpointer, **kwargs)
        if self.metrics is not None:
            self.metrics.handler_call(action, call_outcome(outcome.result, outcome.error),
                                      time.perf_counter() - started)
            stats = self.calls.take_stats()
            if stats:
                self.metrics.handler_stats(action, stats)
                if stats.get("rows_discarded") and not self._discard_warned:
                    self._discard_warned = True
                    self.log.warning("rows_discarded", rows=stats["rows_discarded"],
                                     what_to_do="the handler emits rows but no sink keeps them: add --sink "
                                                "parquet:DIR (or file:DIR, iceberg:DIR); counted in "
                                                "mldserver_rows_discarded_total, said once per shard")
        return outcome

    async def _paused(self, event: Action) -> None:
        """Paused: wait before this action's handler call (the daemon waits for its
        status); a batch meanwhile checkpoints what the sink commits."""
        self.log.info("paused_action", action=event.action)
        meanwhile = self._checkpoint_safe if isinstance(event, ProcessRecords) else None
        await self.pause.wait(every=PAUSED_CHECKPOINT_S, meanwhile=meanwhile, stop=self._aborted)  # type: ignore[union-attr]
        self.log.info("resumed_action", action=event.action)

    async def _shard_ended(self) -> None:
        self.log.info("shard_ended")
        if self.shard is not None:
            await self.downstream.shard_ended()  # spooled before SHARD_END
        cp = self._checkpointer("shard_ended", budget=self.settings.shard_end_budget, clamped=False)
        try:
            await self._call("shard_ended", None, lambda: cp)
        except Exception as exc:  # SHARD_END is stored whatever the call did
            self.log.error("action_failed_internally", action="shardEnded", error=f"{type(exc).__name__}: {exc}",
                           exc_info=exc, what_to_do="a bug in mldserver: SHARD_END is stored all the same")
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

        metrics = self.metrics

        def on_refused(error: CheckpointError, delay: float | None) -> None:
            if metrics is not None:
                metrics.checkpoint("failed" if delay is None else "retry")
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
            safe = self.downstream.safe
        cp = Checkpointer(
            self._roundtrip,
            backoff=self._checkpoint_backoff,
            retries=self.settings.checkpoint_retries,
            budget=budget,
            progress=self.progress,
            safe=safe,
            on_refused=on_refused,
        )
        self._issued.append(cp)
        return cp

    async def _bad_line(self, exc: RemoteProtocolError) -> None:
        self.log.error(
            "bad_line",
            error=str(exc),
            action=exc.action,
            line=exc.line[:200].decode("utf-8", "replace"),
            what_to_do="the daemon sent something the protocol does not allow; see the line above",
        )
        if exc.too_long:
            path = await self._dead_letter_overlong(str(exc))
            if path is not None:
                self.log.error("dead_lettered", reason="line too long", path=str(path))
                if self.metrics is not None:
                    self.metrics.dead_letter("line too long")
        elif exc.line and (exc.action is None or exc.action == "processRecords"):
            path = await self.dead_letters.line(self.conn.shard_id, exc.line, reason=str(exc))
            self.log.error("dead_lettered", reason="bad line", path=str(path))
        if asyncio.current_task() is self._outstanding:
            # Inside a checkpoint round trip (the daemon never sends an action there):
            # the status goes out at once, the round trip's lock being held by its caller.
            if exc.action is not None:
                await self._write(self.conn.send(Status(response_for=exc.action)))
            return
        if exc.action is not None:
            self._owed = exc.action
            await self._answer(exc.action)
            self._owed = None
        self._release()  # nothing of it stays in memory: the slot goes back

    async def _dead_letter_overlong(self, error: str) -> Path | None:
        """Stream a line over ``max_line_size`` to its own dead-letter file as it
        arrives (never whole in memory): one JSON entry whose ``line`` is the line,
        published by a rename once complete. Its bytes are read to its end even if the
        file cannot be written."""
        base = self.dead_letters.path_for(self.conn.shard_id)
        path = base.with_name(f"{base.stem}.overlong-{time.time_ns()}.jsonl")
        tmp = path.with_name(path.name + ".tmp")
        head = orjson.dumps({"ts": utc_timestamp(), "shard_id": self.conn.shard_id, "reason": "line too long",
                             "error": error, "line": ""})[:-2]  # ... "line":"  (its text follows)
        out: Any = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = await asyncio.to_thread(open, tmp, "wb")
            await asyncio.to_thread(out.write, head)
        except OSError as exc:
            self.log.error("dead_letter_failed", path=str(tmp), error=f"{type(exc).__name__}: {exc}")
            out = None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            chunk, done = self.conn.overflow()
            text = decoder.decode(chunk, final=done)
            if out is not None and text:
                try:
                    await asyncio.to_thread(out.write, json.dumps(text)[1:-1].encode("ascii"))
                except OSError as exc:
                    self.log.error("dead_letter_failed", path=str(tmp), error=f"{type(exc).__name__}: {exc}")
                    out.close()
                    out = None
            if done:
                break
            data = await self._read()
            if not data:
                break  # the end of input inside the line: what arrived is kept
            self.conn.receive_data(data)
        if out is None:
            return None

        def publish() -> None:
            with out:
                out.write(b'"}\n')
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)

        try:
            await asyncio.to_thread(publish)
        except OSError as exc:
            self.log.error("dead_letter_failed", path=str(tmp), error=f"{type(exc).__name__}: {exc}")
            return None
        return path

    async def _dead_letter_failed(self, records: list[Any], failed: list[Any]) -> None:
        """The records the handler gave up on (``batch.fail``), each with its error, in
        one write."""
        entries = [(_as_daemon_wrote(records, i), error, attempts) for i, error, attempts in failed
                   if type(i) is int and 0 <= i < len(records)]
        if len(entries) < len(failed):  # not from this batch: a defect on the handler's side of the seam
            self.log.error("failed_records_unknown", failed=failed[:10], records=len(records),
                           what_to_do="report this: the handler named records the batch does not have")
        if not entries:
            return
        path = await self.dead_letters.failed_records(self.conn.shard_id, entries, RECORD_FAILED)
        self.log.error("dead_lettered", reason=RECORD_FAILED, error=entries[0][1], records=len(entries),
                       path=str(path))

    async def _dead_letter_all(self, bad: list[BadRecords]) -> None:
        for raws, reason, error in bad:
            if reason == INVALID_AGGREGATE:
                self.log.error("kpl_aggregate_invalid", error=error, sequence_number=raws[0].get("sequenceNumber"))
            records = [r if type(r) is dict else {"data": None, "value": r} for r in raws]
            path = await self.dead_letters.records(
                self.conn.shard_id, records, reason, error, attempts=self.settings.handler_retries + 1
            )
            self.log.error("dead_lettered", reason=reason, error=error, records=len(records), path=str(path))
