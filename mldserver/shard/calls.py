"""Calling one shard's handler: time-out, retries with backoff, and the outcome.

The driver hands over an action and its inputs and gets an :class:`Outcome` back;
the handler's checkpoint requests go out through the checkpointer it is given
(``(sequence_number, sub_sequence_number)`` in, stored or ``CheckpointError`` out) and
the rows it emits come back in the outcome. All of it is plain data, so the same seam
can later run the handler in another process::

    policy = CallPolicy.from_settings(settings)     # retries=2, timeout=60.0, backoff (backoff.py)
    calls = HandlerCalls(factory, context, **policy._asdict(), log=log)
    calls.create()                                   # None, or why the factory failed
    await calls.call("initialize", shard_info, checkpointer)
    outcome = await calls.call("process_records", batch, checkpointer, collect_rows=True)
    outcome.ok, outcome.result, outcome.error, outcome.rows
    #   True, "ok", None, EmittedRows: {"k": 1} from record, ...   (rows.emitted)
    #   (outcome.failed: [(41, "ValueError: bad", 3)], the records batch.fail gave up on)
    #   False, "failed", "ValueError: bad order", None       (after every attempt failed)
    #   True, "checkpoint_failed", "ThrottlingException", None   (a CheckpointError escaped)

``check`` (``process_records``, a sink downstream) is a test of the batch the handler
must not be called without: ``Outcome(SKIPPED)`` when it says no. A handler process
(``pool.ProcessCalls``) runs it while it parses the batch, the handler called once it
says yes; here it runs first::

    outcome = await calls.call("process_records", batch, checkpointer, collect_rows=True,
                               check=batch.records.read_positions)   # False: a record without one
    outcome.result == SKIPPED                                        # the handler was not called

A call that raises or runs past ``timeout`` is retried ``retries`` times; a retried
``process_records`` starts with no rows (no row twice). A ``CheckpointError`` that
escapes the handler ends the action at once, without a retry (the checkpointer has
logged it), keeping what it emitted. ``checkpointer`` is called once an attempt for the checkpointer to hand
the handler (one per attempt, or the same one every time).

The timers an attempt creates (``mldserver.timers.pending``: kept in the attempt's
task, and its tasks') are written in one commit once it returned, before its outcome
(a checkpoint it asks for writes those so far first); a write that fails is a failed
attempt, retried as any failure is.

Each attempt runs in its own task, so nothing the handler does reaches the caller:

- past ``timeout`` the task is cancelled and given ``grace`` seconds to end; a handler
  that swallows the cancellation is abandoned (``handler_stuck``, with the callback),
  the call fails without a retry (the handler is still inside it) and the caller
  goes on to answer its action; ``reap_abandoned()`` ends such tasks at shutdown;
- a ``CancelledError`` coming out of the handler (a cancelled inner task) is a
  handler failure like any other; only the caller's own cancellation (or ``abort()``,
  the server shutting down) cancels the call;
- a callback that is not a coroutine function is a failure that is not retried, named
  in one line; ``handler_checks`` refuses such a handler at start-up, ``create()``
  any other handler at its creation.

What the handler counted in its calls (``batch.stats``: a ``ChangeHandler``'s
``on_update_success``, ...), failed attempts included, and each attempt that ran past
``timeout`` (``timeout_count``) add up in ``stats`` until the shard driver takes them
(``take_stats``) for the metrics.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from typing import Any, Callable, NamedTuple

from ..base.backoff import Backoff
from ..api.checkpointer import Checkpointer
from ..errors import CheckpointError
from ..api.failures import FailureGuard
from ..api.checks import not_async
from ..base.logs import EventLogger
from ..api.records import EmittedRows
from ..timers import pending as timer_ops
from ..timers.pending import Pending

GRACE_CAP = 1.0  # at most this long for a cancelled handler call to end

OK = "ok"
CHECKPOINT_FAILED = "checkpoint_failed"
FAILED = "failed"
SKIPPED = "skipped"  # not called: ``check`` found the batch unsound (``call``)


class Outcome(NamedTuple):
    result: str  # OK, CHECKPOINT_FAILED, FAILED or SKIPPED
    error: str | None = None
    rows: EmittedRows | None = None  # what process_records emitted, when collected
    # process_records: the records it gave up on (batch.fail), (index in the batch,
    # error, attempts), for the driver to dead-letter; the call itself is done
    failed: list[tuple[int, str, int]] | None = None
    # the failure killed its handler process or ran past execution_timeout: the calls that
    # bisect its batch run in a process of their own (``quarantine``), as its retries did
    isolate: bool = False
    # its last attempt ran past execution_timeout (a bisected part that did has spent the
    # bisect's budget by itself: ``bisect.py``)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Did the handler finish the action (a failed checkpoint ends it, done)?"""
        return self.result != FAILED


