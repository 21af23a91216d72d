"""The server: listeners, one worker per connection, and an ordered shutdown.

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
              (``mldserver run``: the KCL daemon, mldserver.daemon)
    admin     with ``Settings.admin`` (``mldserver serve``: 127.0.0.1:7071 unless
              ``--admin off``), the admin endpoint (mldserver.admin) is bound first,
              so /readyz answers 503 while Spark starts; it reads the server's
              metrics (mldserver.metrics), ``unhealthy()``, ``not_ready()``, and
              calls ``pause()`` / ``resume()`` (the gate in mldserver.pausing)
    timers    once the handler processes are up, the timer scheduler (mldserver.timers)
              starts: timers that fell due while the server was down fire now; it is
              stopped after the connections, before the handler processes
    serve     each accepted connection gets a Worker task, owned by the server; the
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

A worker that crashes is logged with its shard and closed; the others go on. A task
the server owns that ends (the committer meeting an error it does not retry, a Spark
process that cannot be restarted) is logged as ``task_crashed`` with its name, error
and traceback; the server shuts down in the same order and ``serve()`` raises
ServerCrashed, which the CLI turns into exit code 1 so that systemd restarts it::

    {"event":"task_crashed","task":"coordinator-committer","error":"TypeError: ...",
     "traceback":"Traceback ...","what_to_do":"..."}
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import pieces, preflight
from .config import Settings, SinkSpec, state_path, uses_spark
from .coordinator import Coordinator
from .context import Context
from .deadletters import DeadLetters
from .errors import ConfigError, ServerCrashed
from .importer import import_from_string
from .backoff import Backoff
from .logs import errors_only, get_logger
from .metrics import Metrics
from .pausing import Pause
from .pool import HandlerPool, ProcessCalls
from .spark.process import SparkError, SparkProcess
from . import bindings as bindings_api
from .bindings import Bindings
from .bindings import check as bindings_check
from .timers import api as timers_api
from .timers.scheduler import scheduler_for
from .timers.stats import TimerCollector
from .shard import CoordinatorLink, NoSink, Worker
from .handler_checks import check_handler, emits
from .shard.calls import reap_abandoned
from .shard.worker import Slots

if TYPE_CHECKING:
    from .admin import Admin
    from .sinks import Sink

log = get_logger("mldserver.server")

# StreamReader pauses reading at twice this: a shard waiting for a slot keeps the rest
# of its batch in the kernel, not in our memory. Lines are reassembled by the core.
STREAM_LIMIT = 1 << 18
# SIGTERM and SIGINT stop in order; SIGHUP reloads the handler (handler processes).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Past shutdown_timeout: how long workers get to answer once their calls are cancelled.
ABORT_WAIT_S = 5.0


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
        preflight.extras(settings)  # Spark or Iceberg asked for, and not installed: the extra to install
        self.pool: HandlerPool | None = None
        if factory is None and settings.workers > 0:
            self.pool = HandlerPool(settings)  # imports the handler in its processes, never here
            self.factory: Callable[[Any], Any] | None = None
        else:
            self.factory = factory or import_from_string(settings.handler, "handler")
        self._reloads: set[asyncio.Task[Any]] = set()
        self.context = Context(settings)
        bindings_check(settings)  # a read-write binding to the stream's own table: refused here
        self.context.bindings = Bindings(settings)  # its client opened on first use
        self.dead_letters = DeadLetters(state_path(settings, "dead-letters"))
        # Durable timers: fired through the pool (or in this loop); handler processes ask for them as services.
        self.timers, self.context.timers = scheduler_for(settings, pool=self.pool, dead_letters=self.dead_letters)
        if self.pool is not None:
            self.pool.services.update(self.timers.services())
        # What the handler means, checked before any record (each handler process checks its own).
        self._emits = self.factory is not None and emits(type(check_handler(self.factory, self.context,
                                                                             settings.handler)))
        self.workers: dict[asyncio.Task[None], Worker] = {}
        self._ids = itertools.count(1)
        self._servers: list[asyncio.base_events.Server] = []
        self._listeners: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self.crashed: BaseException | None = None  # what ended a task the server owns
        self._shut = False  # shutdown() ran
        n = settings.max_batches_in_flight
        self.slots = Slots(n) if n > 0 else None
        self.address: tuple[str, int] | str | None = None
        self.listening = False
        self._unix_socket: tuple[str, int, int] | None = None  # (path, device, inode) of the one we bound
        self.spark: SparkProcess | None = None
        if uses_spark(settings):
            where = SinkSpec.parse(settings.sink).directory if (settings.sink or "").startswith("parquet:") else None
            self.spark = self.context.spark = SparkProcess(settings, sink_dir=where)
        self.coordinator: Coordinator | None = None
        if settings.sink or sink is not None:
            if sink is None:
                from .sinks import open_sink

                sink = open_sink(settings, spark=self.spark, dead_letters=self.dead_letters)
            self.coordinator = Coordinator(settings, sink, **({"clock": clock} if clock else {}))
        self.metrics = Metrics()
        self.metrics.watch(self)
        self.dead_letters.metrics = self.metrics
        self.metrics.registry.register(TimerCollector(self.timers))
        if self.coordinator is not None:
            self.coordinator.metrics = self.metrics
        self.loop_lag = LoopLag(observe=self.metrics.loop_lag.observe)
        self.pause_gate = Pause()
        self.admin: Admin | None = None
        if settings.admin:  # parsed here: a typo stops us early
            from .admin import Admin  # aiohttp (about 20 MiB) only where the endpoint is on

            self.admin = Admin(self, settings.admin)
        # Started once listening, stopped first, watched as owned tasks (mldserver run: the daemon).
        self.companions: list[Any] = []
        self._refusing = False  # from the start of shutdown, once the companions are stopped

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
        await asyncio.to_thread(preflight.writable_state_dir, Path(s.state_dir))
        if self.spark is not None and not s.spark_remote:  # (a Spark Connect client needs no Java here)
            await asyncio.to_thread(preflight.java, "Spark (--pipeline, --sink parquet: or iceberg:)")
        self.loop_lag.start()
        # Bound first, served last: a port in use is said before anything starts.
        unix = await self._listen_unix(s.unix) if s.unix else None
        if unix is not None:
            self._servers.append(unix)  # closed by shutdown() should anything after fail
        tcp = await self._listen_tcp(s.host, s.tcp_port) if s.tcp_port is not None else None
        if tcp is not None:
            self._servers.append(tcp)
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
        bindings_api.current.set(self.context.bindings)  # bindings.table in timer callbacks (workers = 0)
        for srv in self._servers:
            await srv.start_serving()  # listening when start() returns
        if unix is not None:
            self._listeners.append(asyncio.create_task(unix.serve_forever(), name="listener-unix"))
            self.address = s.unix
            log.info("listening", unix=s.unix, handler=s.handler)
        if tcp is not None:
            self._listeners.append(asyncio.create_task(tcp.serve_forever(), name="listener-tcp"))
            host, port = tcp.sockets[0].getsockname()[:2]
            if unix is None:
                self.address = (host, port)
            exposed = sorted({a for a in (sock.getsockname()[0] for sock in tcp.sockets) if not _loopback(a)})
            if exposed:
                log.warning(
                    "listening_beyond_loopback",
                    host=s.host,
                    addresses=exposed,
                    what_to_do="the protocol has no authentication: whoever reaches this port can pose as the "
                    "daemon; bind 127.0.0.1 (the default) or firewall the port",
                )
            log.info("listening", host=host, port=port, handler=s.handler, pid=os.getpid(),
                     workers=None if self.pool is None else [p.pid for p in self.pool.processes])
        self.listening = True

    async def _listen_unix(self, path: str) -> asyncio.base_events.Server:
        await asyncio.to_thread(preflight.free_unix_path, Path(path))
        try:
            srv = await pieces.serve_unix(self._accept, path, STREAM_LIMIT, start_serving=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--unix {path}: cannot listen there ({_reason(exc)}): choose another path") from None
        st = os.stat(path)
        self._unix_socket = (path, st.st_dev, st.st_ino)
        return srv

    async def _listen_tcp(self, host: str, port: int) -> asyncio.base_events.Server:
        try:
            return await pieces.serve_tcp(self._accept, host, port, STREAM_LIMIT, start_serving=False)
        except socket.gaierror as exc:
            raise ConfigError(
                f"--host {host}: cannot resolve it ({_reason(exc)}): give an IP address or a name this machine "
                f"resolves (default 127.0.0.1)"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                what_to_do = "stop what listens there, or choose another --port (0 picks a free one)"
                raise ConfigError(f"--port {port}: {host}:{port} is already in use: {what_to_do}") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"--host {host}: not an address of this machine: bind one of its addresses, or 127.0.0.1"
                ) from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise ConfigError(
                    f"--port {port}: not allowed to listen on {host}:{port} ({_reason(exc)}): ports below 1024 "
                    f"need privileges; choose a higher --port"
                ) from None
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({_reason(exc)})") from None

    def _remove_unix_socket(self) -> None:
        """Unlink the socket this server bound, only if it is still that socket (not
        a file someone put there since)."""
        if self._unix_socket is None:
            return
        path, dev, ino = self._unix_socket
        self._unix_socket = None
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == (dev, ino):
                os.unlink(path)
        except FileNotFoundError:
            pass

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
        if self.crashed is not None:
            raise ServerCrashed(f"{_describe(self.crashed)} (logged as task_crashed)") from self.crashed

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """What the server owns besides its connections: listeners, the coordinator's
        committer and tick, the Spark supervisor, the handler pool's supervisor, the
        timer scheduler. None of them ends by itself."""
        tasks = list(self._listeners)
        if self.coordinator is not None:
            tasks += self.coordinator.tasks
        if self.spark is not None and self.spark.task is not None:
            tasks.append(self.spark.task)
        if self.pool is not None and self.pool.task is not None:
            tasks.append(self.pool.task)
        if self.timers.task is not None:
            tasks.append(self.timers.task)
        tasks += [c.task for c in self.companions if c.task is not None]
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
            log.info("paused", shards=len(self.workers))
        return changed

    def resume(self) -> bool:
        changed = self.pause_gate.resume()
        if changed:
            log.info("resumed", shards=len(self.workers))
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
        """What /readyz waits for (listening; Spark up; the commit log read), or None."""
        if self.spark is not None and self.spark.state != "up":
            return f"the Spark process is {self.spark.state}"
        if not self.listening:
            return "not listening yet" if not self._stop.is_set() else "shutting down"
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
        self._refusing = True
        for srv in self._servers:
            srv.close()
        self.listening = False
        # Every worker is asked to finish: one whose action has arrived (even partly,
        # even waiting for a slot) answers it; an idle one closes at once.
        busy = 0
        for worker in list(self.workers.values()):
            busy += worker.busy
            worker.stop()
        log.info("shutting_down", connections=len(self.workers), busy=busy)
        if self.workers:
            _, pending = await asyncio.wait(list(self.workers), timeout=self.settings.shutdown_timeout)
            if pending:
                # Past shutdown_timeout: their handler calls are cancelled and their
                # actions answered as failed; then whatever is left is cancelled.
                log.warning("shutdown_timeout", cancelled=len(pending), timeout_s=self.settings.shutdown_timeout)
                for task in pending:
                    worker = self.workers.get(task)
                    if worker is not None:
                        worker.abort()
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
        for task in self._listeners:
            task.cancel()
        await self._stopped(*self._listeners)
        for srv in self._servers:
            await srv.wait_closed()
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
        self._remove_unix_socket()
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

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_id = next(self._ids)
        peer = writer.get_extra_info("peername")
        wlog = log.bind(conn=conn_id)
        if self._refusing:
            writer.close()
            return
        worker = Worker(
            reader,
            writer,
            factory=self.factory,
            context=self.context,
            settings=self.settings,
            dead_letters=self.dead_letters,
            log=get_logger("mldserver.worker").bind(conn=conn_id),
            slots=self.slots,
            downstream=NoSink() if self.coordinator is None
            else CoordinatorLink(self.coordinator, interval=self.settings.checkpoint_interval),
            metrics=self.metrics,
            pause=self.pause_gate,
            calls=None if self.pool is None else self._process_calls,
        )
        worker.conn_id = conn_id
        task = asyncio.current_task()
        assert task is not None
        self.workers[task] = worker
        wlog.debug("connected", peer=str(peer) if peer else None)
        try:
            await worker.run()
        except asyncio.CancelledError:
            if not worker.stopping:
                raise
        except Exception:
            wlog.error("worker_crashed", shard_id=worker.conn.shard_id, exc_info=True)
        finally:
            del self.workers[task]
            writer.close()


    def _process_calls(self, wlog: Any) -> ProcessCalls:
        s = self.settings
        assert self.pool is not None
        return ProcessCalls(
            self.pool,
            self.context,
            retries=s.handler_retries,
            timeout=s.execution_timeout,
            backoff=Backoff(first=s.handler_backoff, cap=max(s.handler_backoff, 5.0)),
            log=wlog,
        )


class LoopLag:
    """How late the event loop wakes a task that sleeps 10 ms: its worst is the
    longest the loop was blocked (logged at shutdown, read by the benchmark)."""

    INTERVAL = 0.01

    def __init__(self, observe: Callable[[float], None] | None = None) -> None:
        self.worst = 0.0
        self.observe = observe  # each sample (the metrics' histogram)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.INTERVAL)
            lag = max(loop.time() - before - self.INTERVAL, 0.0)
            self.worst = max(self.worst, lag)
            if self.observe is not None:
                self.observe(lag)


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address.partition("%")[0]).is_loopback


def _reason(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


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
