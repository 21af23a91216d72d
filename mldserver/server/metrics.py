"""The server's metrics: one Prometheus registry owned by the server (never the
global default), the instruments the server's parts record into, and a collector that
reads the rest (per-shard counts, watermarks, buffers, Spark) when ``/metrics`` is
scraped, so the hot path pays one dict update a batch and nothing a record::

    metrics = Metrics()
    metrics.batch("shardId-000000000001", records=500, millis_behind_latest=0)
    metrics.handler_call("process_records", "timeout", 60.0)
    metrics.dead_letter("handler failed", 500)   # kind="handler_failed"
    metrics.handler_stats("process_records", {"on_update_success": 999, "on_update_failure": 3,
                                              "timeout_count": 1})
    metrics.watch(server)                      # the collector reads the server at scrape
    generate_latest(metrics.registry)
    # mldserver_records_total{shard_id="shardId-000000000001"} 500.0
    # mldserver_handler_calls_total{callback="process_records",outcome="timeout"} 1.0
    # mldserver_callbacks_total{callback="on_update",outcome="success"} 999.0
    # mldserver_handler_timeouts_total{callback="process_records"} 1.0

Handler calls are recorded where the shard driver calls its handler-call seam (one call
of ``calls.call``, retries included: ``metrics.call``), so they count the same whether
the handler runs in the server's loop or in a handler process. What a handler counts inside its calls
(a ``ChangeHandler``'s ``on_update_success``, ...: Couchbase Eventing's execution
statistics) comes back with each call (a handler process sends it in its ``done``
frame) and is recorded there too, with the attempts that ran past
``execution_timeout`` (``timeout_count``). Names (and the Couchbase Eventing
statistics they correspond to) are in docs/reference/metrics.md, generated from here, and
docs/operations.md, "Metrics".
"""

from __future__ import annotations

import asyncio

import math
import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Handler calls: from a 1 ms batch to execution_timeout's default (60 s).
CALL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, math.inf)
COMMIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, math.inf)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, math.inf)

SUCCESS, FAILURE, TIMEOUT = "success", "failure", "timeout"


def call_outcome(result: str, error: str | None) -> str:
    """One handler call's outcome label from its ``Outcome`` (either seam's)."""
    if result != "failed":
        return SUCCESS if result == "ok" else FAILURE  # checkpoint_failed: the handler raised
    if error and (error.startswith("timed out") or error.startswith("abandoned")):
        return TIMEOUT
    return FAILURE


