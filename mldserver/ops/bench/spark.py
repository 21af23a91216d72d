"""``mldserver bench --part spark``: the Spark pipeline end to end against the bare
handoff, in one run.

- ``bare handoff``  no server: a window's rows, already a pyarrow table, written to a
                    parquet file, read by Spark with an explicit schema, and written
                    out as parquet (the identity pipeline's work), one window after
                    another in this process's own embedded Spark session;
- ``end to end``    ``mldserver serve`` with the passthrough handler and
                    ``--sink parquet:DIR`` (identity pipeline, embedded Spark), fed
                    over direct TCP by the fake daemon in batches of 10,000 records x
                    100 B; ten batches make one 100,000-row window. The run ends
                    when the last window's commit-log entry is written.

Both are timed warm: the bare hand-off writes a file before its clock starts, and
end to end the first window is fed and committed before the clock starts (it is
reported on its own line). Both warm Spark's JVM first, as the Spark process does as it
starts (``spark/warmup.py``; end to end, the server's warm-up is waited for, as a server
with the default 60 s windows has a minute before its first window closes). Both move the
same rows (the passthrough handler's seven columns). Reported: rows/s for both and
their ratio, the p50/p99 time from a window's close (the watermark passing its end)
to its commit, and the server's worst event-loop lag.

The end-to-end run feeds windows as fast as the server takes them, so a window that
closes while the one before it commits waits for it. A second run feeds each window
once the one before it has committed (``paced``), as with the default 60 s windows when
the pipeline keeps up: its close-to-commit p50 and p99 are the latency a window
closing on its own sees. It runs three times as many windows (``PACED_RUNS``), and
prints the p50 of its last ones apart: Spark's job takes less once the JVM has compiled
its hot paths, some tens of jobs in (a daemon's steady state), than in the first few.

Beside them, the floor of that latency on this machine: one window's serial work
after it closes, each step timed alone in this process (the bare hand-off's median file
and Spark job), and what the sink does before the window closes (the median of three
parses of its JSON lines into Arrow: ``sinks.ahead`` parses each batch's rows as they
arrive). What the end-to-end p50 adds on top is the server's own share of the cores and
the windows queued behind a commit.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import orjson

from ...base.handoff import JsonLines
from ...spark.bench import bare_handoff
from ...sinks.schema import rows_to_table
from .common import PASSTHROUGH, RECORDS, close_shards, lines, open_shards, start_server

BATCHES_PER_WINDOW = 10  # 10 x 10,000 records = one 100,000-row window
WARM_UP = BATCHES_PER_WINDOW + 1  # fed before the clock starts: the first window closes with the last
PACED_RUNS = 3  # the paced run: three times the windows; its last third is also told apart


def passthrough_rows(rows_per_window: int) -> list[bytes]:
    """One window of the passthrough handler's rows, as the coordinator hands them over."""
    line, _ = lines(1)[0]
    records = orjson.loads(line)["records"]
    return [
        orjson.dumps({"shard_id": "shardId-000000000000", "sequence_number": r["sequenceNumber"],
                      "sub_sequence_number": 0, "partition_key": r["partitionKey"],
                      "approximate_arrival_timestamp": r["approximateArrivalTimestamp"], "data": r["data"]})
        for r in records
    ] * (rows_per_window // len(records))


async def end_to_end(tmp: str, windows: int, paced: bool = False
                     ) -> tuple[float, list[float], float | None, float, dict]:
    """rows/s, close-to-commit latencies (ms), the server's worst loop lag (ms), how
    long the first window's commit took (ms: not timed), and the Spark process's
    warm-up (its ``spark_warmed_up`` event, waited for before the first batch).
    ``paced``: each window's rows are fed once the window before it is committed (one
    window closing at a time, as with the default 60 s windows where the pipeline
    keeps up), not as fast as the server takes them."""
    state = os.path.join(tmp, "spark-paced" if paced else "spark-e2e")
    log = Path(state) / "server.log"
    Path(state).mkdir(parents=True, exist_ok=True)
    server, port = await start_server(
        state, "--log-file", str(log), "--log-level", "info", "--sink", f"parquet:{state}/out", "--window", "10",
        handler=PASSTHROUGH, timeout=240,
    )  # fmt: skip
    # the first batch starts a window: every tenth batch's first row closes the window before it
    batch_lines = lines(windows * BATCHES_PER_WINDOW + WARM_UP, ms_per_batch=1_000, align_ms=BATCHES_PER_WINDOW * 1_000)
    total = len(batch_lines) * RECORDS
    try:
        # A server with the default 60 s windows has a minute before its first one closes,
        # in which its Spark process warms Spark's JVM (spark/warmup.py): let it finish.
        deadline = time.monotonic() + 300
        while not (warmed := _events(log, "spark_warmed_up")) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        warm_up = warmed[0] if warmed else {}
        [shard] = await open_shards(port, 1)
        for line, last in batch_lines[:WARM_UP]:
            await shard.process_line(line, last)
        while not _committed(log)[1]:  # the first window: Spark's first job
            await asyncio.sleep(0.02)
        cold = _committed(log)[1][0]
        started = time.perf_counter()
        for i, (line, last) in enumerate(batch_lines[WARM_UP:], start=WARM_UP):
            if paced and i % BATCHES_PER_WINDOW == 0:  # this batch closes the window before it: wait for that one
                while len(_committed(log)[1]) < i // BATCHES_PER_WINDOW - 1:
                    await asyncio.sleep(0.02)
            await shard.process_line(line, last)
        await shard.process_records([], millis_behind_latest=0)  # caught up: the last window closes
        while _committed(log)[0] < total:
            await asyncio.sleep(0.02)
        seconds = time.perf_counter() - started
        await close_shards([shard])
    finally:
        server.terminate()
        server.wait(60)
    _, latencies = _committed(log)
    lag = None
    for line in log.read_bytes().splitlines():
        if b'"event":"stopped"' in line:
            lag = orjson.loads(line).get("loop_lag_max_ms")
    return (total - WARM_UP * RECORDS) / seconds, latencies[1:], lag, cold, warm_up


def _committed(log: Path) -> tuple[int, list[float]]:
    events = _events(log, "window_committed")
    return sum(e["rows"] for e in events), [e["latency_ms"] for e in events]


def _events(log: Path, event: str) -> list[dict]:
    if not log.exists():
        return []
    marker = f'"{event}"'.encode()
    return [orjson.loads(line) for line in log.read_bytes().splitlines() if marker in line]


async def run(quick: bool, tmp: str) -> None:
    windows = 2 if quick else 8
    rows = RECORDS * BATCHES_PER_WINDOW
    print(f"\nspark: {windows} windows of {rows:,} rows (passthrough rows, identity pipeline, embedded Spark)")
    window_rows = passthrough_rows(rows)
    table, _ = rows_to_table(JsonLines.of(window_rows), None)
    parse_ms = parse_time(window_rows, table.schema)
    bare, file_ms, job_ms = await asyncio.to_thread(bare_handoff, Path(tmp) / "bare", table, windows)
    e2e, latencies, lag, cold, warm_up = await end_to_end(tmp, windows)
    _, paced, _, _, _ = await end_to_end(tmp, windows * PACED_RUNS, paced=True)
    q = _percentiles(latencies)
    print(f"  {'bare handoff rows/s':>20} {'end to end rows/s':>18} {'ratio':>6} "
          f"{'close->commit p50 / p99':>24} {'loop lag max':>13}")
    print(f"  {bare:20,.0f} {e2e:18,.0f} {100 * e2e / bare:5.0f}% "
          f"{q[49]:12,.0f} / {q[98]:,.0f} ms {lag if lag is not None else float('nan'):10.1f} ms")
    p, warm = _percentiles(paced[:windows]), _percentiles(paced[-windows:])
    print(f"  one window closing at a time (each fed once the one before it committed): close->commit "
          f"{p[49]:,.0f} / {p[98]:,.0f} ms; windows {len(paced) - windows + 1}-{len(paced)} "
          f"(Spark's JVM warmer): {warm[49]:,.0f} / {warm[98]:,.0f} ms")
    print(f"  the first window (before the clock, after the Spark process's warm-up: {warm_up.get('jobs', 0)} jobs "
          f"in {warm_up.get('ms', 0) / 1000:.1f} s): closed to committed in {cold:,.0f} ms")
    print(f"  floor, one {rows:,}-row window at a time on this machine: {file_ms + job_ms:,.0f} ms "
          f"(its file {file_ms:,.0f} + Spark's job {job_ms:,.0f}; its rows into Arrow, {parse_ms:,.0f} ms, "
          "are parsed as they arrive)")


def _percentiles(latencies: list[float]) -> list[float]:
    return statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99


def parse_time(rows: list[bytes], schema) -> float:
    """The median milliseconds of three parses of a window's rows into Arrow, with the
    schema known (as every window after the first is parsed)."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        rows_to_table(JsonLines.of(rows), schema)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
