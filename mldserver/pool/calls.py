"""``ProcessCalls``: the shard/calls.py seam (``create()``, ``call(...) -> Outcome``),
with the handler in a handler process of the pool. The shard driver cannot tell the
two apart; what changes is what a failure can be::

    calls = ProcessCalls(pool, context, **CallPolicy.from_settings(settings)._asdict(), log=log)
    outcome = await calls.call("process_records", batch, checkpointer, collect_rows=True)

- the handler raised: ``handler_failed`` (with the child's traceback), retried with
  backoff, then ``Outcome(FAILED)`` (the driver dead-letters the batch);
- the call ran past ``execution_timeout``: the process's stack is logged
  (``handler_timed_out``) and the call stopped alone (``HandlerProcess.interrupt``:
  cancelled where it awaits, interrupted where it blocks the loop), so the other
  shards' calls in that process go on; only a call that is not stopped within
  ``STOP_GRACE`` seconds has its process killed (the pool replaces it). That counts as
  a failed attempt;
- the process died while the call was running (a fault in C, ``os._exit``, a kill
  during a blocking call): a failed attempt;
- after either, the call is retried in quarantine: a process spawned for it alone
  (``HandlerPool.quarantine``), so a poisoned batch never kills a process that serves
  other shards twice; the shard goes back to the pool's processes after that action;
- a call of another shard that was only waiting in that process is redone at once in a
  live process, without counting (``handler_redone``), up to ``UNBLAMED_CALL_REDOS`` times;
- the timers the call created (``mldserver.timers.pending``) come with its checkpoint
  requests and its ``done`` frame, and are committed before the daemon is asked and
  before the outcome is returned (so before the action's status); a commit that fails
  is a failed attempt, redone with its timers;
- anything else that goes wrong on our side of the call (a bug of ours) is logged
  ``action_failed_internally`` with its traceback and counts as a failed attempt: the
  driver answers the action whatever happens here;
- before the first call in a new process (after a death, a memory replacement or a
  reload), the shard gets a fresh handler instance there: ``initialize`` again with
  the shard's current position (``shard_moved``); ``pid`` (``/status``'s
  ``handler_process``) follows the shard from process to process.

Each attempt ends in one kind (``_Kind``: done, failed, timed out, died blamed or
unblamed, no process, internal error), and one table (``_NEXT``) says what follows
each: counted (``handler_failed``, retried after backoff, then given up) or redone at
once (``handler_redone``), and whether the attempts after it run in quarantine::

    _NEXT[_Kind.TIMED_OUT] == _Next(counts=True, isolate=True)
    _NEXT[_Kind.DIED_UNBLAMED] == _Next(counts=False, isolate=False)

One call is one ``call`` frame and one ``done`` frame; the rows come back columnar
(``decode_rows``) and are handed to the driver as the coordinator's columns
(``batches.EncodedRows``, a ``RowBatch``): each row the child's JSON line, read in
place, never decoded, encoded or copied one by one in the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from typing import Any, AsyncIterator, Callable, NamedTuple

from ..base.backoff import Backoff
from ..api.checkpointer import Checkpointer
from ..api.context import Context
from ..errors import CheckpointError, ConfigError
from ..base.logs import EventLogger
from ..api.records import Batch, ShardInfo
from ..shard.batches import BAD_ROW, BadRecords, EncodedRows, encoded_rows
from ..shard.calls import FAILED, SKIPPED, Calls, Outcome
from ..timers import remote as timers_remote
from ..timers.api import TimerError
from .frames import decode_rows, encode_records
from .pool import HandlerPool
from .process import START_TIMEOUT, HandlerImportFailed, HandlerProcess, ProcessDied

# A call redone because its process died while another call was running (or while no
# call ran: a kill from outside), at most this often before the deaths count against it too.
UNBLAMED_CALL_REDOS = 3
# Seconds a call past execution_timeout has to end once it is cancelled or interrupted,
# before its process is killed.
STOP_GRACE = 1.0

_keys = itertools.count(1)


# How a call past execution_timeout was stopped (handler_timed_out's ``stopped``).
CANCELLED, INTERRUPTED, KILLED = "cancelled", "interrupted", "killed"


class _InitializeFailed(Exception):
    pass


class _NoProcess(Exception):
    """No handler process could take the shard (every start failed for a while)."""


class _TimedOut(Exception):
    """The call ran past ``execution_timeout`` and was stopped (``how``: cancelled,
    interrupted or killed with its process); ``stack``: where it was."""

    def __init__(self, how: str, stack: str) -> None:
        super().__init__(how)
        self.how, self.stack = how, stack


class _Kind(enum.Enum):
    """How one attempt of an action ended."""

    DONE = "done"  # the handler answered (or skipped): the outcome is returned
    FAILED = "failed"  # the handler raised, or the timers it created were not committed
    TIMED_OUT = "timed out"  # it ran past execution_timeout and was stopped
    DIED_BLAMED = "died blamed"  # its process died while it ran (or, unblamed, once too often)
    DIED_UNBLAMED = "died unblamed"  # its process died while another call ran, or none did
    NO_PROCESS = "no process"  # no process could take the shard, or initialize failed in it
    INTERNAL = "internal error"  # a bug of ours (action_failed_internally)


class _Next(NamedTuple):
    """What follows an attempt that did not end the action."""

    counts: bool  # a failed attempt (handler_failed, then a retry after backoff), else redone at once (handler_redone)
    isolate: bool  # the attempts after it run in a process of the shard's own (HandlerPool.quarantine)


_NEXT = {
    _Kind.FAILED: _Next(counts=True, isolate=False),
    _Kind.TIMED_OUT: _Next(counts=True, isolate=True),
    _Kind.DIED_BLAMED: _Next(counts=True, isolate=True),
    _Kind.DIED_UNBLAMED: _Next(counts=False, isolate=False),
    _Kind.NO_PROCESS: _Next(counts=True, isolate=False),
    _Kind.INTERNAL: _Next(counts=True, isolate=False),
}


class _Attempt(NamedTuple):
    """One attempt's end: its kind, and the outcome (DONE) or why it failed."""

    kind: _Kind
    error: str = ""
    traceback: str | None = None  # the handler's, when it raised
    outcome: Outcome | None = None


