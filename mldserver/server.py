"""The server: listeners, one worker per connection, and an ordered shutdown.

``mldserver serve --handler pkg.mod:Attr --port 7070`` runs ``Server(settings).serve()``
on uvloop. Lifecycle (uvicorn's shape)::

    startup   load the handler factory (a ConfigError stops us before binding),
              with a sink: start the coordinator (replaying the spool),
              bind TCP (loopback by default; the protocol has no authentication)
              and/or a unix socket, log one ``listening`` event with the address
    serve     each accepted connection gets a Worker task, owned by the server
    shutdown  on SIGTERM/SIGINT: stop accepting; idle connections are closed; busy
              ones finish their action (status sent) within ``shutdown_timeout``;
              then whatever is left is cancelled, the coordinator stopped, and the
              signal handlers restored

A worker that crashes is logged with its shard and closed; the others go on.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import signal
import sys
from typing import Any, Callable

from .config import Settings, state_path, uses_spark
from .coordinator import Coordinator
from .context import Context
from .deadletters import DeadLetters
from .errors import ConfigError
from .importer import import_from_string
from .logs import get_logger
from .spark.process import SparkError, SparkProcess
from .shard import CoordinatorLink, NoSink, Worker

log = get_logger("mldserver.server")

# StreamReader pauses reading at twice this: a shard waiting for a slot keeps the rest
# of its batch in the kernel, not in our memory. Lines are reassembled by the core.
STREAM_LIMIT = 1 << 18


class Server:
    def __init__(self, settings: Settings, factory: Callable[[Any], Any] | None = None) -> None:
        self.settings = settings
        self.factory = factory or import_from_string(settings.handler, "handler")
        self.context = Context(settings)
        self.dead_letters = DeadLetters(state_path(settings, "dead-letters"))
        self.workers: dict[asyncio.Task[None], Worker] = {}
        self._ids = itertools.count(1)
        self._servers: list[asyncio.base_events.Server] = []
        self._stop = asyncio.Event()
        n = settings.max_batches_in_flight
        self.slots = asyncio.Semaphore(n) if n > 0 else None
        self.address: tuple[str, int] | str | None = None
        self.spark: SparkProcess | None = None
        if uses_spark(settings):
            from .sinks import sink_dir

            where = sink_dir(settings.sink)[1] if (settings.sink or "").startswith("parquet:") else None
            self.spark = self.context.spark = SparkProcess(settings, sink_dir=where)
        self.coordinator: Coordinator | None = None
        if settings.sink:
            from .sinks import open_sink

            sink = open_sink(settings, spark=self.spark, dead_letters=self.dead_letters)
            self.coordinator = Coordinator(settings, sink)
        self.loop_lag = LoopLag()

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self.loop_lag.start()
        if self.spark is not None:
            try:
                await self.spark.start()  # the session is up (and the sink locked) before we bind
            except SparkError as exc:
                raise ConfigError(str(exc)) from None
        if self.coordinator is not None:
            await self.coordinator.start()  # commit log read, spool replayed, before any shard connects
        if s.unix:
            if os.path.exists(s.unix):
                os.unlink(s.unix)
            srv = await asyncio.start_unix_server(self._accept, path=s.unix, limit=STREAM_LIMIT)
            self._servers.append(srv)
            self.address = s.unix
            log.info("listening", unix=s.unix, handler=s.handler)
        if s.tcp_port is not None:
            srv = await asyncio.start_server(self._accept, host=s.host, port=s.tcp_port, limit=STREAM_LIMIT)
            self._servers.append(srv)
            host, port = srv.sockets[0].getsockname()[:2]
            if not s.unix:
                self.address = (host, port)
            log.info("listening", host=host, port=port, handler=s.handler, pid=os.getpid())

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT (or ``stop()``), then shut down in order."""
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in previous:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self.start()
            await self._stop.wait()
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)
            await self.shutdown()

    def _on_signal(self, sig: int) -> None:
        log.info("shutdown_requested", signal=signal.Signals(sig).name)
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    async def shutdown(self) -> None:
        for srv in self._servers:
            srv.close()
        busy = 0
        for task, worker in self.workers.items():
            worker.stopping = True
            if worker.busy:
                busy += 1
            else:
                task.cancel()
        log.info("shutting_down", connections=len(self.workers), busy=busy)
        if self.workers:
            done, pending = await asyncio.wait(list(self.workers), timeout=self.settings.shutdown_timeout)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("shutdown_timeout", cancelled=len(pending), timeout_s=self.settings.shutdown_timeout)
                await asyncio.wait(pending)
        for srv in self._servers:
            await srv.wait_closed()
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self.spark is not None:
            await self.spark.stop()
        await self.loop_lag.stop()
        if self.settings.unix and os.path.exists(self.settings.unix):
            os.unlink(self.settings.unix)
        log.info("stopped", loop_lag_max_ms=round(self.loop_lag.worst * 1000, 1))

    # -- connections -----------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_id = next(self._ids)
        peer = writer.get_extra_info("peername")
        wlog = log.bind(conn=conn_id)
        if self._stop.is_set():
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
        )
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


class LoopLag:
    """How late the event loop wakes a task that sleeps 10 ms: its worst is the
    longest the loop was blocked (logged at shutdown, read by the benchmark)."""

    INTERVAL = 0.01

    def __init__(self) -> None:
        self.worst = 0.0
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
            self.worst = max(self.worst, loop.time() - before - self.INTERVAL)


def tune_gc() -> None:
    """Fewer, larger young-generation collections.

    A 10,000-record batch decodes into some 60,000 objects; with CPython's default
    gen0 threshold (700) that is ~90 collections per batch, each walking the young
    objects: about a third of the decode time. Long-lived start-up objects are
    frozen out of collection altogether.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def run(settings: Settings) -> None:
    """Serve with uvloop until a signal arrives (the CLI's entry)."""
    import uvloop

    server = Server(settings)
    tune_gc()
    if server.coordinator is not None:
        # Sink commits run in a thread that needs the GIL between its system calls;
        # with the loop decoding batches, the default 5 ms hand-over made each commit
        # wait some 80 ms in all. 0.5 ms keeps commits ahead of the batches.
        sys.setswitchinterval(0.0005)
    uvloop.run(server.serve())
