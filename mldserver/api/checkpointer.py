"""Checkpointing from a handler, with the daemon's errors handled per docs/protocol.md (section 5).

A ``Checkpointer`` lives for one action (a batch, a shutdown request, a shard end)::

    await checkpointer.checkpoint()                              # all delivered / SHARD_END
    await checkpointer.checkpoint(r.sequence_number, r.sub_sequence_number)

and is valid only inside it: the shard's driver closes it before it answers the
action, and a later call (a checkpointer kept for the next batch) raises
``CheckpointError`` without asking the daemon. A sequence number that is not a string (or an int), or a
sub-sequence number that is not an int, raises ``CheckpointError``
(``IllegalArgumentException``) without asking the daemon either.

Each call is one round trip: the checkpoint line goes to the daemon, and the daemon's
reply comes back before anything else happens on the shard. ``ThrottlingException``
and ``KinesisClientLibDependencyException`` are retried with jittered exponential
backoff within a budget; every other error raises ``CheckpointError`` at once. With
``retry=False`` the call is one round trip whatever the answer, for a caller with a
retry loop of its own (an amazon_kclpy processor, ``api/kclpy``)::

    await checkpointer.checkpoint(r.sequence_number, r.sub_sequence_number, retry=False)
    # CheckpointError("ThrottlingException") on the daemon's first refusal
After a ``ShutdownException`` (lease lost) later calls fail without asking the daemon.

With an explicit sequence number and no sub-sequence number, the highest sub-sequence
number delivered so far under that sequence number is sent (0 if none), never null:
the daemon reads null as 0, which re-delivers the rest of a KPL aggregate after a
restart and is refused once a later sub-sequence was stored.

The shard's progress (``shard/progress.py``'s ``ShardProgress``) gives those defaults
and learns what was stored (``checkpointer.stored``: where a fresh handler instance
starts). With a sink configured, the driver also passes ``safe`` (what the sink has
committed): a checkpoint never goes past it (invariant 3). ``checkpoint()`` then means
"everything that is safe", and a call with nothing new to store sends nothing.

Every refusal is reported to ``on_refused(error, delay)`` once: with the delay before
the next attempt, or ``None`` when the checkpoint gives up and raises.

The timers the calling handler call has created so far (``mldserver.timers.pending``)
are committed before anything else: a record checkpointed after a create never loses
its timer. A commit that fails raises ``TimerError`` here, and the call fails.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, NoReturn, Protocol

from ..base.backoff import Backoff
from ..errors import CheckpointError
from ..base.positions import Position
from ..protocol import Checkpoint, CheckpointReply
from ..timers import pending as timer_ops

Roundtrip = Callable[[Checkpoint], Awaitable[CheckpointReply]]


class Progress(Protocol):
    """What a checkpointer asks of its shard's progress (``shard/progress.py``)."""

    stored: Position | None  # the lease's checkpoint, as far as the shard knows

    def default_sub(self, sequence_number: str) -> int: ...

    def clamp(self, wanted: Position | None, safe: Position | None) -> Position | None: ...

    def checkpointed(self, position: Position) -> None: ...