async def _awaited(started: Any) -> Any:
    return await started


def _invoke(handler: Any, action: str, arg: Any, cp: Checkpointer) -> Any:
    if action == "process_records":
        return handler.process_records(arg, FailureGuard(cp, arg))
    if action == "initialize":
        return handler.initialize(arg)
    if action == "lease_lost":
        return handler.lease_lost()
    return getattr(handler, action)(cp)  # shutdown_requested, shard_ended


# Handler calls that swallowed their cancellation, still running; ended at shutdown.
_abandoned: set[asyncio.Task[Any]] = set()


def _retrieve(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned call's end is not an error to report


async def reap_abandoned(grace: float = GRACE_CAP) -> int:
    """End the handler calls abandoned by ``handler_stuck``: cancel them, wait
    ``grace``, then close what still runs (its coroutine gets GeneratorExit). How many
    there were."""
    tasks = list(_abandoned)
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            try:
                task.get_coro().close()
            except RuntimeError:  # it ignored GeneratorExit too: nothing more can be done
                pass
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=grace)
    return len(tasks)


class Calls:
    """What both implementations of the seam share: the call policy
    (``backoff.CallPolicy``: ``retries`` after a failure, ``timeout`` per call,
    ``backoff`` between attempts), the callback under way (``running``, for
    ``slots_held`` and ``/status``), the handler process (``pid``) and ``abort``.
    ``HandlerCalls`` runs the handler in this loop; ``pool.ProcessCalls`` in a handler
    process."""

    # The handler reads a batch's records from the daemon's line (a handler process):
    # the server's protocol core leaves them unread (``protocol/lazy.py``).
    reads_line = False

    def __init__(self, context: Any, *, retries: int, timeout: float, backoff: Backoff, log: EventLogger) -> None:
        self.context = context
        self.retries = retries
        self.timeout = timeout
        self.backoff = backoff
        self.log = log
        self.running: str | None = None  # the callback being called, if any
        self._current: asyncio.Future[Any] | None = None  # the call under way (abort cancels it)
        self._aborted: str | None = None
        # Counts since the driver last took them (``take_stats``): attempts that ran past
        # execution_timeout (``timeout_count``), and what the handler counted in its
        # calls (a ChangeHandler's ``on_update_success``, ...), failed attempts included.
        self.stats: dict[str, int] = {}

    def count(self, stats: Any) -> None:
        if stats and type(stats) is dict:
            mine = self.stats
            for name, n in stats.items():
                if type(n) is int and type(name) is str:  # (what a handler put there: counts only)
                    mine[name] = mine.get(name, 0) + n

    def take_stats(self) -> dict[str, int]:
        stats, self.stats = self.stats, {}
        return stats

    @property
    def pid(self) -> int | None:
        """The handler process that holds the shard's instance (None: this loop)."""
        return None

    def abort(self, reason: str) -> None:
        """Cancel the call under way (its action is then answered as failed) and start
        no other: the server is stopping and will not wait for it."""
        self._aborted = reason
        if self._current is not None:
            self._current.cancel()


