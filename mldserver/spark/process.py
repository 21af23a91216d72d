"""The server's side of the Spark process (``child.py``): start it, supervise it, send it
requests, stop it. All of it is asyncio; the event loop only ever waits on a pipe.

::

    spark = SparkProcess(settings, sink_dir=Path("out"))
    await spark.start()                     # the session is up (3-5 s cold), or SparkError
    reply = await spark.request({"op": "commit", "window": {...}, "path": "..."})
    async for row in spark.sql("SELECT * FROM t WHERE k = :k", {"k": 1}):
        ...
    await spark.stop()

Supervision: when the process exits unexpectedly, every request in flight fails with
:class:`SparkProcessDied` (retriable: the coordinator hands the window over again, and
the commit log makes sure it is not committed twice); the process is started again
with backoff, and new requests wait until it is ready. A process that cannot be
started again (``spark_restart_failed``: it answers with an error or exits, or a time
out or an OSError ``RESTART_ATTEMPTS`` times in a row) ends the supervisor task with
that error: the server, which watches ``spark.task``, logs ``task_crashed`` and shuts
down. Its stderr (Spark's own logs, a pipeline's prints) goes to
``<state-dir>/spark/spark.log``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from ..base.backoff import Backoff
from ..base.config import Settings, state_path
from ..errors import SparkError, SparkProcessDied, retriable
from ..base.logs import EventLogger, get_logger
from .frames import StartRequest, encode, read_frame_async

# Rows per SQL fetch: small at first (a caller that stops early leaves most partitions
# uncomputed), doubling up to the cap (a caller that reads everything pays few round trips).
SQL_FIRST_FETCH = 64
SQL_MAX_FETCH = 8192
PIPE_LIMIT = 1 << 24
# Restarts in a row that may time out (or meet an OSError) before the supervisor gives up.
RESTART_ATTEMPTS = 5

__all__ = ["SparkError", "SparkProcess", "SparkProcessDied"]


class SparkRefused(SparkError):
    """The Spark process refused to start for a mistake in the settings (the pipeline
    cannot be imported): ``mistake`` is its ConfigError's own words, the line the server
    stops on at start-up (the one ``mldserver check`` prints)."""

    def __init__(self, mistake: str, log_path: Path) -> None:
        super().__init__(f"the Spark process did not start: ConfigError: {mistake} (its log: {log_path})",
                         retriable=False)
        self.mistake = mistake


class SparkProcess:
    def __init__(self, settings: Settings, *, sink_dir: Path | None = None, log: EventLogger | None = None) -> None:
        self.settings = settings
        self.sink_dir = sink_dir
        self.log = log or get_logger("mldserver.spark")
        self.work_dir = state_path(settings, "spark").resolve()
        self.log_path = self.work_dir / "spark.log"
        self.backoff = Backoff(first=1.0, cap=30.0)
        self.restarts = 0
        self.info: dict[str, Any] = {}
        self.last_sql_jobs: int | None = None  # Spark jobs the last closed SQL cursor ran
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._cursors = itertools.count(1)
        self._ready = asyncio.Event()
        self._stopping = False
        self._gone: Exception | None = None  # why the supervisor gave up
        self._closed = False  # stop() has run: no request will be answered again
        self.last_error: str | None = None  # for /status: the last exit or failed restart
        self.executors: list[str] | None = None  # a cluster's live executors (None: local or not told)
        self.executors_lost = 0
        self.task: asyncio.Task[None] | None = None  # the supervisor, watched by the server

    # -- lifecycle -----------------------------------------------------------------

    @property
    def state(self) -> str:
        """For /readyz and /status: starting, up, restarting, failed or stopped."""
        if self._gone is not None:
            return "failed"
        if self._stopping:
            return "stopped"
        if self._ready.is_set() and self._proc is not None and self._proc.returncode is None:
            return "up"
        return "restarting" if self.task is not None else "starting"

    async def start(self) -> None:
        """Start the Spark process and wait for its session; a failure here is raised."""
        await self._spawn()
        self.task = asyncio.create_task(self._supervise(), name="spark-supervisor")

    async def stop(self) -> None:
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None and self._ready.is_set():
            try:
                await asyncio.wait_for(self.request({"op": "stop"}), 30)
                await asyncio.wait_for(proc.wait(), 30)
            except (asyncio.TimeoutError, SparkError):
                pass
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self._closed = True
        self._ready.set()  # a request made from now on (a cursor closed late) fails instead of waiting
        self.log.info("spark_stopped", restarts=self.restarts)
        if task is not None and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # the supervisor gave up (spark_restart_failed)

    async def _spawn(self) -> None:
        s = self.settings
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mldserver.spark.child",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                cwd=self.work_dir,
                start_new_session=True,  # a Ctrl-C in the terminal is the server's to handle
                limit=PIPE_LIMIT,
            )  # fmt: skip
        options: StartRequest = {
            "op": "start",
            "id": next(self._ids),
            "master": s.spark_master,
            "remote": s.spark_remote,
            "conf": dict(s.spark_conf or {}),
            "work_dir": str(self.work_dir),
            "sink_dir": str(self.sink_dir) if self.sink_dir else None,
            "format": s.sink_format,
            "pipeline": s.pipeline,
            "sys_path": [os.path.abspath(p or ".") for p in sys.path],
        }
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(encode(options))
        try:
            frame = await asyncio.wait_for(read_frame_async(proc.stdout), s.spark_start_timeout)
        except asyncio.TimeoutError:
            frame = None
        if frame is None or not frame[0].get("ok"):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            if frame is not None:
                error = frame[0]["error"]
            elif proc.returncode is not None and proc.returncode != -9:
                error = f"it exited with code {proc.returncode}"
            else:
                error = f"no answer within {s.spark_start_timeout:.0f} s"
            if error.startswith("ConfigError: "):  # a mistake in the settings (the pipeline not importable)
                raise SparkRefused(error.removeprefix("ConfigError: "), self.log_path)
            raise SparkError(
                f"the Spark process did not start: {error} (its log: {self.log_path})",
                retriable=frame is None and proc.returncode == -9,  # timed out: it may start next time
            )
        self._proc = proc
        self.info = frame[0]
        self._ready.set()
        self.log.info(
            "spark_started",
            pid=proc.pid,
            master=None if s.spark_remote else (s.spark_master or "local[*]"),
            remote=s.spark_remote,
            spark_version=self.info.get("spark_version"),
            log=str(self.log_path),
        )

    async def _supervise(self) -> None:
        try:
            await self._watch()
        except Exception as exc:
            self._gone = exc
            self._ready.set()  # requests waiting for a restart fail instead of hanging
            raise

    async def _watch(self) -> None:
        while True:
            proc = self._proc
            assert proc is not None and proc.stdout is not None
            frame = await read_frame_async(proc.stdout)
            if frame is not None and frame[0].get("event") == "executors":
                self._executors(frame[0])
                continue
            if frame is not None and frame[0].get("event") == "warmed_up":
                told = frame[0]
                jobs, ms, cut_short = told.get("jobs"), told.get("ms"), told.get("cut_short")
                if told.get("error"):  # a job failed: the same fault may fail a commit next
                    self.log.warning("spark_warmed_up", jobs=jobs, ms=ms, cut_short=cut_short, error=told["error"])
                else:
                    self.log.info("spark_warmed_up", jobs=jobs, ms=ms, cut_short=cut_short)
                continue
            if frame is not None:
                future = self._pending.pop(frame[0].get("id"), None)
                if future is not None and not future.done():
                    future.set_result(frame[0])
                continue
            self._ready.clear()
            code = await proc.wait()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(SparkProcessDied(f"the Spark process exited (code {code})"))
            self._pending.clear()
            if self._stopping:
                return
            self.last_error = f"the Spark process exited (code {code})"
            await self._restart(code)

    def _executors(self, told: dict[str, Any]) -> None:
        """The Spark process told a change in the cluster's live executors (a cluster
        master: local[*] has none, Spark Connect does not say)."""
        first = self.executors is None
        self.executors = list(told.get("executors") or [])
        if first:
            self.log.info("spark_executors", executors=len(self.executors), hosts=self.executors)
            return
        for lost in told.get("lost") or []:
            self.executors_lost += 1
            self.log.warning("spark_executor_lost", executor=lost, executors=len(self.executors),
                             what_to_do="Spark runs the lost executor's tasks again on the others; a window being "
                                        "committed goes on. If it does not come back, see the worker's log")
        for added in told.get("added") or []:
            self.log.info("spark_executor_added", executor=added, executors=len(self.executors))

    async def _restart(self, code: int) -> None:
        attempt = 0
        while True:
            delay = self.backoff.delay(attempt)
            self.log.error(
                "spark_process_exited",
                pid=self._proc.pid if self._proc else None,
                returncode=code,
                restart_in_ms=round(delay * 1000),
                log=str(self.log_path),
                what_to_do="windows in flight are handed over again once it is back; see its log",
            )
            await asyncio.sleep(delay)
            attempt += 1
            try:
                await self._spawn()
            except (SparkError, OSError) as exc:
                code = -1
                self.last_error = f"restart failed: {exc}"
                again = retriable(exc) and attempt < RESTART_ATTEMPTS
                self.log.error(
                    "spark_restart_failed",
                    error=str(exc),
                    attempt=attempt,
                    retrying=again,
                    what_to_do="tried again" if again else "the server shuts down; see the Spark log, then start it",
                )
                if again:
                    continue
                raise
            self.restarts += 1
            return

    # -- requests ------------------------------------------------------------------

    async def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its reply; SparkError if it failed there."""
        await self._ready.wait()
        if self._closed:
            raise SparkProcessDied("the Spark process has stopped (the server is shutting down)")
        if self._gone is not None:
            raise SparkProcessDied(f"the Spark process could not be started again ({self._gone})")
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            proc.stdin.write(encode({**message, "id": request_id}))
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._pending.pop(request_id, None)
            raise SparkProcessDied(f"the Spark process is gone ({exc})") from None
        reply = await future
        if not reply.get("ok"):
            raise SparkError(reply.get("error", "unknown error"), reply.get("traceback", ""))
        return reply

    async def sql(self, query: str, args: dict[str, Any] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Rows of ``query`` as dicts, fetched from Spark as the caller iterates.

        Nothing runs until the first row is asked for; leaving the loop early closes
        the cursor, so Spark stops computing partitions nobody will read.
        """
        cursor = next(self._cursors)
        request = {"op": "sql_fetch", "cursor": cursor, "query": query, "args": args or {}, "n": SQL_FIRST_FETCH}
        opened = False
        try:
            while True:
                reply = await self.request(request)
                request["n"] = min(SQL_MAX_FETCH, request["n"] * 2)
                opened = True
                for row in reply["rows"]:
                    yield row
                if reply["done"]:
                    break
        finally:
            if opened:
                try:
                    closed = await self.request({"op": "sql_close", "cursor": cursor})
                    self.log.debug("sql_closed", cursor=cursor, jobs=closed.get("jobs"))
                    self.last_sql_jobs = closed.get("jobs")
                except SparkError:
                    pass  # the Spark process died: its cursors died with it
