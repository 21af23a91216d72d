"""The server's side of one handler process (``child.py``): spawn it, send it calls,
answer its requests, notice its death. All asyncio; the loop only waits on pipes::

    proc = HandlerProcess(settings, number=1, log=log)
    await proc.start()                                   # imported and ready, or HandlerImportFailed
    message, body = await proc.call(frame, records, requests)   # a "done" frame, or ProcessDied
    proc.stack()                                         # every thread's stack (SIGUSR1, faulthandler)
    proc.kill(); await proc.stop()

``requests`` answers what the handler asks during the call (``checkpoint``,
``sql_fetch``, ``sql_close``): the call's owner (``calls.ProcessCalls``) is the only
one that knows the shard's checkpointer. What the server answers whichever call asks
(``timer_write``, ``timer_refused``: ``mldserver.timers``) is in ``services``, by op.
When the process dies, every call in flight fails with :class:`ProcessDied`, which
says how (exit code or signal) and whether that call was the one running
(``blamed``: its id was in the shared state file).

This class is the process boundary, and :class:`ProcessDied` is the only shape a
failure takes when it crosses it. Whatever goes wrong writing to, reading from or
waiting on the process (a closed pipe, a transport the loop closed before the death was
noticed (uvloop does, the stock loop drops the write), a frame that cannot be read) is
``ProcessDied`` for the calls it affects; ``drop`` and ``stop`` of a dead process do
nothing. ``alive`` is false from the moment its stdin closes, so nobody places a shard
on a process that is dying.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import mmap
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..base.config import Settings, state_path
from .arena import ARENA_MIN, Arena, ArenaView, Region, extent, rows_arena_bytes, shared_memory
from ..errors import MldserverError
from ..base.logs import EventLogger
from ..shard.pieces import PieceReader
from .frames import BEAT, BEAT_AT, RUN, STATE_SIZE, STOP, STOP_AT, WATCH_INTERVAL, StartFrame, encode, encode_head, read_frame_async

PIPE_LIMIT = 1 << 24
START_TIMEOUT = 60.0
BLOCKED = 4  # heartbeats missed: its loop is blocked
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

    def __init__(self, settings: Settings, *, log: EventLogger, generation: int = 1) -> None:
        self.settings = settings
        self.number = next(self.ids)
        self.generation = generation
        self.log = log
        directory = state_path(settings, "handlers").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        self.state = str(directory / f"process-{os.getpid()}-{self.number}")
        self.proc: asyncio.subprocess.Process | None = None
        self.stdout: PieceReader | None = None  # its frames
        self.pid: int | None = None
        self.shards: dict[int, str] = {}  # shard key -> shard id, assigned here
        self.in_flight: dict[int, tuple[str, str]] = {}  # call id -> (shard id, action)
        self._calls: dict[int, tuple[asyncio.Future[tuple[dict[str, Any], bytes]], Requests]] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self.retiring = False  # shards move away between actions; stopped once none is in one here
        self.acting: set[object] = set()  # who has work under way here: a shard's calls, a timer fire's id
        self.returncode: int | None = None
        self.died = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.started = 0.0
        self._map: mmap.mmap | None = None
        self.arena: Arena | None = None  # where a call's line lands for it (arena.py)
        self._regions: dict[int, Region] = {}  # call id -> its line's region, until its done frame
        self.rows: ArenaView | None = None  # where it puts a batch's rows for us (arena.py), read-only
        self._rows_at: list[int] | None = None  # [fd, size] of that memory, as the process knows it
        self.rows_read = 0  # rows bodies read from it rather than from the pipe
        self.rows_lent = 0  # bytes of it the server still holds (on loan until their windows commit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stdout_pipe: asyncio.ReadTransport | None = None
        self.last_running = 0  # the call id running when it died (0: none was)
        self.killed_for = 0  # the call id whose time-out killed it
        self.killed_what: tuple[str, str] | None = None  # its (shard id, action)
        self.quarantine = False  # spawned for one shard's call that killed its process or ran too long
        self.served = 0  # calls sent to it
        self.emits = False  # the handler's code calls emit (its ready frame says)
        self.killed = False  # by us: no longer alive, though its death may not be noticed yet
        self.stopping = False
        self.on_death: Callable[["HandlerProcess"], None] | None = None
        self.services: dict[str, Requests] = {}  # requests answered by the server, not by a call's owner

    @property
    def alive(self) -> bool:
        proc = self.proc
        return (proc is not None and not self.died.is_set() and not self.killed
                and proc.stdin is not None and not proc.stdin.is_closing())

    @property
    def load(self) -> int:
        return len(self.shards)

    async def start(self) -> None:
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        with open(self.state + ".run", "wb") as f:
            f.write(b"\0" * STATE_SIZE)
        fd = os.open(self.state + ".run", os.O_RDWR)
        self._map = mmap.mmap(fd, STATE_SIZE)
        os.close(fd)
        # Its frames are read from a pipe of ours, in the pieces it delivers (PieceReader:
        # rows too large for the rows arena, megabytes, copied once): asyncio's subprocess
        # reader copies thrice. A batch's rows usually come in the rows arena (arena.py).
        read_fd, write_fd = os.pipe()
        rows_fd = -1
        try:
            self.arena = Arena.create()
            rows_size = rows_arena_bytes(self.settings.max_buffered_bytes, self.settings.workers)
            rows_fd = shared_memory(rows_size, "mldserver-rows")
            self.rows = ArenaView(os.dup(rows_fd), rows_size)
            self.proc = proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mldserver.pool.child",
                stdin=asyncio.subprocess.PIPE, stdout=write_fd, stderr=None, start_new_session=True,
                pass_fds=(self.arena.fd, rows_fd),
            )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            self._close_arena()
            raise
        finally:
            os.close(write_fd)
            if rows_fd >= 0:
                os.close(rows_fd)  # the process has its own; ours is mapped
        self._rows_at = [rows_fd, rows_size]  # (the fd's number is the same in the process)
        if self.killed:  # stopped while it was being created
            self._sigkill()
        try:
            frame = await self._handshake(os.fdopen(read_fd, "rb", buffering=0))
        except BaseException:  # cancelled (the pool stops while it starts): it must not outlive us
            self.kill()
            self._cleanup()
            raise
        if frame is None or frame[0].get("op") != "ready":
            self._sigkill()
            code = await proc.wait()
            self.died.set()
            self._cleanup()
            if frame is not None and frame[0].get("op") == "import_failed":
                raise HandlerImportFailed(frame[0]["error"])
            raise HandlerImportFailed(f"the handler process did not start ({describe_exit(code)})")
        self.started = time.monotonic()
        self.emits = bool(frame[0].get("emits"))  # the handler's code calls emit
        self.task = asyncio.create_task(self._read(), name=f"handler-process-{self.number}")

    async def _handshake(self, frames: Any) -> tuple[dict[str, Any], bytes] | None:
        """Its frames read from ``frames`` (our end of its stdout), the start frame sent:
        its first frame (``ready``, or why not), None if none came in START_TIMEOUT."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        self.stdout = PieceReader(limit=PIPE_LIMIT)
        try:
            self._stdout_pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(self.stdout), frames)
        except BaseException:
            frames.close()
            raise
        self.pid = proc.pid
        start: StartFrame = {
            "op": "start",
            "handler": self.settings.handler,
            "settings": dataclasses.asdict(self.settings),
            "sys_path": [os.path.abspath(p or ".") for p in sys.path],
            "state": self.state,
            "arena": [self.arena.fd, self.arena.size] if self.arena is not None else None,
            "rows_arena": self._rows_at,
        }
        proc.stdin.write(encode(start))
        try:
            return await asyncio.wait_for(read_frame_async(self.stdout), START_TIMEOUT)
        except asyncio.TimeoutError:
            return None

    async def _read(self) -> None:
        proc = self.proc
        assert proc is not None and self.stdout is not None
        try:
            await self._frames()
        except Exception as exc:  # a frame that cannot be read: the process is of no more use
            self.log.error("handler_process_unreadable", pid=self.pid, process=self.number,
                           error=f"{type(exc).__name__}: {exc}", exc_info=True,
                           what_to_do="it is killed and replaced; its calls are redone elsewhere")
            self.kill()
        running = RUN.unpack_from(self._map)[0] if self._map is not None else 0
        if proc.stdin is not None:
            proc.stdin.close()  # nothing more is written to it (a write now is ProcessDied)
        self.returncode = await proc.wait()
        self._close_pipes()
        self._close_arena()
        self.last_running = running = self.killed_for or running
        self.died.set()
        if self.on_death is not None:
            self.on_death(self)
        how = describe_exit(self.returncode)
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

    async def _frames(self) -> None:
        """Until its end of output: each ``done`` to its call, each request answered."""
        assert self.stdout is not None
        while True:
            frame = await read_frame_async(self.stdout)
            if frame is None:
                return
            message, body = frame
            op = message["op"]
            if op == "done":
                region = self._regions.pop(message["id"], None)
                if region is not None and self.arena is not None:
                    self.arena.free(region)  # the process has read it: it is the server's again
                entry = self._calls.pop(message["id"], None)
                self.in_flight.pop(message["id"], None)
                wanted = entry is not None and not entry[0].done()
                if "rows_arena" in message:
                    body = self._rows_body(message.pop("rows_arena"), wanted)
                if wanted:
                    entry[0].set_result((message, body))
            else:  # a request of a call: answered by the call's owner (or a service), concurrently
                entry = self._calls.get(message.get("id"))
                answer = self.services.get(op) or (entry[1] if entry else None)
                task = asyncio.create_task(self._answer(message, answer))
                self._serving.add(task)
                task.add_done_callback(self._serving.discard)

    def _rows_body(self, region: list[int], wanted: bool) -> Any:
        """A done frame's rows, in the process's rows arena: read where they lie (if
        its call still waits for them), on loan until nothing refers to them (their
        windows committed: ``api.loans``); else handed back at once."""
        held = extent(region)  # type: ignore[arg-type]
        self.rows_lent += held[1]
        if not wanted:
            self._give_back(held)
            return b""
        if self.rows is None:  # (never: the arena is closed only once its frames are read)
            raise RuntimeError("a done frame names the rows arena, which is closed")
        self.rows.region(*held)  # ValueError if not inside it: the process is unreadable
        from ..api.loans import lend  # (numpy: a server with a sink)

        self.rows_read += 1
        return lend(self.rows.map, *held, self._give_back)[: region[1]]

    def _give_back(self, part: Region) -> None:
        """Bytes of the rows arena the server is done with, back to the process (a
        ``free`` frame) from the event loop's thread, whichever thread let them go, and
        never in the middle of another frame: a loan's last reference may go anywhere."""
        loop = self._loop
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_soon(self._free_rows, part)  # type: ignore[union-attr]
            else:
                loop.call_soon_threadsafe(self._free_rows, part)  # type: ignore[union-attr]
        except RuntimeError:
            pass  # the loop is closed: the server is gone, and the process with it

    def _free_rows(self, part: Region) -> None:
        self.rows_lent -= part[1]
        try:
            self._write({"op": "free", "region": list(part)})
        except ProcessDied:
            pass  # its arena went with it

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
        try:
            self._write({"op": "reply", "req": message["req"], **reply})
        except ProcessDied:
            pass  # nobody is left to read it

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
        self.in_flight[frame["id"]] = what
        self.served += 1
        try:
            if len(body) >= ARENA_MIN and self.alive and self.arena is not None:
                region = self.arena.put(body)
                if region is not None:  # else the pipe: the arena is full, or the line larger
                    self._regions[frame["id"]] = region
                    frame, body = {**frame, "arena": region}, b""
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
            self.in_flight.pop(frame["id"], None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the caller has its answer or its error already
            # Its error's traceback holds this frame: were the future (which holds the
            # error) left in it, the cycle would keep both, and every frame the error
            # goes on through with its locals (a batch's rows on loan), until the
            # cyclic GC's next full collection.
            del future

    def running(self) -> int:
        """The id of the call whose handler code is executing now (0: none is)."""
        return RUN.unpack_from(self._map)[0] if self._map is not None else 0

    def blocked(self) -> bool:
        """Its loop has not turned for BLOCKED beats: a call blocks it (``time.sleep``,
        a long computation), and a call sent now would wait behind it."""
        if self._map is None:
            return False
        beat = BEAT.unpack_from(self._map, BEAT_AT)[0]
        return beat != 0 and time.monotonic_ns() - beat > BLOCKED * WATCH_INTERVAL * 1e9

    def drop(self, key: int) -> None:
        self.shards.pop(key, None)
        if self.alive:
            try:
                self._write({"op": "drop", "shard": key})
            except ProcessDied:
                pass

    async def stack(self, wait: float = 1.0) -> str:
        """Every thread's stack, written by faulthandler on SIGUSR1."""
        path = Path(self.state + ".stack")
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

    def crash_stack(self) -> str:
        """What faulthandler wrote when the process died of a fatal signal."""
        path = Path(self.state + ".stack")
        return path.read_text(errors="replace")[-8000:] if path.exists() else ""

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
        if not self.alive or self._map is None or self.pid is None:
            return
        STOP.pack_into(self._map, STOP_AT, call_id)
        try:
            self._write({"op": "cancel", "id": call_id})
            os.kill(self.pid, signal.SIGUSR2)
        except (ProcessDied, ProcessLookupError):
            pass  # its death is noticed by the reader

    async def kill_for(self, call_id: int, what: tuple[str, str]) -> str:
        """A call of ``what`` (shard id, action) ran past its time: every thread's stack,
        then the process killed, its death blamed on ``call_id``."""
        self.killed_for, self.killed_what = call_id, what
        text = await self.stack()
        self.kill()
        return text

    def kill(self) -> None:
        self.killed = True
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
        self.stopping = True
        if self.task is None:
            self.kill()
        if self.alive:
            try:
                self._write({"op": "stop"})
            except ProcessDied:
                pass
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

    def _close_arena(self) -> None:
        """Once it has exited: its regions can be read by nobody any more."""
        self._regions.clear()
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self.rows is not None:
            self.rows.close()
            self.rows = None

    def _cleanup(self) -> None:
        self._close_pipes()
        self._close_arena()
        if self._map is not None:
            self._map.close()
            self._map = None
        for suffix in (".run", ".stack"):
            try:
                os.unlink(self.state + suffix)
            except FileNotFoundError:
                pass