class ProcessCalls(Calls):
    reads_line = True

    def __init__(
        self,
        pool: HandlerPool,
        context: Context,
        *,
        retries: int,
        timeout: float,
        backoff: Backoff,
        log: EventLogger,
    ) -> None:
        super().__init__(context, retries=retries, timeout=timeout, backoff=backoff, log=log)
        self.pool = pool
        self.key = next(_keys)
        self.proc: HandlerProcess | None = None
        self.shard: ShardInfo | None = None
        # context.sql cursors open in handler processes, by (pid, call id, cursor): a
        # process numbers its own, so the shard moving to another must not find them
        self._cursors: dict[tuple[int, int, int], AsyncIterator[dict[str, Any]]] = {}
        self._quarantine = False  # the next attempt runs in a process of its own
        self._moved = False  # placed in a new process: a fresh instance is initialized before the next call
        self._moved_from: int | None = None
        self._acting_in: HandlerProcess | None = None  # where the action under way is (``_acting``)
        self._stored: Any = None  # the position the daemon stored last (a Position)
        self._answering: set[asyncio.Task[Any]] = set()  # the handler's requests being answered

    def create(self) -> str | None:
        """The instance is made in the handler process, with ``initialize``."""
        return None

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return None if proc is None else proc.pid

    def close(self) -> None:
        """The connection is over: the process forgets the shard's instance; a cursor
        left open (its process died in the call) is closed."""
        if self.proc is not None:
            self.pool.release(self.proc, self.key)
            self.proc = None
        cursors, self._cursors = list(self._cursors.values()), {}
        for cursor in cursors:
            closing = asyncio.ensure_future(cursor.aclose())  # type: ignore[attr-defined]
            closing.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def call(
        self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer], *, collect_rows: bool = False,
        check: Callable[[], bool] | None = None, retries: int | None = None, quarantine: bool = False,
    ) -> Outcome:
        if action == "initialize":
            self.shard = arg
        if self.shard is None:
            return Outcome(FAILED, "no shard: initialize came first and failed")
        self.running = action
        try:
            self._quarantine = quarantine  # (a bisected batch whose calls killed their process)
            return await self._call(action, arg, checkpointer, collect_rows, check,
                                    self.retries if retries is None else retries)
        finally:
            self.running = None

    async def _call(self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer],
                    collect_rows: bool, check: Callable[[], bool] | None, retries: int) -> Outcome:
        attempts = retries + 1
        attempt = redone = 0  # attempts counted; attempts redone uncounted (_Kind.DIED_UNBLAMED)
        error = ""
        timed_out = False  # the last attempt ran past the time-out
        checked: list[bool] = []  # check's answer, once it ran (the call is held until then)

        def run_check() -> bool:
            assert check is not None
            try:
                checked.append(check())
            except Exception as exc:  # a bug of ours: not called; the driver reads the batch again
                self.log.error("action_failed_internally", callback=action, step="check",
                               error=f"{type(exc).__name__}: {exc}", exc_info=True)
                checked.append(False)
            return checked[0]

        try:
            while attempt < attempts:
                if self._aborted is not None:
                    return Outcome(FAILED, f"not called: {self._aborted}")
                if checked and not checked[0]:
                    return Outcome(SKIPPED)  # (the attempt that was told so ended otherwise: redone, it is not called)
                held = check is not None and not checked
                tried = await self._attempt(action, arg, checkpointer, collect_rows, run_check if held else None,
                                            may_redo=redone < UNBLAMED_CALL_REDOS)
                if tried.outcome is not None:
                    return tried.outcome
                then = _NEXT[tried.kind]
                if then.isolate:
                    self._quarantine = True
                await self._settled()
                if not then.counts:
                    redone += 1
                    self.log.warning("handler_redone", callback=action, error=tried.error)
                    continue
                error, timed_out = tried.error, tried.kind is _Kind.TIMED_OUT
                attempt += 1
                retry = attempt < attempts
                self.log.error("handler_failed", callback=action, error=error, attempt=attempt, attempts=attempts,
                               retry=retry, traceback=tried.traceback)
                if retry:
                    await asyncio.sleep(self.backoff.delay(attempt - 1))
            return Outcome(FAILED, error, isolate=self._quarantine, timed_out=timed_out)
        finally:
            self._acting(None)
            self._quarantine = False
            if self.proc is not None and self.pool.isolates(self.proc):
                self._leave()  # the action is over: the shard goes back to the pool's processes

    async def _attempt(self, action: str, arg: Any, checkpointer: Callable[[], Checkpointer], collect_rows: bool,
                       check: Callable[[], bool] | None, may_redo: bool) -> _Attempt:
        """One attempt of the action, and what kind of end it had (``_NEXT`` says what
        follows each). ``check``: the call is held until it answers (``frame["held"]``).
        What is particular to a kind happens here: a time-out counted and logged, the
        shard off a process that died or was killed, a bug of ours logged."""
        proc = None
        try:
            proc = await self._placed()
            self._acting(proc)
            if self._moved and action != "initialize":
                await self._initialize_here(proc)
            cp = checkpointer()
            frame, body = self._frame(action, arg, collect_rows)
            if check is not None:
                frame["held"] = True
            message, rows = await self._wait(proc, frame, body, cp, action, check)
        except _TimedOut as exc:
            self.count({"timeout_count": 1})
            self._timed_out(proc, action, exc)
            if exc.how == KILLED:
                await self._dead(proc)
            return _Attempt(_Kind.TIMED_OUT, f"timed out after {self.timeout} s (execution_timeout): {exc.how}")
        except ProcessDied as exc:
            self._leave()
            return _Attempt(_Kind.DIED_UNBLAMED if not exc.blamed and may_redo else _Kind.DIED_BLAMED, str(exc))
        except (_InitializeFailed, _NoProcess) as exc:
            return _Attempt(_Kind.NO_PROCESS, str(exc))
        except Exception as exc:  # a bug of ours: one failed attempt, never a closed connection
            error = f"internal error: {type(exc).__name__}: {exc}"
            self.log.error("action_failed_internally", callback=action, error=error, exc_info=True)
            self._leave()
            return _Attempt(_Kind.INTERNAL, error)
        if message["result"] == SKIPPED:
            return _Attempt(_Kind.DONE, outcome=Outcome(SKIPPED))
        self.count(message.get("stats"))
        if message["result"] == FAILED:
            return _Attempt(_Kind.FAILED, message["error"], message.get("traceback"))
        if action == "initialize":
            self._moved = False  # the instance is made
        lost = await self._write_timers(message.get("timers"))
        if lost is not None:
            return _Attempt(_Kind.FAILED, f"TimerError: {lost}")
        return _Attempt(_Kind.DONE, outcome=Outcome(message["result"], message["error"],
                                                    self._rows(arg, message, rows) if collect_rows else None,
                                                    message.get("failed") or None))

    def _timed_out(self, proc: HandlerProcess | None, action: str, exc: _TimedOut) -> None:
        self.log.error("handler_timed_out", callback=action, pid=proc.pid if proc else None, timeout_s=self.timeout,
                       stopped=exc.how, stack=exc.stack,
                       what_to_do="the stack shows where it was; the action is retried in a process of its own"
                                  + ("" if exc.how != KILLED else "; its process did not stop it and was replaced"))

    async def _dead(self, proc: HandlerProcess | None) -> None:
        """Off a process we killed, once its death is noticed (logged with this shard
        among its shards)."""
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await proc.life.died.wait()
        self._leave()

    async def _stop(self, proc: HandlerProcess, call: asyncio.Future[tuple[dict[str, Any], bytes]],
                    frame: dict[str, Any], action: str) -> tuple[dict[str, Any], bytes]:
        """The call ran past ``execution_timeout``: its stack taken, then it is stopped
        alone (cancelled, or interrupted where it blocks the loop); its process is killed
        only if it has not ended ``STOP_GRACE`` seconds later, its stack taken again first
        (where it would not stop). _TimedOut, or the call's answer if it ended well after all."""
        assert self.shard is not None
        blocking = proc.running() == frame["id"]
        stack = await proc.stack() if blocking else ""  # (an awaiting call's is in its traceback)
        proc.interrupt(frame["id"])
        done, _ = await asyncio.wait({call}, timeout=STOP_GRACE)
        if done and call.exception() is None:
            message, body = call.result()
            if not message.get("stopped"):
                return message, body  # it ended before the stop reached it
            raise _TimedOut(INTERRUPTED if blocking else CANCELLED, message.get("traceback") or stack)
        if proc.alive:
            # Its stack again, where it would not stop: the one taken at its time-out may
            # show it short of where it blocks (a starved process reaches it late).
            stack = await proc.kill_for(frame["id"], (self.shard.shard_id, action)) or stack
        raise _TimedOut(KILLED, stack)

    async def _settled(self) -> None:
        """Before an action is redone: the requests of the attempt that failed are
        answered (a checkpoint round trip with the daemon is never cut in two)."""
        while self._answering:
            await asyncio.gather(*list(self._answering), return_exceptions=True)

    async def _wait(self, proc: HandlerProcess, frame: dict[str, Any], body: bytes, cp: Checkpointer | None,
                    action: str, check: Callable[[], bool] | None = None) -> tuple[dict[str, Any], bytes]:
        """The call's ``done``, or _TimedOut after ``execution_timeout`` of its own:
        time during which another shard's call held the process's loop (blocking it)
        does not count; that call's own time-out stops it. Nor does the time its process
        takes to die once it is no longer alive (ProcessDied then)."""
        assert self.shard is not None
        requests = self._requests(cp, proc.pid or 0)
        call = asyncio.ensure_future(proc.call(frame, body, requests, (self.shard.shard_id, action), check))
        self._current = call
        try:
            while True:
                await asyncio.wait({call}, timeout=self.timeout)
                if call.done():
                    if call.cancelled() and self._aborted is not None:
                        return {"result": FAILED, "error": f"cancelled: {self._aborted}", "traceback": None}, b""
                    return call.result()
                if not proc.alive:
                    # Being killed (another call's time-out, or its stdin failed): there is
                    # nothing to stop; its death, once noticed, ends the call with ProcessDied,
                    # blamed only on the call that was running (a bystander's is redone).
                    continue
                if proc.running() not in (0, frame["id"]):
                    continue  # a bystander: another call blocks the loop
                return await self._stop(proc, call, frame, action)
        finally:
            self._current = None
            if not call.done():
                call.cancel()
            # Its error's traceback holds this frame: a reference to the call left in it
            # would make a cycle (``HandlerProcess.call``).
            del call

    # -- where the shard's instance lives -------------------------------------------

    async def _placed(self) -> HandlerProcess:
        """The shard's live process; a new one (``_moved``) if it had none, or its
        process died, was killed or retires; a process of its own when the last attempt
        killed its process or ran too long (``_quarantine``)."""
        proc = self.proc
        if proc is not None and self.pool.fits(proc, self._quarantine):
            return proc
        assert self.shard is not None
        if proc is not None:
            self._leave()
        wait = max(self.timeout, START_TIMEOUT)
        try:  # waiting for a process to start is not the handler's time
            async with asyncio.timeout(wait):
                if self._quarantine:
                    proc = await self.pool.quarantine(self.key, self.shard.shard_id)
                else:
                    proc = await self.pool.assign(self.key, self.shard.shard_id)
        except TimeoutError:
            raise _NoProcess(f"no handler process started within {wait} s") from None
        except HandlerImportFailed as exc:
            raise _NoProcess(f"no handler process for it: {exc}") from None
        self.proc = proc
        self._moved = True
        return proc

    async def _initialize_here(self, proc: HandlerProcess) -> None:
        """A fresh handler instance for the shard in its new process: ``initialize``
        with the shard's current position (under ``execution_timeout``, as any call)."""
        assert self.shard is not None
        info = self._position()
        self.log.info("shard_moved", pid=proc.pid, from_pid=self._moved_from, sequence_number=info.sequence_number,
                      sub_sequence_number=info.sub_sequence_number)
        message, _ = await self._wait(proc, self._frame("initialize", info, False)[0], b"", None, "initialize")
        error = message["error"]
        if message["result"] != FAILED and (lost := await self._write_timers(message.get("timers"))) is not None:
            message, error = {"result": FAILED}, f"TimerError: {lost}"
        if message["result"] == FAILED:
            self.proc = None
            self.pool.release(proc, self.key)
            raise _InitializeFailed(f"initialize in a new handler process failed: {error}")
        self._moved = False

    def _acting(self, proc: HandlerProcess | None) -> None:
        """The shard's action is under way in ``proc`` (None: over): a retiring
        process is stopped only once none is (``HandlerPool``), and its idle shards
        move at their next action."""
        if self._acting_in is not None:
            self._acting_in.life.acting.discard(self)
        self._acting_in = proc
        if proc is not None:
            proc.life.acting.add(self)

    def _leave(self) -> None:
        """Off the shard's process (dead, killed, retiring or its quarantine over): the
        next call gets a fresh instance elsewhere."""
        if self.proc is not None:
            self._moved_from = self.proc.pid
            self.pool.release(self.proc, self.key)
            self.proc = None

    def _position(self) -> ShardInfo:
        """The shard as a new instance sees it: the checkpoint stored since, if any."""
        assert self.shard is not None
        stored = self._stored
        if stored is None:
            return self.shard
        return ShardInfo(self.shard.shard_id, stored.text, stored.sub)

    def _frame(self, action: str, arg: Any, collect: bool) -> tuple[dict[str, Any], bytes]:
        assert self.shard is not None
        s = self.shard
        frame: dict[str, Any] = {"op": "call", "id": next(self.pool.call_ids), "shard": self.key, "action": action,
                                 "info": (s.shard_id, s.sequence_number, s.sub_sequence_number)}
        body = b""
        if action == "initialize":
            frame["info"] = (arg.shard_id, arg.sequence_number, arg.sub_sequence_number)
        elif action == "process_records":
            batch: Batch = arg
            frame["millis_behind_latest"] = batch.millis_behind_latest
            frame["collect"] = collect
            frame["line"] = batch.line is not None
            if batch.line is not None:
                frame["records"] = len(batch.records)  # (the handler process need not count them)
            body = batch.line if batch.line is not None else encode_records(batch.records)
        return frame, body

    def _rows(self, batch: Batch, message: dict[str, Any], body: bytes) -> EncodedRows:
        """The coordinator's columns straight from the columnar body, read in place:
        each row stays the child's JSON line and keeps the event time the handler gave
        it, else takes its record's arrival time (read with the positions, filled in
        here: ``encoded_rows``); its record gives its position."""
        records = batch.records
        bad = [BadRecords([records[i].to_json()], BAD_ROW, error) for i, error in message["bad"]]
        rows, unfit = encoded_rows(records, *decode_rows(message["rows"], body))
        return EncodedRows(rows, bad + unfit)

    # -- what the handler asks during a call ---------------------------------------------

    def _requests(self, cp: Checkpointer | None, pid: int):
        async def answer(message: dict[str, Any]) -> dict[str, Any]:
            task = asyncio.current_task()
            assert task is not None
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
            op = message["op"]
            if op == "checkpoint":
                return await self._checkpoint(cp, message)
            if op == "sql_fetch":
                return await self._sql_fetch(message, (pid, message["id"], message["cursor"]))
            if op == "sql_close":
                cursor = self._cursors.pop((pid, message["id"], message["cursor"]), None)
                if cursor is not None:
                    await cursor.aclose()  # type: ignore[attr-defined]
                return {}
            return {"error": f"unknown request {op!r}"}

        return answer

    async def _write_timers(self, items: Any) -> TimerError | None:
        """The call's timers (its ``done`` frame's or its checkpoint's) committed; why
        not, or None. Not committed, they fail the call: it is redone and creates them
        again."""
        if not items:
            return None
        timers = self.context.timers
        try:
            await timers.write(timers_remote.decode(items, timers.context_size))
        except TimerError as exc:
            return exc
        return None

    async def _checkpoint(self, cp: Checkpointer | None, message: dict[str, Any]) -> dict[str, Any]:
        lost = await self._write_timers(message.get("timers"))  # before the daemon stores the position
        if lost is not None:
            return {"timer_error": str(lost), "retriable": lost.retriable}
        if cp is None:
            return {"error": "InvalidStateException", "detail": "no checkpointer here"}
        try:
            await cp.checkpoint(message.get("sequence_number"), message.get("sub_sequence_number"),
                                retry=message.get("retry", True) is not False)
        except CheckpointError as exc:
            return {"error": exc.error, "sequence_number": exc.sequence_number,
                    "sub_sequence_number": exc.sub_sequence_number}
        if cp.stored is not None:  # what the daemon stored: where a fresh instance starts
            self._stored = cp.stored
        return {"error": None}

    async def _sql_fetch(self, message: dict[str, Any], key: tuple[int, int, int]) -> dict[str, Any]:
        cursor = self._cursors.get(key)
        try:
            if cursor is None:
                cursor = self._cursors[key] = await self.context.sql(message["query"], **message["params"])
            rows = []
            done = False
            for _ in range(message["n"]):
                try:
                    rows.append(await anext(cursor))
                except StopAsyncIteration:
                    done = True
                    break
            return {"rows": rows, "done": done}
        except ConfigError as exc:
            return {"error": str(exc), "config": True}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
