"""A handler process (``python -m mldserver.pool.child``), started and supervised by the
server (``process.py``). It imports the user's handler module once, keeps one handler
instance per shard, and runs each ``call`` frame (``frames.py``) as one attempt of one
action: the server owns the retries, the time-out and every protocol policy.

Inside, the handler API is the one it has in the server's loop: ``checkpointer.checkpoint``
and ``context.sql`` are proxies whose requests travel to the server and back (the
server's checkpointer does the retries and the clamp), ``batch.emit`` collects rows
that go back with the outcome, one columnar body per batch::

    {"op":"call","id":7,"shard":3,"action":"process_records",...} | records
    -> {"op":"checkpoint","id":7,"req":1,"sequence_number":"49..","sub_sequence_number":0}
    <- {"op":"reply","req":1,"error":null}
    -> {"op":"done","id":7,"result":"ok","rows":100,"bad":[]} | rows

Calls of different shards run concurrently (one task each); a shard's calls come one
at a time. What the server learns when this process dies without a word:

- which call was running: the call id is written to the state file (``<state>.run``,
  shared memory) around every step of a handler's coroutine, so a fault in C, an
  ``os._exit`` or a kill during a blocking call is blamed on its action, not on the
  other shards' actions waiting in ``await``;
- the stack: ``faulthandler`` writes every thread's stack to ``<state>.stack`` on
  SIGUSR1 (the server sends it when a call runs past ``execution_timeout``) and on a
  fatal signal.

A call past ``execution_timeout`` is stopped alone, so the other shards' calls in this
process go on: a ``cancel`` frame cancels it where it awaits (``CancelledError`` at its
``await``), and where it blocks the loop (``time.sleep``, a long loop in Python) the
server writes its id to the state file (STOP) and sends SIGUSR2, which raises
:class:`ExecutionTimeout` in its code. Either way it answers ``done`` with
``"stopped": true``; the server kills the process only if that does not come soon.

Timers (``mldserver.timers.remote``): the timers a call creates (``self.timers.create``)
are kept with it and cross with its checkpoint requests and its ``done`` frame, which
the server commits before it asks the daemon and before the action's status; a write
that fails makes the call's ``done`` a failure. A ``fire`` frame runs due timers'
callbacks, each tracked as a call of its own, and is answered by one ``done``.

A watchdog thread logs ``handler_blocked`` with the stack, once per episode, when the
loop has not turned for ``handler_block_warning`` seconds (``heartbeat.py``: the loop
beats every 50 ms while a call or a fire is in flight and for a second after, once a
second otherwise). The process dies with the server (PR_SET_PDEATHSIG) and ignores
SIGINT (a Ctrl-C is the server's to handle).
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import fcntl
import mmap
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from ..base.config import Settings
from ..api.context import Context
from ..errors import CheckpointError, ConfigError, ExecutionTimeout  # (ExecutionTimeout: named here too)
from ..api.failures import FailureGuard
from ..api.loading import load_handler
from ..base.logs import configure, get_logger
from .malloc import collect_less, one_heap, reuse_large_buffers
from ..shard.pieces import PieceReader
from ..api.records import Batch, EmittedRows, ShardInfo
from ..api.checks import check_handler, emits
from ..api import bindings as bindings_api
from ..api.bindings import Bindings
from ..timers import api as timers_api
from ..timers import pending as timer_ops
from ..timers import remote as timers_remote
from ..timers.api import TimerError
from .arena import ARENA_MIN, Arena, ArenaView
from .heartbeat import Heartbeat
from .frames import BEAT, BEAT_AT, BLOCKED, RUN, SKIPPED, STATE_SIZE, STOP, STOP_AT, CallFrame, StartFrame, encode, encode_head, encode_rows, line_of, read_frame_async, records_from

log = get_logger("mldserver.handler")


class Running:
    """The call whose coroutine is executing now, in shared memory for the server; and
    the call the server stops (SIGUSR2 raises ExecutionTimeout only in that call's code);
    when the loop last turned."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(fd, STATE_SIZE)
        os.close(fd)

    def set(self, call_id: int) -> None:
        RUN.pack_into(self.map, 0, call_id)

    def beat(self, period: float) -> None:
        """The loop turned, and turns again within ``period`` seconds: the server places no
        new shard on a loop that missed BLOCKED beats of it."""
        BEAT.pack_into(self.map, BEAT_AT, time.monotonic_ns() + int(BLOCKED * period * 1e9))

    def interrupt(self, signum: int, frame: Any) -> None:
        """SIGUSR2: the call the server stops, if its code is the one executing."""
        call_id = RUN.unpack_from(self.map, 0)[0]
        if call_id and call_id == STOP.unpack_from(self.map, STOP_AT)[0]:
            raise ExecutionTimeout(f"call {call_id} blocked its handler process past execution_timeout")


class Tracked:
    """Await ``coro`` with ``running`` naming ``call_id`` during each of its steps."""

    __slots__ = ("coro", "call_id", "running")

    def __init__(self, coro: Any, call_id: int, running: Running) -> None:
        self.coro, self.call_id, self.running = coro, call_id, running

    def __await__(self):
        coro, mark = self.coro, self.running.set
        send, exc = None, None
        while True:
            mark(self.call_id)
            try:
                step = coro.throw(exc) if exc is not None else coro.send(send)
            except StopIteration as stop:
                return stop.value
            finally:
                mark(0)
            try:
                send, exc = (yield step), None
            except BaseException as e:  # noqa: BLE001  (cancellation goes into the coroutine)
                send, exc = None, e


class _Skipped(Exception):
    """A held call the server's ``go`` frame says not to make."""


class Proxy:
    """The server's end of a call's requests: checkpoints and SQL cursors."""

    def __init__(self, child: "HandlerChild", call_id: int) -> None:
        self.child, self.call_id = child, call_id

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        return await self.child.request({"op": op, "id": self.call_id, **fields})


class ProxyCheckpointer:
    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy

    async def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int | None = None, *,
                         retry: bool = True) -> None:
        fields: dict[str, Any] = {"sequence_number": sequence_number, "sub_sequence_number": sub_sequence_number}
        if not retry:
            fields["retry"] = False  # one round trip: the caller retries (an amazon_kclpy processor)
        call = timer_ops.pending()
        ops = call.take() if call is not None else []
        if ops:  # committed by the server before it asks the daemon
            fields["timers"] = timers_remote.encode(ops)
        reply = await self._proxy.request("checkpoint", **fields)
        if reply.get("timer_error") is not None:
            exc = TimerError(reply["timer_error"], retriable=bool(reply.get("retriable")))
            if call is not None:
                call.failed = exc  # lost with the call: it fails, whatever the handler does with this
            raise exc
        if reply.get("error") is not None:
            raise CheckpointError(reply["error"], reply.get("sequence_number"), reply.get("sub_sequence_number"),
                                  reply.get("detail") or "")


