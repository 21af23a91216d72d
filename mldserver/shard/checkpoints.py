"""A shard connection's checkpoints: the round trip with the daemon, one at a time,
and the checkpointers each action hands its handler::

    checkpoints = Checkpoints(conn, wire, settings=settings, downstream=downstream, metrics=metrics, log=log)
    checkpoints.open()                                     # initialize: the shard is known
    cp = checkpoints.for_action("process_records")()       # a Checkpointer, clamped to what is safe
    await cp.checkpoint("49590...", 0)
    #   -> {"action":"checkpoint","sequenceNumber":"49590...","subSequenceNumber":0}
    #   <- {"action":"checkpoint","sequenceNumber":"49590...","subSequenceNumber":0,"error":null}
    await checkpoints.checkpoint_safe()                    # the server's own: what the sink committed
    async with checkpoints.settled():                      # before the action's status
        await wire.write(conn.send(Status(response_for="processRecords")))

- The round trip is this object's (``roundtrip``), in its own task: a caller that is
  cancelled (``execution_timeout``, the handler's own ``wait_for``) leaves it running;
  it is settled (its reply read, within ``REPLY_TIMEOUT_S``) before the next
  checkpoint and before any status. A reply that cannot be read is a failed
  checkpoint (the protocol core's ``MALFORMED_REPLY``).
- The action's checkpointers are closed before its status (``settled``): one kept for
  later raises instead of reaching the daemon in the middle of another action.
- With a sink (``downstream.holds_checkpoints``) a checkpointer goes no further than
  what the sink committed (``downstream.safe``), except at a shard end, whose rows are
  spooled: SHARD_END is safe, and stored whatever the handler did (``store_shard_end``,
  retried within ``shard_end_budget``).
- Every checkpoint the daemon refuses is logged once, as ``checkpoint`` with an
  ``outcome``: ``retry`` (with ``delay_ms``) or ``failed``; and counted, with those
  stored, in ``mldserver_checkpoints_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, AsyncIterator, Callable

from ..base.backoff import Backoff
from ..errors import CheckpointError
from ..protocol import Checkpoint, CheckpointReply, ConnectionClosed, LocalProtocolError, State, Status
from ..api.checkpointer import Checkpointer
from .progress import ShardProgress
from .slots import Lost

if TYPE_CHECKING:
    from ..base.config import Settings
    from ..base.logs import EventLogger
    from ..protocol import Connection
    from .downstream import Downstream
    from .status import Meter
    from .slots import Wire

# A checkpoint reply that has not come after this long: the connection has failed.
REPLY_TIMEOUT_S = 120.0


class Checkpoints:
    def __init__(self, conn: Connection, wire: Wire, *, settings: Settings, downstream: Downstream,
                 metrics: Meter, log: EventLogger) -> None:
        self.conn = conn
        self.wire = wire
        self.settings = settings
        self.downstream = downstream
        self.metrics = metrics
        self.log = log
        self.progress = ShardProgress()  # delivered and stored: the defaults and the clamp
        self.outstanding: asyncio.Task[CheckpointReply] | None = None  # the round trip under way
        self._opened = False  # initialize arrived: checkpoints are clamped from here on
        self._backoff = Backoff(first=settings.checkpoint_backoff, cap=settings.checkpoint_backoff_cap)
        self._lock = asyncio.Lock()  # one checkpoint round trip at a time; none across a status
        self._issued: list[Checkpointer] = []  # this action's checkpointers, closed before its status

    def open(self) -> None:
        """The shard is initialized: its checkpoints are clamped to what is safe."""
        self._opened = True

    def close(self) -> None:
        """The connection is over: a round trip still under way ends."""
        if self.outstanding is not None and not self.outstanding.done():
            self.outstanding.cancel()

    # -- checkpointers -------------------------------------------------------------

    def for_action(self, action: str) -> Callable[[], Checkpointer]:
        """What a handler call takes: a checkpointer for ``action``, made per attempt."""
        return lambda: self.checkpointer(action)

    def for_shard_end(self) -> Checkpointer:
        """Not clamped (the shard's rows are spooled), retried within ``shard_end_budget``."""
        return self.checkpointer("shard_ended", budget=self.settings.shard_end_budget, clamped=False)

    def checkpointer(self, action: str, budget: float | None = None, clamped: bool = True) -> Checkpointer:
        """A checkpointer for one action; clamped to what is committed when a sink is
        downstream (not at a shard end, whose rows are spooled: SHARD_END is safe)."""
        log = self.log
        metrics = self.metrics

        def on_refused(error: CheckpointError, delay: float | None) -> None:
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
        if clamped and self.downstream.holds_checkpoints and self._opened:
            safe = self.downstream.safe
        cp = Checkpointer(
            self.roundtrip,
            backoff=self._backoff,
            retries=self.settings.checkpoint_retries,
            budget=budget,
            progress=self.progress,
            safe=safe,
            on_refused=on_refused,
        )
        self._issued.append(cp)
        return cp

    async def checkpoint_safe(self) -> None:
        """The server's own checkpoint: everything the sink has committed."""
        if not self._opened:
            return
        try:
            await self.checkpointer("server").checkpoint()
        except CheckpointError:
            pass  # logged by the checkpointer; the next one tries again

    async def store_shard_end(self, cp: Checkpointer) -> None:
        """After ``shard_ended``: SHARD_END stored by the server unless the handler did,
        or the lease is lost."""
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

    # -- the round trip ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def settled(self, action: str) -> AsyncIterator[None]:
        """Around ``action``'s status: its checkpointers closed, the outstanding
        checkpoint (if a cancelled call left one) settled first, none started until
        the status is out; ``Lost`` if no status can go (the peer is gone, or never
        replied)."""
        for cp in self._issued:
            cp.close()
        self._issued.clear()
        async with self._lock:
            await self._settle()
            lost = self.wire.lost
            if lost is not None:
                raise Lost(f"no status for {action!r}: {type(lost).__name__}: {lost}")
            if self.conn.state is State.CLOSED:
                raise Lost(f"no status for {action!r}: the daemon closed the connection first")
            if self.conn.state is State.CHECKPOINTING and self.conn.owes_status is None:
                raise Lost(f"no status for {action!r}: a checkpoint is still outstanding (no reply "
                           f"within {REPLY_TIMEOUT_S} s)")
            yield

    async def answered_in_roundtrip(self, action: str | None) -> bool:
        """A bad line read by the round trip, in place of the reply (the daemon never
        sends an action there): its status, if it named an action, goes out at once, the
        lock being held by the round trip's caller. False outside a round trip."""
        if asyncio.current_task() is not self.outstanding:
            return False
        if action is not None:
            await self.wire.write(self.conn.send(Status(response_for=action)))
        return True

    async def _settle(self) -> None:
        """Wait for the outstanding checkpoint's reply (bounded by its round trip)."""
        task = self.outstanding
        if task is None or task is asyncio.current_task():
            return
        await asyncio.wait((task,))  # (a caller cancelled here leaves it outstanding)
        if self.outstanding is task:
            self.outstanding = None
        if not task.cancelled():
            task.exception()  # its caller, if still there, has it; nobody else needs it

    async def roundtrip(self, request: Checkpoint) -> CheckpointReply:
        """One checkpoint: the request out, the daemon's reply back, nothing between.
        The caller may be cancelled (a time-out); the round trip is not, and is
        settled before the next checkpoint or status."""
        async with self._lock:
            await self._settle()
            try:
                data = self.conn.send(request)
            except LocalProtocolError as exc:  # not allowed here (between actions, ...)
                raise CheckpointError("InvalidStateException", request.sequence_number,
                                      request.sub_sequence_number, str(exc)) from None
            task = self.outstanding = asyncio.ensure_future(self._exchange(request, data))
        reply = await asyncio.shield(task)
        if reply.error is None:
            self.metrics.checkpoint("stored")
        return reply

    async def _exchange(self, request: Checkpoint, data: bytes) -> CheckpointReply:
        seq, sub = request.sequence_number, request.sub_sequence_number
        try:
            await self.wire.write(data)
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                event = await self.wire.next_event()
        except Lost as exc:
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
