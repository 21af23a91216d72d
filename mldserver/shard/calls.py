"""Calling one shard's handler: time-out, retries with backoff, and the outcome.

The driver hands over an action and its inputs and gets an :class:`Outcome` back;
the handler's checkpoint requests go out through the checkpointer it is given
(``(sequence_number, sub_sequence_number)`` in, stored or ``CheckpointError`` out) and
the rows it emits come back in the outcome. All of it is plain data, so the same seam
can later run the handler in another process::

    calls = HandlerCalls(factory, context, retries=2, timeout=60.0, backoff=backoff, log=log)
    calls.create()                                   # None, or why the factory failed
    await calls.call("initialize", shard_info, checkpointer)
    outcome = await calls.call("process_records", batch, checkpointer, collect_rows=True)
    outcome.ok, outcome.result, outcome.error, outcome.rows
    #   True, "ok", None, [Emitted(record, {"k": 1}, None), ...]
    #   False, "failed", "ValueError: bad order", None       (after every attempt failed)
    #   True, "checkpoint_failed", "ThrottlingException", None   (a CheckpointError escaped)

A call that raises or runs past ``timeout`` is retried ``retries`` times; a retried
``process_records`` starts with no rows (no row twice). A ``CheckpointError`` that
escapes the handler ends the action at once, without a retry (the checkpointer has
logged it), keeping what it emitted. ``checkpointer`` is called once an attempt for the checkpointer to hand
the handler (one per attempt, or the same one every time).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, NamedTuple

from ..backoff import Backoff
from ..checkpointer import Checkpointer
from ..errors import CheckpointError
from ..logs import EventLogger
from ..records import Emitted

OK = "ok"
CHECKPOINT_FAILED = "checkpoint_failed"
FAILED = "failed"


class Outcome(NamedTuple):
    result: str  # OK, CHECKPOINT_FAILED or FAILED
    error: str | None = None
    rows: list[Emitted] | None = None  # what process_records emitted, when collected

    @property
    def ok(self) -> bool:
        """Did the handler finish the action (a failed checkpoint ends it, done)?"""
        return self.result != FAILED


def _invoke(handler: Any, action: str, arg: Any, cp: Checkpointer) -> Any:
    if action == "process_records":
        return handler.process_records(arg, cp)
    if action == "initialize":
        return handler.initialize(arg)
    if action == "lease_lost":
        return handler.lease_lost()
    return getattr(handler, action)(cp)  # shutdown_requested, shard_ended


class HandlerCalls:
    def __init__(
        self,
        factory: Callable[[Any], Any],
        context: Any,
        *,
        retries: int,
        timeout: float,
        backoff: Backoff,
        log: EventLogger,
    ) -> None:
        self.factory = factory
        self.context = context
        self.retries = retries
        self.timeout = timeout
        self.backoff = backoff
        self.log = log
        self.handler: Any = None

    def create(self) -> str | None:
        """Make this shard's handler; why it failed, or None."""
        try:
            self.handler = self.factory(self.context)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.log.error("handler_create_failed", error=error, exc_info=True)
            return error
        return None

    def close(self) -> None:
        """The connection is over (nothing to release in this loop)."""

    async def call(
        self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer], *, collect_rows: bool = False
    ) -> Outcome:
        if self.handler is None:
            return Outcome(FAILED, "no handler (its creation failed)")
        attempts = self.retries + 1
        error = ""
        for attempt in range(attempts):
            if collect_rows:
                arg.rows = []  # a retried call starts over: no row twice
            try:
                async with asyncio.timeout(self.timeout):
                    await _invoke(self.handler, action, arg, checkpointer())
                return Outcome(OK, None, arg.rows if collect_rows else None)
            except CheckpointError as exc:  # the rows emitted before it stand: the batch is done
                return Outcome(CHECKPOINT_FAILED, exc.error, arg.rows if collect_rows else None)
            except TimeoutError:
                error = f"timed out after {self.timeout} s (execution_timeout)"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                if collect_rows:
                    arg.rows = None  # the rows are in the outcome (or dropped): the batch no longer collects
            retry = attempt + 1 < attempts
            self.log.error(
                "handler_failed",
                callback=action,
                error=error,
                attempt=attempt + 1,
                attempts=attempts,
                retry=retry,
                exc_info=not retry,
            )
            if retry:
                await asyncio.sleep(self.backoff.delay(attempt))
        return Outcome(FAILED, error)
