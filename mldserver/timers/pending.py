"""A call's timers: what ``create`` and ``cancel`` asked for during one call (a shard's
action, or one timer callback), kept here, in order, until they are made durable
together, in one commit::

    pending = Pending(timers.write)               # the call starts; current.set(pending) in its task
    await self.timers.create(remind, at, "order-7", {"order": 7})   # checked, appended: no round trip
    await self.timers.create(remind, at, "order-8", {"order": 8})
    await self.timers.cancel(remind, "order-8")   # -> True (created in this call), appended
    await checkpointer.checkpoint()               # the ops first, in one commit, then the checkpoint
    ops = pending.close()                         # the call returned: the rest, with its done
    # [Timer("handlers.orders:remind", "order-7", ...), ...]: written before the action's status

Where they go, so that a record checkpointed after a create never loses its timer:

- a checkpoint the call asks for writes them first (``flush``; a handler process sends
  them in the checkpoint request, the server commits them before it asks the daemon);
- the call's end writes the rest before the action's status (a handler process sends
  them in its ``done`` frame); a timer callback's, before it counts as done;
- a call that fails loses them, as it loses its records not yet checkpointed: the
  action is redone, and creates them again;
- a write that fails fails the call (``failed``), whatever the handler caught: the
  action is retried, then dead-lettered, as any failure is.

A cancel is answered here when this call's ops touched its key; otherwise it asks the
store (with the ops so far, in the same commit). A task the handler starts inside a
call shares the call's ops while the call runs (tasks copy ``current``); once the call
has ended, and in a task started outside any call, each create and cancel is written
on its own before it returns, as before (``Timers.write``).

Between a handler process and the server they cross as a list in order
(``remote.encode``).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Awaitable, Callable, Sequence

from .store import Key, Op, Timer

Write = Callable[[Sequence[Op]], Awaitable[list[bool]]]


class Pending:
    __slots__ = ("ops", "write", "open", "failed", "_last")

    def __init__(self, write: Write) -> None:
        self.ops: list[Op] = []
        self.write = write  # Timers.write of this process: one commit, durable on return
        self.open = True
        self.failed: Exception | None = None  # a write of these ops failed (a TimerError): the call fails
        self._last: dict[Key, bool] = {}  # key -> pending after the ops not yet written

    def create(self, timer: Timer) -> None:
        self.ops.append(timer)
        self._last[timer.key] = True

    def cancel(self, key: Key) -> bool | None:
        """Appended, and whether a timer of ``key`` was pending, if this call's ops
        not yet written touched it; None (nothing appended): the store must say."""
        was = self._last.get(key)
        if was is not None:
            self.ops.append(key)
            self._last[key] = False
        return was

    def take(self) -> list[Op]:
        """The ops so far, to be written now (the store answers for them after)."""
        ops, self.ops = self.ops, []
        self._last.clear()
        return ops

    def close(self) -> list[Op]:
        """The call is over: the ops left; later creates are written on their own."""
        self.open = False
        return self.take()

    async def send(self, ops: list[Op]) -> list[bool]:
        """``ops`` (taken from here) written; a failure fails the call too."""
        try:
            return await self.write(ops)
        except Exception as exc:
            self.failed = exc
            raise

    async def flush(self) -> None:
        """Every op so far durable (before a checkpoint)."""
        if self.ops:
            await self.send(self.take())


current: ContextVar[Pending | None] = ContextVar("mldserver_pending_timers", default=None)


def pending() -> Pending | None:
    """The ops of the call this runs in, if it is still running."""
    p = current.get()
    return p if p is not None and p.open else None


async def flush() -> None:
    """Before a checkpoint: the calling call's ops durable (TimerError if not)."""
    p = pending()
    if p is not None:
        await p.flush()