class SparkProxy:
    """``context.sql`` from a handler process: the server's Spark process answers. A
    cursor belongs to the call that opened it: one the handler leaves before its end
    (``break`` out of the loop) is closed when the call ends, before its ``done`` frame
    (not whenever the generator is collected, when the server no longer answers the call)."""

    def __init__(self, child: "HandlerChild") -> None:
        self.child = child
        self.cursors = 0
        self.open: dict[int, list[Any]] = {}  # call id -> the cursors (async generators) it opened

    def sql(self, query: str, params: dict[str, Any]):
        call_id = self.child.current_call()
        rows = self._rows(query, params, call_id)
        if call_id:  # (0: outside any call, closed when collected)
            self.open.setdefault(call_id, []).append(rows)
        return rows

    async def close(self, call_id: int) -> None:
        """The call is over: the cursors it left open are closed (each a ``sql_close``)."""
        for rows in self.open.pop(call_id, ()):
            try:
                await rows.aclose()
            except Exception:  # noqa: BLE001  (still iterated by a task the call left running)
                pass

    async def _rows(self, query: str, params: dict[str, Any], call_id: int):
        self.cursors += 1
        cursor = self.cursors
        n = 64
        try:
            while True:
                reply = await self.child.request({"op": "sql_fetch", "id": call_id, "cursor": cursor,
                                                  "query": query, "params": params, "n": n})
                if reply.get("error"):
                    raise ConfigError(reply["error"]) if reply.get("config") else RuntimeError(reply["error"])
                n = min(8192, n * 2)
                for row in reply["rows"]:
                    yield row
                if reply["done"]:
                    break
        finally:
            await self.child.request({"op": "sql_close", "id": call_id, "cursor": cursor})


