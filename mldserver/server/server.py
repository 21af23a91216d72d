"""The server: listeners, one shard driver per connection, and an ordered shutdown.

``mldserver serve --handler pkg.mod:Attr --port 7070`` runs ``Server(settings).serve()``
on uvloop. Lifecycle (uvicorn's shape)::

    startup   load the handler factory (a ConfigError stops us before binding),
              create and probe the state directory (preflight), with a sink:
              start the coordinator (replaying the spool), bind TCP (loopback by
              default; the protocol has no authentication: any other host is a
              ``listening_beyond_loopback`` warning) and/or a unix socket (only a
              stale socket is replaced), log one ``listening`` event with the
              address. What the machine refuses (a port in use, a host that does
              not resolve, a path taken) is a ConfigError naming the setting.
    companions  started once listening, stopped first, watched as owned tasks
              (``mldserver run``: the KCL daemon, mldserver.ops.daemon)
    sources   with ``--source`` (mldserver.sources): their saved positions read
              before anything starts (``--from`` where some are saved is a
              ConfigError), their readers started once listening, each shard
              served through ``attach`` as an accepted connection, and stopped
              with the companions (each shard gets ``shutdownRequested``)
    admin     with ``Settings.admin`` (``mldserver serve``: 127.0.0.1:7071 unless
              ``--admin off``), the admin endpoint (mldserver.server.admin) is bound first,
              so /readyz answers 503 while Spark starts; it reads the server's
              metrics (mldserver.server.metrics), ``unhealthy()``, ``not_ready()``, and
              calls ``pause()`` / ``resume()`` (the gate in mldserver.shard.pausing). Its
              token (which POSTs need: ``--admin-token-file``, or beyond loopback the
              state directory's ``admin-token``) is read before anything starts
    timers    once the handler processes are up, the timer scheduler (mldserver.timers)
              starts: timers that fell due while the server was down fire now; it is
              stopped after the connections, before the handler processes
    serve     each accepted connection gets a ShardDriver task, owned by the server; the
              server waits on its listeners, the coordinator's tasks (committer,
              tick) and the Spark supervisor together with the stop signal
    reload    on SIGHUP (``signal_received``), with handler processes: a new generation
              imports the handler afresh and shards move over between two actions
              (``reloaded``), or the old one keeps serving (``reload_failed``); in the
              server's loop (``workers = 0``) nothing can be re-imported (``reload_skipped``)
    shutdown  on SIGTERM/SIGINT (``signal_received``), ``stop()``, or a crash:
              stop accepting; idle connections are closed; busy ones (an action
              arrived, even partly, even waiting for a slot) finish it (status sent)
              within ``shutdown_timeout``; then their handler calls are cancelled
              and their actions answered as failed, what is left is cancelled (each
              wait bounded), the coordinator and Spark stopped, and the signal
              handlers restored

A shard driver that crashes is logged as ``driver_crashed`` with its shard and closed;
the others go on. A task the server owns that ends (the committer meeting an error it
does not retry, a Spark process that cannot be restarted) is logged as
``task_crashed`` with its name, error and traceback; the server shuts down in the same
order and ``serve()`` raises ServerCrashed, which the CLI turns into exit code 1 so that
systemd restarts it::

    {"event":"task_crashed","task":"coordinator-committer","error":"TypeError: ...",
     "traceback":"Traceback ...","what_to_do":"..."}
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .preflight import java, writable_sink, writable_state_dir
from ..shard import pieces
from .assembly import Parts, build
from ..api.bindings import current as current_bindings
from ..base.config import Settings, admin_address
from ..errors import ConfigError, ServerCrashed
from .listeners import STREAM_LIMIT, Listeners
from ..base.logs import errors_only, get_logger
from .metrics import LoopLag
from ..shard import ShardDriver
from ..shard.calls import reap_abandoned
from ..spark.process import SparkError, SparkRefused
from ..timers import api as timers_api

if TYPE_CHECKING:
    from .admin import Admin
    from .redrive import RedriveResult
    from ..base.deadletters import DeadLetters
    from ..api.context import Context
    from ..coordinator import Coordinator
    from .metrics import Metrics
    from ..shard.pausing import Pause
    from ..pool import HandlerPool
    from ..sinks import Sink
    from ..spark.process import SparkProcess
    from ..timers.scheduler import Scheduler

log = get_logger("mldserver.server")

# SIGTERM and SIGINT stop in order; SIGHUP reloads the handler (handler processes).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Past shutdown_timeout: how long drivers get to answer once their calls are cancelled.
ABORT_WAIT_S = 5.0
SINK_UNREADY_AFTER = 10.0  # s a window's commits keep failing before /readyz says not ready


class Server:
    def __init__(
        self,
        settings: Settings,
        factory: Callable[[Any], Any] | None = None,
        *,
        clock: Callable[[], float] | None = None,
        sink: "Sink | None" = None,
    ) -> None:
        """``clock`` (epoch ms) goes to the coordinator; ``sink`` replaces the one
        ``settings.sink`` names (a test's, or an embedder's own). A ``factory`` object
        runs in this loop (a process can only import ``settings.handler``); else, with
        ``workers`` > 0, handlers run in a pool of handler processes and this process
        imports no user code."""
        self.settings = settings
        self.parts: Parts = build(settings, factory, clock=clock, sink=sink)
        self.listeners = Listeners(self._accept, settings)
        self.drivers: dict[asyncio.Task[None], ShardDriver] = {}  # one per accepted connection
        self.loop_lag = LoopLag(observe=self.parts.metrics.loop_lag.observe)
        self.parts.metrics.watch(self)
        self.admin: Admin | None = None
        if settings.admin and admin_address(settings.admin) is not None:  # parsed here: a typo stops us early
            from .admin import Admin  # aiohttp (about 20 MiB) only where the endpoint is on

            self.admin = Admin(self, settings.admin, settings.admin_token_file)
        # Started once listening, stopped first, watched as owned tasks (mldserver run: the daemon).
        self.companions: list[Any] = []
        self.sources: list[Any] = []  # SourceReader per --source (mldserver.sources)
        if settings.source or settings.source_from:  # (--from alone: refused there)
            from ..sources import readers  # aioboto3 only for a server that reads a stream itself

            coordinator = self.coordinator
            self.sources = readers(settings, attach=self.attach, empty_batches=coordinator is not None,
                                   lineage=coordinator.expect if coordinator is not None else None,
                                   restart=coordinator.restart_shard if coordinator is not None else None)
        self.crashed: BaseException | None = None  # what ended a task the server owns
        self.listening = False
        self._emits = self.parts.emits
        self._ids = itertools.count(1)
        self._reloads: set[asyncio.Task[Any]] = set()
        self._redriving: asyncio.Task[Any] | None = None  # POST /redrive's run, one at a time
        self._stop = asyncio.Event()
        self._shut = False  # shutdown() ran
        self._refusing = False  # from the start of shutdown, once the companions are stopped

    # -- the parts, by name (the admin endpoint, the metrics and tests read them) --------

    @property
    def pool(self) -> "HandlerPool | None":
        return self.parts.pool

    @property
    def coordinator(self) -> "Coordinator | None":
        return self.parts.coordinator

    @property
    def spark(self) -> "SparkProcess | None":
        return self.parts.spark

    @property
    def timers(self) -> "Scheduler":
        return self.parts.timers

    @property
    def context(self) -> "Context":
        return self.parts.context

    @property
    def metrics(self) -> "Metrics":
        return self.parts.metrics

    @property
    def pause_gate(self) -> "Pause":
        return self.parts.pause

    @property
    def address(self) -> tuple[str, int] | str | None:
        """Where relays connect (the unix path first), once listening."""
        return self.listeners.address

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Check the state directory, bind, start the handler processes, Spark and the
        coordinator, then serve.
        A setting the machine refuses (a state directory it cannot write, a port in
        use, a host it cannot resolve, a path taken) is a ConfigError naming it; what
        had started by then is stopped (logging errors only: the error is what to read)."""
        try:
            await self._start()
        except BaseException:
            with errors_only():
                await self.shutdown()
            raise

    async def _start(self) -> None:
        s = self.settings
        await asyncio.to_thread(writable_state_dir, Path(s.state_dir))
        await asyncio.to_thread(writable_sink, s)
        if self.admin is not None:
            await self.admin.prepare(Path(s.state_dir))  # its token read (or made) before anything starts
        for source in self.sources:
            source.prepare()  # --from where positions are saved: said before anything starts
        if self.spark is not None and not s.spark_remote:  # (a Spark Connect client needs no Java here)
            await asyncio.to_thread(java, "Spark (--pipeline, --sink parquet: or iceberg:)")
        self.loop_lag.start()
        await self.listeners.bind()  # bound first, served last: a port in use is said before anything starts
        if self.pool is not None:
            await self.pool.start()  # every handler process checked the handler (or ConfigError), in a second
            self._emits = any(p.emits for p in self.pool.processes)
        if self._emits and self.coordinator is None:
            log.warning("emit_without_sink", handler=s.handler,
                        what_to_do="the handler's code calls emit, but no sink keeps rows: they are discarded "
                                   "(rows_discarded); add --sink parquet:DIR (or file:DIR, iceberg:DIR)")
        if self.admin is not None:
            await self.admin.start()  # before Spark: /readyz answers 503 while it starts
        if self.spark is not None:
            try:
                await self.spark.start()  # the session is up (and the sink locked) before we bind
            except SparkRefused as exc:
                raise ConfigError(exc.mistake) from None
            except SparkError as exc:
                raise ConfigError(str(exc)) from None
        if self.coordinator is not None:
            await self.coordinator.start()  # commit log read, spool replayed, before any shard connects
        try:
            await self.timers.start()  # after the pool: timers due while we were down fire now
        except Exception as exc:
            raise ConfigError(f"timer_store {s.timer_store}: cannot open it ({type(exc).__name__}: {exc}): check "
                              f"the file (or the table, its region and credentials), or choose another") from None
        timers_api.current.set(self.context.timers)  # timers.create in this loop's tasks (workers = 0)
        current_bindings.set(self.context.bindings)  # bindings.table in timer callbacks (workers = 0)
        await self.listeners.serve(workers=None if self.pool is None else [p.pid for p in self.pool.processes])
        self.listening = True
        for source in self.sources:
            await source.start()

    async def serve(self) -> None:
        """Run until a signal (or ``stop()``), then shut down in order; if a task the
        server owns dies, shut down the same way and raise ServerCrashed."""
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in previous:
            loop.add_signal_handler(sig, self._on_signal, sig)
        started = False
        try:
            await self.start()
            for companion in self.companions:
                await companion.start(self)
            started = True
            await self._watch()
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)
            if started:
                await self.shutdown()
            else:  # (a failed start() has stopped what it started)
                with errors_only():
                    await self.shutdown()
        if isinstance(self.crashed, ConfigError):  # found once running (a source's position): logged where found
            raise self.crashed
        if self.crashed is not None:
            raise ServerCrashed(f"{_describe(self.crashed)} (logged as task_crashed)") from self.crashed

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """What the server owns besides its connections: listeners, the coordinator's
        committer and tick, the Spark supervisor, the handler pool's supervisor, the
        timer scheduler. None of them ends by itself."""
        tasks = self.listeners.tasks
        if self.coordinator is not None:
            tasks += self.coordinator.tasks
        if self.spark is not None and self.spark.task is not None:
            tasks.append(self.spark.task)
        if self.pool is not None and self.pool.task is not None:
            tasks.append(self.pool.task)
        if self.timers.task is not None:
            tasks.append(self.timers.task)
        tasks += [c.task for c in self.companions if c.task is not None]
        tasks += [r.task for r in self.sources if r.task is not None]
        return tasks

    async def _watch(self) -> None:
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stopping, *self.tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        for task in done:
            if task is not stopping:
                exc = task.exception() if not task.cancelled() else None
                self._crashed(task.get_name(), exc or RuntimeError(f"{task.get_name()} ended"))

    def _crashed(self, name: str, exc: BaseException) -> None:
        if exc is self.crashed:
            return  # a stop() re-raising the crash that started the shutdown
        self.crashed = self.crashed or exc
        if isinstance(exc, ConfigError):
            return  # what to do is logged where it was found (source_position_invalid); stderr has it, exit 2
        log.error(
            "task_crashed",
            task=name,
            error=_describe(exc),
            what_to_do="the server shuts down and exits 1 (systemd starts it again); the traceback says why",
            exc_info=exc,
        )

    def _on_signal(self, sig: int) -> None:
        log.info("signal_received", signal=signal.Signals(sig).name)
        if sig == signal.SIGHUP:
            self.reload()
            return
        self._stop.set()

    def reload(self) -> asyncio.Task[bool] | None:
        """Import the handler afresh in new handler processes (SIGHUP, ``POST /reload``):
        the task says whether the new code loaded; None with ``workers = 0``."""
        if self.pool is None:
            log.warning("reload_skipped", reason="handlers run in the server's loop (workers = 0)",
                        what_to_do="restart the server to load new handler code, or run with --workers N")
            return None
        task = asyncio.get_running_loop().create_task(self.pool.reload(), name="reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)
        return task

    def redrive(self, timeout: float) -> "asyncio.Task[RedriveResult]":
        """Send the dead-lettered records through the current handler (``POST /redrive``,
        mldserver.server.redrive); the task's result says what was redriven, or it
        raises ``Busy`` (paused, shutting down, or a redrive already under way)."""
        from .redrive import Busy, redrive

        if self._redriving is not None and not self._redriving.done():
            raise Busy("a redrive is under way: wait for its answer, then redrive again")
        task = asyncio.get_running_loop().create_task(redrive(self, timeout), name="redrive")
        self._redriving = task
        return task

    def stop(self) -> None:
        self._stop.set()

    # -- the admin endpoint ----------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self.pause_gate.paused

    def pause(self) -> bool:
        """Hold every shard's next action before its handler call (POST /pause);
        False if already paused."""
        changed = self.pause_gate.pause()
        if changed:
            log.info("paused", shards=len(self.drivers))
        return changed

    def resume(self) -> bool:
        changed = self.pause_gate.resume()
        if changed:
            log.info("resumed", shards=len(self.drivers))
        return changed

    def unhealthy(self) -> str | None:
        """Why /healthz fails (a task the server owns has ended), or None."""
        if self.crashed is not None:
            return f"crashed: {_describe(self.crashed)}"
        for task in self.tasks:
            if task.done():
                exc = None if task.cancelled() else task.exception()
                return f"task {task.get_name()} ended" + (f": {_describe(exc)}" if exc else "")
        if self._stop.is_set():
            return "shutting down"
        return None

    def not_ready(self) -> str | None:
        """What /readyz waits for (listening; Spark up; the commit log read; a sink that
        commits: one failing the window in front for ``SINK_UNREADY_AFTER`` seconds is
        not ready, with its error), or None."""
        if self.spark is not None and self.spark.state != "up":
            return f"the Spark process is {self.spark.state}"
        if not self.listening:
            return "not listening yet" if not self._stop.is_set() else "shutting down"
        failing = self.coordinator.committer.failing if self.coordinator is not None else None
        if failing is not None and time.time() - failing.since >= SINK_UNREADY_AFTER:
            return (f"the sink has failed window {failing.window} for {time.time() - failing.since:.0f} s "
                    f"({failing.attempts} attempts): {failing.error}")
        return self.unhealthy()

    async def shutdown(self) -> None:
        """Stop everything in order (once: a second call returns at once)."""
        if self._shut:
            return
        self._shut = True
        if self.resume():  # paused actions finish as any action under way does
            log.info("resumed_for_shutdown")
        # The daemon stops its shards while we still serve them (resumed: its
        # shutdownRequested must not wait on a pause), new connections included:
        # during its graceful shutdown it may start a child for a shard it takes again.
        for companion in self.companions:
            await self._stopped(companion.stop())
        for source in self.sources:
            await self._stopped(source.stop())  # each shard: its action answered, shutdownRequested, closed
        if self._redriving is not None and not self._redriving.done():
            self._redriving.cancel()  # nothing is removed before it is committed: sent again next time
            await asyncio.wait([self._redriving])
            if not self._redriving.cancelled():
                self._redriving.exception()  # retrieved: the admin endpoint's answer has it
        self._refusing = True
        self.listeners.close()
        self.listening = False
        # Every driver is asked to finish: one whose action has arrived (even partly,
        # even waiting for a slot) answers it; an idle one closes at once.
        busy = 0
        for driver in list(self.drivers.values()):
            busy += driver.busy
            driver.stop()
        log.info("shutting_down", connections=len(self.drivers), busy=busy)
        if self.drivers:
            _, pending = await asyncio.wait(list(self.drivers), timeout=self.settings.shutdown_timeout)
            if pending:
                # Past shutdown_timeout: their handler calls are cancelled and their
                # actions answered as failed; then whatever is left is cancelled.
                log.warning("shutdown_timeout", cancelled=len(pending), timeout_s=self.settings.shutdown_timeout)
                for task in pending:
                    driver = self.drivers.get(task)
                    if driver is not None:
                        driver.abort()
                _, pending = await asyncio.wait(pending, timeout=ABORT_WAIT_S)
                for task in pending:
                    task.cancel()
                if pending:
                    log.warning("shutdown_cancelled", cancelled=len(pending))
                    await asyncio.wait(pending, timeout=ABORT_WAIT_S)
        stuck = await reap_abandoned()
        if stuck:
            log.warning("handler_calls_ended", count=stuck,
                        what_to_do="handler calls that swallowed their cancellation were closed at shutdown")
        await self._stopped(self.listeners.wait_closed())
        for task in list(self._reloads):
            task.cancel()
        await self._stopped(*list(self._reloads))
        # Timer callbacks under way finish (they run in the pool); creates are refused from here on.
        await self._stopped(self.timers.stop(self.settings.shutdown_timeout))
        if self.pool is not None:
            await self._stopped(self.pool.stop())
        await self._stopped(self.context.close())  # the bindings' client
        if self.coordinator is not None:
            await self._stopped(self.coordinator.stop())
        if self.spark is not None:
            await self._stopped(self.spark.stop())
        await self.loop_lag.stop()
        if self.admin is not None:
            await self.admin.stop()
        self.listeners.remove_unix_socket()
        log.info("stopped", loop_lag_max_ms=round(self.loop_lag.worst * 1000, 1))

    async def _stopped(self, *stopping: Any) -> None:
        """Await each (a stop, a cancelled listener); what one re-raises is logged as
        ``task_crashed`` unless it is the crash already logged, and shutdown goes on."""
        for aw in stopping:
            try:
                await aw
            except asyncio.CancelledError:
                if not isinstance(aw, asyncio.Task) or not aw.cancelled():
                    raise
            except Exception as exc:
                self._crashed(_name(aw), exc)

    # -- connections -----------------------------------------------------------

    async def attach(self, sock: socket.socket, redrive: "DeadLetters | None" = None) -> None:
        """Serve one end of a socket pair as an accepted connection: a source's shard
        (mldserver.sources), the other end spoken by its feed as the daemon would. Its
        checkpoints are stored locally (a file, or the source's lease item), so the
        server checkpoints each commit, not every ``checkpoint_interval``. With
        ``redrive``, a redrive's (mldserver.server.redrive: what fails again goes there)."""
        accept = (functools.partial(self._accept, source=True) if redrive is None
                  else functools.partial(self._accept, redrive=redrive))
        await pieces.serve_socket(accept, sock, STREAM_LIMIT)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                      source: bool = False, redrive: "DeadLetters | None" = None) -> None:
        conn_id = next(self._ids)
        peer = writer.get_extra_info("peername")
        wlog = log.bind(conn=conn_id)
        if self._refusing:
            wlog.warning("shard_refused", peer=str(peer) if peer else None, reason="the server is shutting down",
                         what_to_do="the daemon starts the shard again; it is served once a server listens")
            writer.close()
            return
        driver = self.parts.driver(reader, writer, conn_id, redrive, source=source)
        task = asyncio.current_task()
        assert task is not None
        self.drivers[task] = driver
        wlog.debug("connected", peer=str(peer) if peer else None)
        try:
            await driver.run()
        except asyncio.CancelledError:
            if not driver.stopping:
                raise
        except Exception:
            wlog.error("driver_crashed", shard_id=driver.conn.shard_id, exc_info=True)
        finally:
            del self.drivers[task]
            writer.close()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _name(aw: Any) -> str:
    if isinstance(aw, asyncio.Task):
        return aw.get_name()
    return getattr(aw, "__qualname__", type(aw).__name__)  # a coroutine: Coordinator.stop


def run(server: Server) -> None:
    """Serve with uvloop until a signal arrives (the CLI's entry, which builds the
    server and tunes the process first); ServerCrashed if a task the server owns died."""
    import uvloop

    uvloop.run(server.serve())
