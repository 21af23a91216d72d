"""Checkpointing from a handler, with the daemon's errors handled per PROTOCOL.md.

A ``Checkpointer`` lives for one action (a batch, a shutdown request, a shard end)::

    await checkpointer.checkpoint()                              # all delivered / SHARD_END
    await checkpointer.checkpoint(r.sequence_number, r.sub_sequence_number)

Each call is one round trip: the checkpoint line goes to the daemon, and the daemon's
reply comes back before anything else happens on the shard. ``ThrottlingException``
and ``KinesisClientLibDependencyException`` are retried with jittered exponential
backoff within a budget; every other error raises ``CheckpointError`` at once.
After a ``ShutdownException`` (lease lost) later calls fail without asking the daemon.

With an explicit sequence number and no sub-sequence number, the highest sub-sequence
number delivered so far under that sequence number is sent (0 if none), never null:
the daemon reads null as 0, which re-delivers the rest of a KPL aggregate after a
restart and is refused once a later sub-sequence was stored.

With a sink configured, the worker passes a ``clamp``: a checkpoint never goes past
what the sink has committed (invariant 3). ``checkpoint()`` then means "everything
that is safe", and a call with nothing new to store sends nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from .backoff import Backoff
from .errors import CheckpointError
from .protocol import Checkpoint, CheckpointReply

Roundtrip = Callable[[Checkpoint], Awaitable[CheckpointReply]]


class Checkpointer:
    def __init__(
        self,
        roundtrip: Roundtrip,
        *,
        backoff: Backoff,
        retries: int,
        budget: float | None = None,
        delivered_sub: Callable[[str], int] = lambda sequence_number: 0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_retry: Callable[[CheckpointError, float], None] | None = None,
        clamp: Callable[[str | None, int | None], tuple[str, int] | None] | None = None,
    ) -> None:
        self._roundtrip = roundtrip
        self._backoff = backoff
        self._retries = retries
        self._budget = budget
        self._delivered_sub = delivered_sub
        self._sleep = sleep
        self._clock = clock
        self._on_retry = on_retry
        self._clamp = clamp
        self.lease_lost = False
        self.stored_all = False  # a null checkpoint succeeded (SHARD_END during a shard end)
        self.last_stored: tuple[str | None, int | None] | None = None

    async def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int | None = None) -> None:
        if sequence_number is not None:
            sequence_number = str(sequence_number)
            if sub_sequence_number is None:
                sub_sequence_number = self._delivered_sub(sequence_number)
        else:
            sub_sequence_number = None
        if self._clamp is not None:
            safe = self._clamp(sequence_number, sub_sequence_number)
            if safe is None:
                return  # nothing committed beyond what is stored
            sequence_number, sub_sequence_number = safe
        if self.lease_lost:
            raise CheckpointError("ShutdownException", sequence_number, sub_sequence_number, "lease already lost")
        started = self._clock()
        attempt = 0
        while True:
            reply = await self._roundtrip(Checkpoint(sequence_number, sub_sequence_number))
            if reply.error is None:
                self.last_stored = (sequence_number, sub_sequence_number)
                if sequence_number is None:
                    self.stored_all = True
                return
            error = CheckpointError(reply.error, sequence_number, sub_sequence_number)
            if reply.error == "ShutdownException":
                self.lease_lost = True
            if not error.retriable:
                raise error
            delay = self._backoff.delay(attempt)
            attempt += 1
            if self._budget is not None:
                if self._clock() - started + delay > self._budget:
                    raise error
            elif attempt > self._retries:
                raise error
            if self._on_retry is not None:
                self._on_retry(error, delay)
            await self._sleep(delay)