class Checkpointer:
    """Stores the shard's progress in the daemon's lease table, for the one action it
    is given with (a batch, a shutdown request, a shard end)::

        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                await self.save(record)
            await checkpointer.checkpoint()                       # everything delivered so far
            # or at a record: await checkpointer.checkpoint(r.sequence_number, r.sub_sequence_number)

    The daemon's refusals are ``CheckpointError``; the throttling ones are retried first
    (see the module). With a sink, a checkpoint never passes what the sink committed."""

    def __init__(
        self,
        roundtrip: Roundtrip,
        *,
        backoff: Backoff,
        retries: int,
        budget: float | None = None,
        progress: Progress | None = None,
        safe: Callable[[], Position | None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[CheckpointError, float | None], None] | None = None,
    ) -> None:
        assert safe is None or progress is not None, "clamping needs the shard's progress"
        self._roundtrip = roundtrip
        self._backoff = backoff
        self._retries = retries
        self._budget = budget
        self._progress = progress
        self._safe = safe
        self._sleep = sleep
        self._clock = clock
        self._on_refused = on_refused
        self.lease_lost = False
        self.stored_all = False  # a null checkpoint succeeded (SHARD_END during a shard end)
        self.closed = False

    def close(self) -> None:
        """The action is answered: any later ``checkpoint()`` raises."""
        self.closed = True

    @property
    def stored(self) -> Position | None:
        """The checkpoint the daemon stored last, as far as the shard knows (None: not
        known, or no progress kept)."""
        return None if self._progress is None else self._progress.stored

    async def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int | None = None, *,
                         retry: bool = True) -> None:
        """Checkpoint at a record (its sequence number, and sub-sequence number: the
        highest delivered under it when left out), or with no argument at everything
        delivered (``SHARD_END`` during a shard end)::

            await checkpointer.checkpoint()
            await checkpointer.checkpoint(record.sequence_number, record.sub_sequence_number)

        Raises ``CheckpointError`` when the daemon refuses it for good (``error``: the Java
        exception's name, e.g. ``ShutdownException`` once the lease is lost) or after this
        action was answered; ``retry=False`` gives up at the first refusal."""
        if self.closed:
            raise CheckpointError(
                "InvalidStateException", _text(sequence_number), None,
                "checkpointer used outside its action: the action it was given for has been answered; "
                "use the checkpointer passed to the current callback",
            )
        if not (sequence_number is None or isinstance(sequence_number, str) or _is_int(sequence_number)):
            self._refused(CheckpointError(
                "IllegalArgumentException", _text(sequence_number), None,
                f"sequence_number must be a string, got {type(sequence_number).__name__}"), None)
        if not (sub_sequence_number is None or _is_int(sub_sequence_number)):
            self._refused(CheckpointError(
                "IllegalArgumentException", _text(sequence_number), None,
                f"sub_sequence_number must be an int, got {type(sub_sequence_number).__name__}"), None)
        await timer_ops.flush()  # the calling call's timers durable first (TimerError if not)
        progress = self._progress
        position = None
        if sequence_number is not None:
            sequence_number = str(sequence_number)
            if sub_sequence_number is None:
                sub_sequence_number = 0 if progress is None else progress.default_sub(sequence_number)
            position = Position.parse(sequence_number, sub_sequence_number)  # None: the daemon judges it
        else:
            sub_sequence_number = None
        if self._safe is not None:
            # (an unparseable wanted position counts as "everything safe")
            position = progress.clamp(position, self._safe())  # type: ignore[union-attr]
            if position is None:
                return  # nothing committed beyond what is stored
            sequence_number, sub_sequence_number = position.text, position.sub
        if self.lease_lost:
            self._refused(CheckpointError("ShutdownException", sequence_number, sub_sequence_number,
                                          "lease already lost"), None)
        started = self._clock()
        attempt = 0
        while True:
            try:
                reply = await self._roundtrip(Checkpoint(sequence_number, sub_sequence_number))
            except CheckpointError as exc:  # the conversation cannot carry it (closed, wrong state)
                self._refused(exc, None)
            if reply.error is None:
                if sequence_number is None:
                    self.stored_all = True
                elif position is not None and progress is not None:
                    progress.checkpointed(position)
                return
            error = CheckpointError(reply.error, sequence_number, sub_sequence_number)
            if reply.error == "ShutdownException":
                self.lease_lost = True
            if not error.retriable or not retry:
                self._refused(error, None)
            delay = self._backoff.delay(attempt)
            attempt += 1
            if self._budget is not None:
                if self._clock() - started + delay > self._budget:
                    self._refused(error, None)
            elif attempt > self._retries:
                self._refused(error, None)
            if self._on_refused is not None:
                self._on_refused(error, delay)
            await self._sleep(delay)

    def _refused(self, error: CheckpointError, delay: None) -> NoReturn:
        """Report a refusal the checkpoint gives up on, and raise it."""
        if self._on_refused is not None:
            self._on_refused(error, delay)
        raise error


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: object) -> str | None:
    return None if value is None else str(value)[:100]