class HandlerChild:
    def __init__(self, start: StartFrame, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.settings = Settings(**start["settings"])
        self.state = start["state"]
        self.running = Running(self.state + ".run")
        arena = start.get("arena")
        self.arena = ArenaView(*arena) if arena else None  # where a call's line may be
        rows_arena = start.get("rows_arena")
        self.rows_arena = Arena(*rows_arena) if rows_arena else None  # where a batch's rows may go back
        if rows_arena:
            os.set_inheritable(rows_arena[0], False)  # not for the processes handler code starts
        self.factory = load_handler(start["handler"])  # (an amazon_kclpy processor class: wrapped)
        self.context = Context(self.settings)
        self.context.bindings = Bindings(self.settings)  # its own client, opened on first use
        from ..base.config import uses_spark

        if uses_spark(self.settings):
            self.context.spark = SparkProxy(self)  # type: ignore[assignment]
        self.context.timers = timers_remote.RemoteTimers(self.request, self.current_call,
                                                         self.settings.timer_context_size)
        self.emits = emits(type(check_handler(self.factory, self.context, start["handler"])))  # as the server does
        self.handlers: dict[int, Any] = {}
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.reqs = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.calls: dict[asyncio.Task[Any], int] = {}
        self.what: dict[int, dict[str, str]] = {}  # call id -> shard id and action, for the watchdog
        self.gates: dict[int, asyncio.Future[bool]] = {}  # held calls: does the server's ``go`` say call?
        self.heartbeat = Heartbeat(self.running.beat, self.what,
                                   self.rows_arena.trim if self.rows_arena is not None else None)

    def send_done(self, done: dict[str, Any], rows: list[Any]) -> None:
        """A call's ``done`` frame; its rows body, when large, in the rows arena (the
        frame names the region), else after the frame in the pipe (the arena is full,
        or the body small)."""
        if self.rows_arena is not None and sum(memoryview(part).nbytes for part in rows) >= ARENA_MIN:
            region = self.rows_arena.put(*rows)
            if region is not None:  # the server's until its free frame
                done, rows = {**done, "rows_arena": region}, []
        self.send(done, rows)

    def send(self, message: dict[str, Any], body: bytes | list[Any] = b"") -> None:
        """A frame; its body given whole or as its parts (buffers written one after
        another: a batch's rows are not joined into one)."""
        parts = body if isinstance(body, list) else [body]
        size = sum(memoryview(part).nbytes for part in parts)
        self.writer.write(encode_head(message, size))
        if size:
            self.writer.writelines(parts)

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.reqs += 1
        req = self.reqs
        future = asyncio.get_running_loop().create_future()
        self.pending[req] = future
        self.send({**message, "req": req})
        return await future

    def current_call(self) -> int:
        task = asyncio.current_task()
        return self.calls.get(task, 0)  # type: ignore[arg-type]

    def on_frame(self, message: dict[str, Any], body: bytes) -> bool:
        op = message["op"]
        if op == "call":
            if "arena" in message and self.arena is not None:
                body = self.arena.region(*message["arena"])  # read before this call's done frame only
            if message.get("held"):  # its go frame follows
                self.gates[message["id"]] = asyncio.get_running_loop().create_future()
            task = asyncio.get_running_loop().create_task(self.call(message, body))
            self.calls[task] = message["id"]
            self.what[message["id"]] = {"shard_id": message["info"][0], "action": message["action"]}
            self.tasks.add(task)
            task.add_done_callback(self._finished)
            self.heartbeat.woken()
        elif op == "fire":
            task = asyncio.get_running_loop().create_task(self.fire(message))
            self.calls[task] = message["id"]
            self.what[message["id"]] = {"timers": len(message["timers"])}  # type: ignore[dict-item]
            self.tasks.add(task)
            task.add_done_callback(self._finished)
            self.heartbeat.woken()
        elif op == "go":  # a held call: the server has read the batch's positions
            gate = self.gates.get(message["id"])
            if gate is not None and not gate.done():
                gate.set_result(bool(message["call"]))
        elif op == "reply":
            future = self.pending.pop(message["req"], None)
            if future is not None and not future.done():
                future.set_result(message)
        elif op == "cancel":  # past execution_timeout: this call alone, where it awaits
            for task, call_id in self.calls.items():
                if call_id == message["id"]:
                    task.cancel()
        elif op == "drop":
            self.handlers.pop(message["shard"], None)
        elif op == "free":  # the server is done with rows in the rows arena: these bytes, exactly
            if self.rows_arena is not None:
                self.rows_arena.release(*message["region"])
        elif op == "stop":
            return False
        return True

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        call_id = self.calls.pop(task, 0)
        self.what.pop(call_id, None)
        self.gates.pop(call_id, None)

    async def call(self, frame: CallFrame, body: bytes) -> None:
        call_id, action, shard = frame["id"], frame["action"], frame["shard"]
        info = ShardInfo(*frame["info"])
        batch = None
        error = tb = None
        result = "ok"
        stopped = False
        timers = timer_ops.Pending(self.context.timers.write)
        timer_ops.current.set(timers)  # this call's task's: its creates are its own, and its tasks'
        try:
            if action == "initialize":
                self.handlers[shard] = self.factory(self.context)
            handler = self.handlers.get(shard)
            if handler is None:
                raise RuntimeError(f"no handler for shard {info.shard_id} in this process")
            cp = ProxyCheckpointer(Proxy(self, call_id))
            if action == "process_records":
                collected = EmittedRows() if frame.get("collect") else None
                if frame.get("line") and getattr(handler, "parses_line", False):
                    # (an amazon_kclpy processor: its records read from the line when its thread gets to it)
                    batch = Batch([], frame.get("millis_behind_latest"), info, collected)
                    batch.line = body  # type: ignore[assignment]  (valid until this call's done frame)
                else:
                    batch = Batch(records_from(body, bool(frame.get("line")), frame.get("records")),
                                  frame.get("millis_behind_latest"),
                                  info, collected)
                if call_id in self.gates and not await self.gates[call_id]:
                    raise _Skipped()  # a record without a position: the server decodes the batch again
                coro = handler.process_records(batch, FailureGuard(cp, batch))
            elif action == "initialize":
                coro = handler.initialize(info)
            elif action == "lease_lost":
                coro = handler.lease_lost()
            else:
                coro = getattr(handler, action)(cp)
            await Tracked(coro, call_id, self.running)
        except _Skipped:
            result = SKIPPED
        except CheckpointError as exc:
            result, error = "checkpoint_failed", exc.error
        except (Exception, asyncio.CancelledError, ExecutionTimeout) as exc:
            result, error, tb = "failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()
            stopped = not isinstance(exc, Exception)  # the server's cancel frame or SIGUSR2
            if stopped:
                self.running.set(0)  # (SIGUSR2 may land before Tracked clears it)
            if action == "initialize":
                self.handlers.pop(shard, None)
        await self.close_cursors(call_id)  # answered while the call is on
        ops = timers.close()
        if timers.failed is not None and result != "failed":
            result, error = "failed", f"{type(timers.failed).__name__}: {timers.failed}"
        n, rows, bad = 0, [], []
        failed = batch.settle_failures() if batch is not None and result != "failed" else None
        if batch is not None and batch.rows and result not in ("failed", SKIPPED):
            # (records the server re-encoded, not its line: their arrival times are read here)
            n, rows, bad = encode_rows(batch.rows, batch.records, read_arrivals=not frame.get("line"))
        if batch is not None:
            batch.stop_collecting()  # as in the server's loop (shard.calls)
        done = {"op": "done", "id": call_id, "result": result, "error": error, "traceback": tb, "rows": n, "bad": bad}
        if ops and result != "failed":
            done["timers"] = timers_remote.encode(ops)  # committed by the server before the status
        if stopped:
            done["stopped"] = True
        if failed:
            done["failed"] = failed  # [index, error, attempts]: the server dead-letters them
        if batch is not None and batch.stats:
            done["stats"] = batch.stats  # a failed attempt's too: every callback counts
        line = line_of(batch.records) if batch is not None else None
        batch = collected = coro = None  # (the records go with them, unless the handler kept one)
        if line is not None:
            line.close()  # the body (the arena's region) is the server's again at done
        self.send_done(done, rows)

    async def close_cursors(self, call_id: int) -> None:
        """The ``context.sql`` cursors a call left open, closed before its ``done``."""
        if isinstance(self.context.spark, SparkProxy):
            await self.context.spark.close(call_id)

    async def fire(self, frame: dict[str, Any]) -> None:
        """Due timers' callbacks, each tracked under its own id (the server blames the
        one that blocks); one ``done`` frame with every result."""
        async def track(coro: Any, call_id: int) -> Any:
            return await Tracked(coro, call_id, self.running)

        try:
            done = await timers_remote.fire(frame, track=track, timers=self.context.timers,
                                            timeout=self.settings.execution_timeout, log=log)
        except Exception as exc:  # a bug here, not in a callback: each timer is retried
            failed = [f"{type(exc).__name__}: {exc}", traceback.format_exc()]
            done = {"op": "done", "id": frame["id"], "result": "ok", "fired": [failed] * len(frame["timers"])}
        await self.close_cursors(self.current_call())
        self.send(done)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    first = await read_frame_async(reader)
    if first is None:
        return
    start: StartFrame = first[0]  # type: ignore[assignment]
    s = start["settings"]
    configure(s["log_format"], s["log_level"], s["log_file"])
    for p in reversed(start["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        child = HandlerChild(start, writer)
    except ConfigError as exc:
        writer.write(encode({"op": "import_failed", "error": str(exc)}))
        await writer.drain()
        return
    timers_api.current.set(child.context.timers)  # timers.create in callbacks (tasks copy it)
    bindings_api.current.set(child.context.bindings)  # bindings.table in timer callbacks
    collect_less()  # as the server does (cli.tune)
    if getattr(child.factory, "takes_turns", False):  # (an amazon_kclpy processor: a thread per shard)
        one_heap()  # before the first thread: the trimmer's, the watchdog's, the shards'
    reuse_large_buffers()
    stack = open(start["state"] + ".stack", "w")
    faulthandler.enable(stack, all_threads=True)
    faulthandler.register(signal.SIGUSR1, stack, all_threads=True)
    signal.signal(signal.SIGUSR2, child.running.interrupt)
    threading.Thread(target=child.heartbeat.watch,
                     args=(float(s.get("handler_block_warning", 1.0)), threading.get_ident(), log),
                     daemon=True, name="watchdog").start()
    beat = asyncio.get_running_loop().create_task(child.heartbeat.run())
    child.send({"op": "ready", "pid": os.getpid(), "emits": child.emits})
    while True:
        frame = await read_frame_async(reader)
        if frame is None or not child.on_frame(*frame):
            break
    beat.cancel()
    for task in list(child.tasks):
        task.cancel()
    try:
        await child.context.close()  # the bindings' client
    except Exception as exc:  # closing a client must not keep this process from ending
        log.warning("bindings_close_failed", error=repr(exc))
    await writer.drain()


# Both pipes to the server hold this much (Linux's default maximum) instead of 64 KiB:
# a batch's line, or its rows, cross in a few writes, not one per 64 KiB.
PIPE_SIZE = 1 << 20


def _widen_pipes() -> None:
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
        except OSError:
            pass  # not a pipe, not Linux, or over /proc/sys/fs/pipe-max-size: the default works


async def _main() -> None:
    _widen_pipes()
    loop = asyncio.get_running_loop()
    reader = PieceReader(limit=1 << 24)  # a frame's body read in the pieces the pipe gave
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(0), "rb"))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(os.dup(1), "wb"))
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # a handler's print goes to the server's stderr, never into the frames
    sys.stdout = sys.stderr
    await serve(reader, writer)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the server
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        sys.exit(0)  # the server is already gone
    try:
        import uvloop

        uvloop.run(_main())
    except ImportError:
        asyncio.run(_main())


if __name__ == "__main__":
    main()
