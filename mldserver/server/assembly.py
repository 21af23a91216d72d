"""What a server is made of, built from its settings in one place: every part gets
what it needs through its constructor, and nothing is started or bound here::

    parts = build(settings)                 # a pool of handler processes (workers = 2)
    parts.pool, parts.coordinator           # HandlerPool, Coordinator (with a sink) or None
    driver = parts.driver(reader, writer, conn_id=7)   # one shard connection's ShardDriver

    parts = build(settings, factory=Orders, clock=fake_clock, sink=sink)   # a test's: in this loop

The server (``server.py``) runs the lifecycle (start, serve, ordered shutdown) over
these; the admin endpoint and the metrics collector read the server. Which parts
exist follows the settings:

- ``pool``: handler processes when ``workers`` > 0 and no ``factory`` object is given
  (a process can only import ``settings.handler``); else ``factory`` (or the imported
  ``settings.handler``) runs in this loop;
- ``spark``: one Spark process for ``--pipeline``, ``parquet:``, ``iceberg:`` or SQL
  bindings (``config.uses_spark``);
- ``coordinator``: with a sink (``--sink`` or ``sink=``), else rows go nowhere;
- ``timers``: always (fired in the pool's processes, or in this loop);
- ``slots``: the in-flight batches all shards share (``max_batches_in_flight``).

A setting that cannot work (Spark or Iceberg not installed, a read-write binding to
the stream's own table, a handler that does not import or does not check) is a
ConfigError here, before anything starts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .preflight import extras
from ..base.backoff import CallPolicy
from ..api.bindings import Bindings
from ..api.bindings import check as check_bindings
from ..base.config import Settings, SinkSpec, state_path, uses_spark
from ..api.context import Context
from ..base.deadletters import DeadLetters
from ..api.checks import check_handler, emits
from ..api.loading import handler_factory, load_handler
from ..base.logs import get_logger
from .metrics import Metrics
from ..shard.pausing import Pause
from ..pool import HandlerPool, ProcessCalls
from ..pool.firing import PoolFiring
from ..shard import CoordinatorLink, NoSink, RedriveLink, ShardDriver
from ..shard.calls import Calls, HandlerCalls
from ..shard.slots import Slots
from ..spark.process import SparkProcess
from ..timers.scheduler import Scheduler, scheduler_for
from ..timers.stats import TimerCollector

if TYPE_CHECKING:
    from ..coordinator import Coordinator


@dataclass(frozen=True)
class Parts:
    settings: Settings
    factory: Callable[[Any], Any] | None  # handlers in this loop (None: in the pool's processes)
    pool: HandlerPool | None
    context: Context  # what handlers in this loop get (each handler process builds its own)
    dead_letters: DeadLetters
    timers: Scheduler
    spark: SparkProcess | None
    coordinator: Coordinator | None
    metrics: Metrics
    pause: Pause  # POST /pause: the gate every shard's next action waits at
    slots: Slots | None
    calls: CallPolicy  # every shard's handler calls: retries, time-out, backoff
    emits: bool  # the handler in this loop calls batch.emit (the pool's processes say so once started)

    def driver(self, reader: Any, writer: asyncio.StreamWriter, conn_id: int,
               redrive: DeadLetters | None = None, *, source: bool = False) -> ShardDriver:
        """The driver of one accepted connection (its shard known at ``initialize``).
        ``redrive``: the connection is a redrive's (mldserver.server.redrive), whose
        records that fail again go there, not to the dead letters; ``source``: a shard a
        ``--source`` reader feeds, checkpointed at each commit."""
        log = get_logger("mldserver.shard").bind(conn=conn_id)
        if self.coordinator is None:
            downstream: Any = NoSink()
        elif redrive is not None:
            downstream = RedriveLink(self.coordinator)
        else:
            downstream = CoordinatorLink(self.coordinator, interval=self.settings.checkpoint_interval,
                                         on_commit=source)
        return ShardDriver(
            reader,
            writer,
            calls=self._calls(log),
            settings=self.settings,
            dead_letters=self.dead_letters if redrive is None else redrive,
            log=log,
            slots=self.slots,
            downstream=downstream,
            metrics=self.metrics,
            pause=self.pause,
            conn_id=conn_id,
        )

    def _calls(self, log: Any) -> Calls:
        """A shard's handler calls: in a handler process of the pool, or in this loop."""
        if self.pool is not None:
            return ProcessCalls(self.pool, self.context, **self.calls._asdict(), log=log)
        assert self.factory is not None
        return HandlerCalls(self.factory, self.context, **self.calls._asdict(), log=log)


def build(settings: Settings, factory: Callable[[Any], Any] | None = None, *,
          clock: Callable[[], float] | None = None, sink: Any = None) -> Parts:
    """The parts of a server for ``settings``. ``factory`` runs handlers in this loop;
    ``clock`` (epoch ms) is the coordinator's; ``sink`` replaces the one
    ``settings.sink`` names (a test's, or an embedder's own)."""
    extras(settings)  # Spark or Iceberg asked for, and not installed: the extra to install
    check_bindings(settings)  # a read-write binding to the stream's own table: refused here
    pool = None
    if factory is None and settings.workers > 0:
        pool = HandlerPool(settings)  # imports the handler in its processes, never here
    else:
        factory = handler_factory(factory) if factory is not None else load_handler(settings.handler)
    metrics = Metrics()
    dead_letters = DeadLetters(state_path(settings, "dead-letters"), metrics=metrics)
    firing = None if pool is None else PoolFiring(pool, settings.execution_timeout, get_logger("mldserver.timers"))
    timers, local_timers = scheduler_for(settings, firing=firing, dead_letters=dead_letters)
    if pool is not None:
        pool.services.update(timers.services())  # handler processes ask for timers as services
    metrics.registry.register(TimerCollector(timers))
    spark = None
    if uses_spark(settings):
        where = SinkSpec.parse(settings.sink).directory if (settings.sink or "").startswith("parquet:") else None
        spark = SparkProcess(settings, sink_dir=where)
    context = Context(settings, spark=spark, timers=local_timers, bindings=Bindings(settings))
    coordinator = None
    if settings.sink or sink is not None:
        from ..coordinator import Coordinator  # (only with a sink: rows go nowhere without one)

        if sink is None:
            from ..sinks import open_sink

            sink = open_sink(settings, spark=spark, dead_letters=dead_letters)
        coordinator = Coordinator(settings, sink, metrics=metrics, dead_letters=dead_letters, **({"clock": clock} if clock else {}))
    # What the handler means, checked before any record (each handler process checks its own).
    in_loop_emits = factory is not None and emits(type(check_handler(factory, context, settings.handler)))
    n = settings.batches_in_flight
    return Parts(
        settings=settings, factory=factory, pool=pool, context=context, dead_letters=dead_letters, timers=timers,
        spark=spark, coordinator=coordinator, metrics=metrics, pause=Pause(), slots=Slots(n) if n > 0 else None,
        calls=CallPolicy.from_settings(settings), emits=in_loop_emits,
    )
