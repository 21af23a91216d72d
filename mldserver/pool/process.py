"""The server's side of one handler process (``child.py``): spawn it, send it calls,
answer its requests, notice its death. All asyncio; the loop only waits on pipes::

    proc = HandlerProcess(settings, log=log, on_death=pool_died, services=services)
    await proc.start()                                   # imported and ready, or HandlerImportFailed
    message, body = await proc.call(frame, records, requests, ("shardId-0", "process_records"))
    await proc.stack()                                   # every thread's stack (SIGUSR1, faulthandler)
    proc.kill(); await proc.stop()

``requests`` answers what the handler asks during the call (``checkpoint``,
``sql_fetch``, ``sql_close``): the call's owner (``calls.ProcessCalls``) is the only
one that knows the shard's checkpointer. What the server answers whichever call asks
(``timer_write``, ``timer_refused``: ``mldserver.timers``) is in ``services``, by op.
When the process dies, every call in flight fails with :class:`ProcessDied`, which
says how (exit code or signal) and whether that call was the one running
(``blamed``: its id was in the shared state file), and ``on_death`` is told first.

This class is the process boundary, and :class:`ProcessDied` is the only shape a
failure takes when it crosses it. Whatever goes wrong writing to, reading from or
waiting on the process (a closed pipe, a transport the loop closed before the death was
noticed (uvloop does, the stock loop drops the write), a frame that cannot be read) is
``ProcessDied`` for the calls it affects; ``drop`` and ``stop`` of a dead process do
nothing. ``alive`` is false from the moment its stdin closes, so nobody places a shard
on a process that is dying. What crosses in shared memory is its ``channel``
(``channel.py``); what is known of its life and whom its death is blamed on, its
``life`` (``liveness.py``). What the pool has it do (its shards, quarantine,
retiring) is the pool's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..base.config import Settings, state_path
from ..base.logs import EventLogger
from ..shard.pieces import PieceReader
from ..errors import MldserverError
from .arena import rows_arena_bytes
from .channel import Channel
from .frames import StartFrame, encode, encode_head, read_frame_async
from .liveness import Liveness

PIPE_LIMIT = 1 << 24
START_TIMEOUT = 60.0
Requests = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class HandlerImportFailed(MldserverError):
    """The handler module did not import in a new handler process (the importer's message)."""


class ProcessDied(MldserverError):
    retriable = True

    def __init__(self, how: str, blamed: bool) -> None:
        super().__init__(f"the handler process died ({how})")
        self.how = how
        self.blamed = blamed  # this call was the one running when it died


def describe_exit(code: int | None) -> dict[str, Any]:
    if code is not None and code < 0:
        return {"signal": signal.Signals(-code).name}
    return {"exit_code": code}


def clear_stale(directory: Path) -> int:
    """Remove the state files (``process-<server pid>-<n>.run``/``.stack``) of handler
    processes whose server is no longer running (a server killed before it cleaned up);
    how many went. A running server's files (another server's state dir shared by
    mistake, or this one's) are left."""
    removed = 0
    for path in directory.glob("process-*-*.*"):
        server = path.name.split("-")[1]
        if not server.isdigit() or int(server) == os.getpid() or _running(int(server)):
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HandlerProcess:
    ids = itertools.count(1)

    def __init__(self, settings: Settings, *, log: EventLogger, generation: int = 1,
                 on_death: Callable[["HandlerProcess"], None] | None = None,
                 services: dict[str, Requests] | None = None) -> None:
        self.settings = settings
        self.number = next(self.ids)
        self.generation = generation
        self.log = log
        self.on_death = on_death  # told of its death, before its calls fail
        self.services = {} if services is None else services  # requests answered by the server, not a call's owner
        directory = state_path(settings, "handlers").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        self.life = Liveness(str(directory / f"process-{os.getpid()}-{self.number}"))
        self.channel = Channel(self._tell)
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task[None] | None = None  # its reader
        self.emits = False  # the handler's code calls emit (its ready frame says)
        self._calls: dict[int, tuple[asyncio.Future[tuple[dict[str, Any], bytes]], Requests]] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self._stdout_pipe: asyncio.ReadTransport | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        proc = self.proc
        return (proc is not None and not self.life.died.is_set() and not self.life.killed
                and proc.stdin is not None and not proc.stdin.is_closing())

    async def start(self) -> None:
        self.life.open()
        # Its frames are read from a pipe of ours, in the pieces it delivers (PieceReader:
        # rows too large for the rows arena, megabytes, copied once): asyncio's subprocess
        # reader copies thrice. A batch's rows usually come in the rows arena (arena.py).
        read_fd, write_fd = os.pipe()
        rows_fd = -1
        try:
            rows_fd = self.channel.open(rows_arena_bytes(self.settings.max_buffered_bytes, self.settings.workers))
            self.proc = proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mldserver.pool.child",
                stdin=asyncio.subprocess.PIPE, stdout=write_fd, stderr=None, start_new_session=True,
                pass_fds=self.channel.passed(rows_fd),
            )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            self.channel.close()
            raise
        finally:
            os.close(write_fd)
            if rows_fd >= 0:
                os.close(rows_fd)  # the process has its own; ours is mapped
        if self.life.killed:  # stopped while it was being created
            self._sigkill()
        try:
            stdout = PieceReader(limit=PIPE_LIMIT)
            frame = await self._handshake(os.fdopen(read_fd, "rb", buffering=0), stdout)
        except BaseException:  # cancelled (the pool stops while it starts): it must not outlive us
            self.kill()
            self._cleanup()
            raise
        if frame is None or frame[0].get("op") != "ready":
            self._sigkill()
            code = await proc.wait()
            self.life.died.set()
            self._cleanup()
            if frame is not None and frame[0].get("op") == "import_failed":
                raise HandlerImportFailed(frame[0]["error"])
            raise HandlerImportFailed(f"the handler process did not start ({describe_exit(code)})")
        self.life.ready()
        self.emits = bool(frame[0].get("emits"))  # the handler's code calls emit
        self.task = asyncio.create_task(self._read(stdout), name=f"handler-process-{self.number}")

    async def _handshake(self, frames: Any, stdout: PieceReader) -> tuple[dict[str, Any], bytes] | None:
        """Its frames read from ``frames`` (our end of its stdout) into ``stdout``, the
        start frame sent: its first frame (``ready``, or why not), None if none came in
        START_TIMEOUT."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        try:
            self._stdout_pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(stdout), frames)
        except BaseException:
            frames.close()
            raise
        start: StartFrame = {
            "op": "start",
            "handler": self.settings.handler,
            "settings": dataclasses.asdict(self.settings),
            "sys_path": [os.path.abspath(p or ".") for p in sys.path],
            "state": self.life.state,
            **self.channel.start_fields(),  # type: ignore[typeddict-item]
        }
        proc.stdin.write(encode(start))
        try:
            return await asyncio.wait_for(read_frame_async(stdout), START_TIMEOUT)
        except asyncio.TimeoutError:
            return None

    async def _read(self, stdout: PieceReader) -> None:
        proc = self.proc
        assert proc is not None
        try:
            await self._frames(stdout)
        except Exception as exc:  # a frame that cannot be read: the process is of no more use
            self.log.error("handler_process_unreadable", pid=self.pid, process=self.number,
                           error=f"{type(exc).__name__}: {exc}", exc_info=True,
                           what_to_do="it is killed and replaced; its calls are redone elsewhere")
            self.kill()
        running = self.life.running()
        if proc.stdin is not None:
            proc.stdin.close()  # nothing more is written to it (a write now is ProcessDied)
        returncode = await proc.wait()
        self._close_pipes()
        self.channel.close()
        running = self.life.ended(returncode, running)
        if self.on_death is not None:
            self.on_death(self)
        how = describe_exit(returncode)
        text = ", ".join(f"{k} {v}" for k, v in how.items())
        alone = len(self._calls) == 1
        for call_id, (future, _) in self._calls.items():
            if not future.done():
                # Blame the call that was running (or whose time-out killed it); when none
                # was, the only call in flight. Killed from outside while several calls
                # awaited, none is blamed: the call's owner redoes each a few times
                # (``calls.UNBLAMED_CALL_REDOS``) before the deaths count against it too.
                future.set_exception(ProcessDied(text, blamed=call_id == running or (running == 0 and alone)))
        self._calls.clear()
        # Requests being answered are not cancelled: a checkpoint round trip with the
        # daemon must finish (the call's owner waits for it before it redoes the action).

    async def _frames(self, stdout: PieceReader) -> None:
        """Until its end of output: each ``done`` to its call, each request answered."""
        while True:
            frame = await read_frame_async(stdout)
            if frame is None:
                return
            message, body = frame
            op = message["op"]
            if op == "done":
                self.channel.done(message["id"])  # the process has read its line: the server's again
                entry = self._calls.pop(message["id"], None)
                self.life.over(message["id"])
                wanted = entry is not None and not entry[0].done()
                if "rows_arena" in message:
                    body = self.channel.rows_body(message.pop("rows_arena"), wanted)
                if wanted:
                    entry[0].set_result((message, body))
            else:  # a request of a call: answered by the call's owner (or a service), concurrently
                entry = self._calls.get(message.get("id"))
                answer = self.services.get(op) or (entry[1] if entry else None)
                task = asyncio.create_task(self._answer(message, answer))
                self._serving.add(task)
                task.add_done_callback(self._serving.discard)

    async def _answer(self, message: dict[str, Any], requests: Requests | None) -> None:
        if requests is None:
            reply: dict[str, Any] = {"error": "InvalidStateException", "detail": "the action is over"}
        else:
            try:
                reply = await requests(message)
            except Exception as exc:  # a bug of ours: the handler gets an error, not silence
                self.log.error("request_failed_internally", op=message.get("op"), pid=self.pid,
                               error=f"{type(exc).__name__}: {exc}", exc_info=True)
                reply = {"error": f"{type(exc).__name__}: {exc}"}
        self._tell({"op": "reply", "req": message["req"], **reply})  # (if it died, nobody is left to read it)

    def _write(self, message: dict[str, Any], body: bytes = b"") -> None:
        """One frame to the process, or ProcessDied (whatever its pipe raised)."""
        if not self.alive:
            raise ProcessDied("already gone", blamed=False)
        stdin = self.proc.stdin  # type: ignore[union-attr]
        try:
            stdin.write(encode_head(message, len(body)))  # type: ignore[union-attr]
            if body:
                stdin.write(body)  # type: ignore[union-attr]
        except Exception as exc:  # BrokenPipeError, or uvloop's RuntimeError on a closed transport
            raise self._stdin_failed(exc) from None

    def _tell(self, message: dict[str, Any]) -> None:
        """One frame to the process, if it is still there to read it."""
        try:
            self._write(message)
        except ProcessDied:
            pass

    def _stdin_failed(self, exc: Exception) -> ProcessDied:
        """Its stdin raised: no frame reaches it any more, so it is of no use even if it
        still runs. Killed; the calls affected get the ProcessDied returned."""
        self.kill()
        return ProcessDied(f"its stdin failed: {type(exc).__name__}: {exc}", blamed=False)

    async def call(self, frame: dict[str, Any], body: bytes, requests: Requests,
                   what: tuple[str, str], check: Callable[[], bool] | None = None) -> tuple[dict[str, Any], bytes]:
        """The call's ``done`` frame and body. ``check`` (a held call, ``frame["held"]``)
        runs once the frame is written, while the process parses the batch; its answer
        goes as the call's ``go`` frame."""
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        self._calls[frame["id"]] = (future, requests)
        self.life.sent(frame["id"], what)
        try:
            if self.alive:  # a large line crosses in the arena (the pipe if it is full, or the line larger)
                frame, body = self.channel.put(frame, body)
            self._write(frame, body)
            if check is not None:
                self._write({"op": "go", "id": frame["id"], "call": check()})
            try:
                await self.proc.stdin.drain()  # type: ignore[union-attr]
            except Exception as exc:  # the pipe closed under the write
                raise self._stdin_failed(exc) from None
            return await future
        finally:
            self._calls.pop(frame["id"], None)
            self.life.over(frame["id"])
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the caller has its answer or its error already
            # Its error's traceback holds this frame: were the future (which holds the
            # error) left in it, the cycle would keep both, and every frame the error
            # goes on through with its locals (a batch's rows on loan), until the
            # cyclic GC's next full collection.
            del future

    def running(self) -> int:
        """The id of the call whose handler code is executing now (0: none is)."""
        return self.life.running()

    def blocked(self) -> bool:
        """Its loop has not turned for a few beats (``frames.BLOCKED``): a call blocks
        it, and a call sent now would wait behind it."""
        return self.life.blocked()

    def drop(self, key: int) -> None:
        """The shard ``key``'s instance forgotten there."""
        if self.alive:
            self._tell({"op": "drop", "shard": key})

    async def stack(self, wait: float = 1.0) -> str:
        """Every thread's stack, written by faulthandler on SIGUSR1."""
        path = self.life.stack_file()
        before = path.stat().st_size if path.exists() else 0
        if self.alive and self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                if path.exists() and path.stat().st_size > before:
                    await asyncio.sleep(0.05)  # let it finish writing
                    break
        if not path.exists():
            return ""
        with open(path, "rb") as f:
            f.seek(before)
            return f.read().decode("utf-8", "replace")

    def rss_mib(self) -> float | None:
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
        except (OSError, ValueError, IndexError):
            return None

    def interrupt(self, call_id: int) -> None:
        """Stop one call that ran past its time, and only it: cancelled where it awaits
        (a ``cancel`` frame), interrupted where its code blocks the loop (its id in the
        state file's STOP, then SIGUSR2: ExecutionTimeout is raised there). Its ``done``
        then comes with ``"stopped": true``; the other calls go on."""
        if not self.alive or self.pid is None or not self.life.mark_stop(call_id):
            return
        try:
            self._write({"op": "cancel", "id": call_id})
            os.kill(self.pid, signal.SIGUSR2)
        except (ProcessDied, ProcessLookupError):
            pass  # its death is noticed by the reader

    async def kill_for(self, call_id: int, what: tuple[str, str]) -> str:
        """A call of ``what`` (shard id, action) ran past its time: every thread's stack,
        then the process killed, its death blamed on ``call_id``."""
        self.life.kill_for(call_id, what)
        text = await self.stack()
        self.kill()
        return text

    def kill(self) -> None:
        self.life.kill()
        self._sigkill()

    def _sigkill(self) -> None:
        """SIGKILL to its pid, unless the loop knows it exited already. Never
        ``Process.kill()``: on the stock loop that polls the process first (``Popen.poll``,
        a waitpid), which reaps it if it has just died, before the loop's child watcher
        does; the watcher then reports returncode 255 ("Unknown child process"), and a
        SIGKILL (a second kill: ``kill_for``'s, then the pool's), a SIGSEGV or an exit code
        would be reported as exit code 255. uvloop signals the pid so too."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask it to exit; kill it if it does not within ``timeout`` (or is still
        starting: ``start`` then fails)."""
        self.life.stop()
        if self.task is None:
            self.kill()
        if self.alive:
            self._tell({"op": "stop"})
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout)
            except asyncio.TimeoutError:
                self.kill()
                await self.task
        self._cleanup()

    def _close_pipes(self) -> None:
        """Its pipes' and its own transports, once it has exited (uvloop holds them
        open otherwise, and its loop cannot close)."""
        if self._stdout_pipe is not None:
            self._stdout_pipe.close()
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()

    def _cleanup(self) -> None:
        self._close_pipes()
        self.channel.close()
        self.life.close()