def kind_of(reason: str) -> str:
    """A dead letter's reason as a label value: ``handler failed`` -> ``handler_failed``."""
    return "_".join(reason.lower().replace("-", " ").split()) or "unknown"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.handler_calls = Counter(
            "mldserver_handler_calls", "Handler calls by callback and outcome (success, failure, timeout); "
            "one call includes its retries", ["callback", "outcome"], registry=r)
        self.handler_call_seconds = Histogram(
            "mldserver_handler_call_duration_seconds", "Handler call duration, retries included",
            ["callback"], buckets=CALL_BUCKETS, registry=r)
        self.callbacks = Counter(
            "mldserver_callbacks", "Calls of a handler's per-record callbacks (on_update, on_delete) by outcome "
            "(success, failure); every attempt counts", ["callback", "outcome"], registry=r)
        self.handler_timeouts = Counter(
            "mldserver_handler_timeouts", "Handler call attempts that ran past execution_timeout (each retry "
            "counts)", ["callback"], registry=r)
        self.rows_discarded = Counter(
            "mldserver_rows_discarded", "Rows handlers emitted with no sink to keep them (--sink)", registry=r)
        self.dead_letters = Counter(
            "mldserver_dead_letters", "Entries written to the dead letters, by kind", ["kind"], registry=r)
        self.checkpoints = Counter(
            "mldserver_checkpoints", "Checkpoints sent to the daemon by outcome (stored, retry, failed)",
            ["outcome"], registry=r)
        self.window_commit_seconds = Histogram(
            "mldserver_window_commit_duration_seconds", "Sealing one closed window and committing it to the sink",
            buckets=COMMIT_BUCKETS, registry=r)
        self.window_commit_failures = Counter(
            "mldserver_window_commit_failures", "Window commits the sink failed with a retriable error (each "
            "attempt counts; the window is retried, its rows stay buffered)", registry=r)
        self.loop_lag = Histogram(
            "mldserver_event_loop_lag_seconds", "How late the event loop woke a 50 ms sleep",
            buckets=LAG_BUCKETS, registry=r)
        # Per shard, while its connection lasts (``forget``: a server that serves many
        # shards over time must not keep a series for each); read at scrape.
        self.records: dict[str, int] = {}
        self.batches: dict[str, int] = {}
        self._collector: _ServerCollector | None = None

    # -- what the server's parts record --------------------------------------------

    def batch(self, shard_id: str, records: int) -> None:
        self.records[shard_id] = self.records.get(shard_id, 0) + records
        self.batches[shard_id] = self.batches.get(shard_id, 0) + 1

    def forget(self, shard_id: str) -> None:
        """The shard's connection ended: its series go (a counter that starts again
        at 0 on the next connection is a reset, which ``rate()`` expects)."""
        self.records.pop(shard_id, None)
        self.batches.pop(shard_id, None)

    def call(self, callback: str, result: str, error: str | None, seconds: float, stats: dict[str, int]) -> int:
        """One call of the handler-call seam (``Outcome.result``, ``.error``, retries
        included) and what the handler counted in it (``Calls.take_stats``); the rows
        it emitted that no sink keeps."""
        self.handler_call(callback, call_outcome(result, error), seconds)
        if stats:
            self.handler_stats(callback, stats)
        return stats.get("rows_discarded", 0)

    def handler_call(self, callback: str, outcome: str, seconds: float) -> None:
        self.handler_calls.labels(callback, outcome).inc()
        self.handler_call_seconds.labels(callback).observe(seconds)

    def handler_stats(self, callback: str, stats: dict[str, int]) -> None:
        """What one call of ``callback`` counted: ``<callback>_<outcome>`` names
        (``on_update_success``, ``on_delete_failure``; timers may add theirs the same way)
        and ``timeout_count``; a name of another form is ignored."""
        for name, n in stats.items():
            if name == "timeout_count":
                self.handler_timeouts.labels(callback).inc(n)
                continue
            if name == "rows_discarded":
                self.rows_discarded.inc(n)
                continue
            inner, _, outcome = name.rpartition("_")
            if inner and outcome in (SUCCESS, FAILURE) and type(n) is int and n > 0:
                self.callbacks.labels(inner, outcome).inc(n)

    def dead_letter(self, reason: str, entries: int = 1) -> None:
        self.dead_letters.labels(kind_of(reason)).inc(entries)

    def checkpoint(self, outcome: str) -> None:
        self.checkpoints.labels(outcome).inc()

    def window_committed(self, seconds: float) -> None:
        self.window_commit_seconds.observe(seconds)

    def window_commit_failed(self) -> None:
        self.window_commit_failures.inc()

    # -- the rest, read from the server when scraped --------------------------------

    def watch(self, server: Any) -> None:
        if self._collector is None:
            self._collector = _ServerCollector(self, server)
            self.registry.register(self._collector)