class HandlerCalls(Calls):
    def __init__(
        self,
        factory: Callable[[Any], Any],
        context: Any,
        *,
        retries: int,
        timeout: float,
        backoff: Backoff,
        log: EventLogger,
        grace: float | None = None,
    ) -> None:
        super().__init__(context, retries=retries, timeout=timeout, backoff=backoff, log=log)
        self.factory = factory
        self.grace = min(GRACE_CAP, max(timeout / 2, 0.05)) if grace is None else grace
        self.handler: Any = None
        self._failure: BaseException | None = None  # the last attempt's exception, for its traceback
        self._timed_out = False  # the last attempt ran past the time-out

    def create(self) -> str | None:
        """Make this shard's handler; why it failed, or None."""
        try:
            handler = self.factory(self.context)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.log.error("handler_create_failed", error=error, exc_info=True)
            return error
        error = not_async(handler)
        if error is not None:
            self.log.error("handler_create_failed", error=error)
            return error
        self.handler = handler
        return None

    def close(self) -> None:
        """The connection is over (nothing to release in this loop)."""

    async def call(
        self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer], *, collect_rows: bool = False,
        check: Callable[[], bool] | None = None, retries: int | None = None, quarantine: bool = False,
    ) -> Outcome:
        if self.handler is None:
            return Outcome(FAILED, "no handler (its creation failed)")
        if check is not None and not check():
            return Outcome(SKIPPED)
        attempts = (self.retries if retries is None else retries) + 1
        error = ""
        for attempt in range(attempts):
            if self._aborted is not None:
                return Outcome(FAILED, f"not called: {self._aborted}")
            if collect_rows:
                arg.rows = EmittedRows()  # a retried call starts over: no row twice
            if action == "process_records":
                arg.failed = arg.stats = None  # nor a failed record
            try:
                outcome, error, final = await self._attempt(action, arg, checkpointer)
                if action == "process_records":
                    self.count(arg.stats)
                if outcome is not None:
                    failed = arg.settle_failures() if action == "process_records" else None
                    return outcome._replace(rows=arg.rows if collect_rows else None, failed=failed or None)
            finally:
                if collect_rows:
                    arg.stop_collecting()  # the rows are in the outcome (or dropped)
            retry = not final and attempt + 1 < attempts
            self.log.error(
                "handler_failed",
                callback=action,
                error=error,
                attempt=attempt + 1,
                attempts=attempts,
                retry=retry,
                exc_info=self._failure if not retry else None,
            )
            if not retry:
                break
            await asyncio.sleep(self.backoff.delay(attempt))
        return Outcome(FAILED, error, timed_out=self._timed_out)

    async def _attempt(
        self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer]
    ) -> tuple[Outcome | None, str, bool]:
        """One call in its own task: (the outcome, or None and why it failed, and
        whether that failure is final: not worth a retry)."""
        self._failure, self._timed_out = None, False
        try:
            started = _invoke(self.handler, action, arg, checkpointer())
        except CheckpointError as exc:
            return Outcome(CHECKPOINT_FAILED, exc.error), "", True
        except Exception as exc:
            self._failure = exc
            return None, f"{type(exc).__name__}: {exc}", False
        if not inspect.isawaitable(started):
            owner = type(self.handler)
            return None, (f"{owner.__qualname__}.{action} is not async: it returned {type(started).__name__}, "
                          f"not an awaitable; define it with `async def {action}`"), True
        timers = getattr(self.context, "timers", None)
        call = Pending(timers.write) if timers is not None else None
        try:
            outcome, error, final = await self._run(action, started, call)
        finally:
            ops = call.close() if call is not None else []
        if outcome is None or call is None:
            return outcome, error, final
        try:  # the timers it created, durable before the action's status
            if call.failed is not None:
                raise call.failed  # a write for a checkpoint or a cancel failed, and the handler went on
            if ops:
                await call.send(ops)
        except Exception as exc:
            self._failure = exc
            return None, f"{type(exc).__name__}: {exc}", False
        return outcome, error, final

    async def _run(self, action: str, started: Any, call: Pending | None) -> tuple[Outcome | None, str, bool]:
        """Await the handler's coroutine in a task of its own, with ``call``'s timers."""
        context = contextvars.copy_context()
        context.run(timer_ops.current.set, call)
        coro = started if inspect.iscoroutine(started) else _awaited(started)
        task = asyncio.get_running_loop().create_task(coro, context=context)
        self._current, self.running = task, action
        try:
            done, _ = await asyncio.wait((task,), timeout=self.timeout)
            if not done:
                task.cancel()
                done, _ = await asyncio.wait((task,), timeout=self.grace)
                if not done:
                    _abandoned.add(task)
                    task.add_done_callback(_retrieve)
                    self.count({"timeout_count": 1})
                    self.log.error(
                        "handler_stuck",
                        callback=action,
                        timeout_s=self.timeout,
                        grace_s=self.grace,
                        what_to_do="the handler swallows asyncio.CancelledError: let it propagate (re-raise it); "
                        "the call is abandoned and the action answered as failed",
                    )
                    self._timed_out = True
                    return None, f"abandoned: still running {self.grace} s after its time-out cancelled it", True
                if not task.cancelled():
                    task.exception()  # retrieved: the time-out is what counts
                if self._aborted is not None:
                    return None, f"cancelled: {self._aborted}", True
                self.count({"timeout_count": 1})
                self._timed_out = True
                return None, f"timed out after {self.timeout} s (execution_timeout)", False
        except asyncio.CancelledError:  # our own cancellation: the call goes with it
            task.cancel()
            raise
        finally:
            self._current = self.running = None
        if task.cancelled():
            if self._aborted is not None:
                return None, f"cancelled: {self._aborted}", True
            return None, "CancelledError: raised by the handler (a cancelled task inside it?)", False
        exc = task.exception()
        if exc is None:
            return Outcome(OK), "", True
        if isinstance(exc, CheckpointError):  # the rows emitted before it stand: the batch is done
            return Outcome(CHECKPOINT_FAILED, exc.error), "", True
        self._failure = exc
        return None, f"{type(exc).__name__}: {exc}", False