class _ServerCollector(Collector):
    def __init__(self, metrics: Metrics, server: Any) -> None:
        self.metrics = metrics
        self.server = server

    def collect(self) -> Iterator[Metric]:
        m, server = self.metrics, self.server
        records = CounterMetricFamily("mldserver_records", "Records delivered to the handler, per shard",
                                      labels=["shard_id"])
        batches = CounterMetricFamily("mldserver_batches", "processRecords batches, per shard", labels=["shard_id"])
        for shard_id, n in list(m.records.items()):
            records.add_metric([shard_id], n)
        for shard_id, n in list(m.batches.items()):
            batches.add_metric([shard_id], n)
        yield records
        yield batches
        behind = GaugeMetricFamily("mldserver_millis_behind_latest", "The daemon's millisBehindLatest of the "
                                   "shard's last batch (connected shards)", labels=["shard_id"])
        shards = 0
        for driver in list(server.drivers.values()):
            shard = driver.status()
            if shard.shard_id is None:
                continue
            shards += 1
            if shard.millis_behind_latest is not None:
                behind.add_metric([shard.shard_id], shard.millis_behind_latest)
        yield behind
        lag = GaugeMetricFamily("mldserver_source_millis_behind", "How far behind its head the last page read of a "
                                "--source shard was (Kinesis: MillisBehindLatest; DynamoDB: the age of the last "
                                "change read)", labels=["source", "shard_id"])
        for reader in list(server.sources):
            for shard_id, ms in reader.lags().items():
                if ms is not None:
                    lag.add_metric([reader.spec.text, shard_id], ms)
        yield lag
        yield GaugeMetricFamily("mldserver_connected_shards", "Shard connections that have initialized",
                                value=shards)
        yield GaugeMetricFamily("mldserver_paused", "1 while paused (POST /pause)", value=int(server.paused))
        yield GaugeMetricFamily("mldserver_event_loop_lag_max_seconds", "The longest the loop was blocked "
                                "since start", value=server.loop_lag.worst)
        coordinator = server.coordinator
        if coordinator is not None:
            snapshot = coordinator.status()
            mark = snapshot.global_watermark
            lag = (time.time_ns() / 1e6 - mark) / 1000 if math.isfinite(mark) else math.nan
            yield GaugeMetricFamily("mldserver_watermark_lag_seconds", "The wall clock minus the global "
                                    "watermark (NaN while no shard holds one)", value=lag)
            yield GaugeMetricFamily("mldserver_buffered_rows", "Rows buffered, not yet committed",
                                    value=snapshot.buffered_rows)
            yield GaugeMetricFamily("mldserver_buffered_bytes", "Bytes of rows buffered, not yet committed",
                                    value=snapshot.buffered_bytes)
            yield GaugeMetricFamily("mldserver_open_windows", "Windows holding rows, not yet committed",
                                    value=snapshot.open_windows)
            yield CounterMetricFamily("mldserver_windows_committed", "Windows committed to the sink",
                                      value=snapshot.windows_committed)
            yield CounterMetricFamily("mldserver_rows_committed", "Rows committed to the sink",
                                      value=snapshot.rows_committed)
            yield CounterMetricFamily("mldserver_late_rows", "Rows older than a window already closed (they go "
                                      "to the next commit, flagged late)", value=snapshot.late_rows)
            failing = snapshot.sink_failing
            yield GaugeMetricFamily("mldserver_sink_failing_seconds", "How long the sink has failed the window in "
                                    "front (0: it commits)", value=0 if failing is None else time.time() - failing.since)
        spark = server.spark
        if spark is not None:
            yield CounterMetricFamily("mldserver_spark_process_restarts", "Spark processes started again",
                                      value=spark.restarts)
        pool = server.pool  # none in the server's loop (workers = 0): nothing to restart
        yield CounterMetricFamily("mldserver_handler_process_restarts", "Handler processes started again after "
                                  "a crash, a time-out or a memory limit",
                                  value=0 if pool is None else pool.deaths + pool.replaced)


class LoopLag:
    """How late the event loop wakes a task that sleeps 50 ms: its worst is the
    longest the loop was blocked (logged at shutdown, read by the benchmark).

    Every wake costs the process some 0.1 to 0.2 ms of CPU on a virtual machine (the
    timer, the loop's turn, the histogram): at 10 ms that was 1.7% of a core for an
    idle server, most of what it spent idle; at 50 ms it is a fifth of that. The
    price: a block is seen as up to 50 ms shorter than it was, and one under 50 ms may
    not be seen at all (a blocked loop that matters, hundreds of ms, always is)."""

    INTERVAL = 0.05

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
