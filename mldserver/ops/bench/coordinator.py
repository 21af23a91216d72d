"""``mldserver bench --part coordinator``: what the coordinator costs, in one run.

The same load, the passthrough handler (one row per record), over direct TCP, K
shards in lock-step, against two servers:

- ``no pipeline``  no sink: rows are not collected (today's behaviour);
- ``file sink``    rows go through the coordinator (ordering, watermarks, windows,
                   ledger) into the file sink, 10 s windows; the run ends when the last
                   window is committed (a final caught-up batch per shard closes it).

Each batch is a new line (fresh sequence numbers, so nothing is dropped as a
duplicate) covering 10 s of event time: one window per batch, closing as the run
goes. Each shard sends at least 8 batches, 2.4 million rows in all at 1 or 32 shards:
long enough that what a server pays once (its arenas' and buffers' first pages, a
second or so at 32 shards) does not pass for what each row costs.

The two servers take turns for three rounds (one with ``--quick``), the first of
each round alternating, each round's pair of runs back to back: a shared machine's
speed drifts by 10% and more from one run to the next, on both alike. Reported: the
median round's rows/s for both and the median of the rounds' costs, with the lowest
and highest; the median CPU the server used a row, its handler processes included
(steadier than rows/s on a machine shared with other work); and the largest memory
the coordinator used in any round: its buffered rows as the ledger counts them (the
memory they hold) against ``max_buffered_bytes``, which they stay under (what lands
past it is spilled to files: how much is reported), and the peak PSS of the server
and its handler processes against the no-pipeline server's. Under the rows, the floor:
what a row costs to keep at the least (encoded as JSON by orjson, a batch at a time, and
written to a file, in one loop of one process), beside what the file sink adds to each row's CPU.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import orjson

from ...api.testing import Shard
from .common import PASSTHROUGH, RECORDS, SIZE, Sampler, close_shards, cpu_s, descendants, lines, open_shards, start_server


def committed_rows(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(orjson.loads(line).get("rows", 0) for line in log.read_bytes().splitlines()
               if b'"window_committed"' in line)


class Run(NamedTuple):
    """One server's run of the load."""

    rows_per_s: float
    cpu_us_per_row: float  # the server's CPU a row, its handler processes included
    pss_kib: int  # its peak PSS, the same
    peak_buffered: int | None  # the coordinator's peak buffered bytes (None: no sink)
    spilled: int | None  # the bytes of rows it spilled to files past the cap


async def run_one(name: str, k: int, batch_lines: list, tmp: str, workers: int | None = None) -> Run:
    """One run of the load against a new server (``name``: no pipeline, or file sink)."""
    state = os.path.join(tmp, f"coord-{name}-{k}-{workers}")
    log = Path(state) / "server.log"
    extra = ["--log-file", str(log), "--log-level", "info"]
    if name == "file sink":
        extra += ["--sink", f"file:{state}/out", "--window", "10"]
    Path(state).mkdir(parents=True, exist_ok=True)
    server, port = await start_server(state, *extra, handler=PASSTHROUGH, workers=workers)
    try:
        shards = await open_shards(port, k)
        sampler = Sampler()
        sampler.trees["server"] = server.pid
        sampler.start()
        pids = descendants(server.pid)
        cpu = sum(map(cpu_s, pids))
        started = time.perf_counter()

        async def one(shard: Shard) -> None:
            for line, last in batch_lines:
                await shard.process_line(line, last)
            await shard.process_records([], millis_behind_latest=0)

        await asyncio.gather(*(one(s) for s in shards))
        total = len(batch_lines) * RECORDS * k
        if name == "file sink":
            while committed_rows(log) < total:
                await asyncio.sleep(0.05)
        seconds = time.perf_counter() - started
        cpu = sum(map(cpu_s, pids)) - cpu
        await sampler.stop()
        await close_shards(shards)
    finally:
        server.terminate()
        server.wait(30)
    peak = spilled = None
    for line in log.read_bytes().splitlines():
        if b'"coordinator_stopped"' in line:
            stopped = orjson.loads(line)
            peak, spilled = stopped["peak_bytes"], stopped["spilled_bytes"]
    return Run(total / seconds, cpu / total * 1e6, sampler.peak.get("server", 0), peak, spilled)


def floor(batch_lines: list, tmp: str) -> float:
    """The least a row can add: CPU us a row to encode the passthrough handler's rows of
    these batches as JSON (orjson, a batch at a time) and write them to a file, fsynced, in one loop
    (the no-pipeline run makes the same rows and drops them: this is what keeping them
    costs at the least, with no ordering, no window and no process between)."""
    path = Path(tmp) / "coordinator-floor.jsonl"
    batches = [[{"shard_id": "shardId-000000000000", "sequence_number": r["sequenceNumber"],
                 "sub_sequence_number": r.get("subSequenceNumber"), "partition_key": r["partitionKey"],
                 "approximate_arrival_timestamp": r["approximateArrivalTimestamp"], "data": r["data"]}
                for r in orjson.loads(line)["records"]] for line, _ in batch_lines]  # (made by both runs alike)
    rows = sum(map(len, batches))
    dumps = orjson.dumps
    cpu = time.process_time()
    with open(path, "wb") as out:
        for batch in batches:
            out.write(dumps(batch))  # (one call a batch: a row's own bytes object would cost more than its encoding)
        out.flush()
        os.fsync(out.fileno())
    spent = time.process_time() - cpu
    path.unlink()
    return spent / max(rows, 1) * 1e6


async def run(shard_counts: list[int], quick: bool, tmp: str, workers: list[int | None] | None = None) -> None:
    from ...base.config import Settings

    cap = Settings.max_buffered_bytes / 2**20
    rounds = 1 if quick else 3
    print(f"\ncoordinator: batches of {RECORDS:,} records x {SIZE} B, passthrough handler, direct TCP; "
          f"{rounds} round{'s' if rounds > 1 else ''} taking turns: the median round, the cost's lowest and highest")
    print(f"  {'workers':>7} {'K':>4} {'no pipeline rows/s':>19} {'file sink rows/s':>17} {'cost':>7} {'(range)':>17} "
          f"{'CPU us/row (none / sink)':>25} {'peak buffered / cap':>20} {'spilled':>10} {'server PSS (none / sink)':>25}")
    added: list[float] = []  # each row's CPU us a row, file sink over no pipeline
    for k in shard_counts:
        batches = 2 if quick else max(8, 240 // k)
        batch_lines = lines(batches)
        for w in workers or [None]:
            runs: dict[str, list[Run]] = {"no pipeline": [], "file sink": []}
            for r in range(rounds):
                for name in (("no pipeline", "file sink") if r % 2 == 0 else ("file sink", "no pipeline")):
                    runs[name].append(await run_one(name, k, batch_lines, tmp, w))
            costs = [100 * (1 - sink.rows_per_s / bare.rows_per_s)
                     for bare, sink in zip(runs["no pipeline"], runs["file sink"])]
            bare, sink = (statistics.median(x.rows_per_s for x in runs[n]) for n in ("no pipeline", "file sink"))
            bare_cpu, sink_cpu = (statistics.median(x.cpu_us_per_row for x in runs[n])
                                  for n in ("no pipeline", "file sink"))
            bare_pss, sink_pss = (max(x.pss_kib for x in runs[n]) for n in ("no pipeline", "file sink"))
            peak = max(x.peak_buffered or 0 for x in runs["file sink"])
            spilled = max(x.spilled or 0 for x in runs["file sink"])
            spread = f"({min(costs):+.1f} to {max(costs):+.1f}%)"
            print(f"  {'-' if w is None else w:>7} {k:4d} {bare:19,.0f} {sink:17,.0f} {statistics.median(costs):+6.1f}% "
                  f"{spread:>17} {bare_cpu:16.2f} / {sink_cpu:.2f} {peak / 2**20:9.1f} / {cap:.0f} MiB "
                  f"{spilled / 2**20:6.1f} MiB {bare_pss / 1024:11.1f} / {sink_pss / 1024:.1f} MiB")
            added.append(sink_cpu - bare_cpu)
    least = floor(lines(8), tmp)
    print(f"  floor: a row encoded and written (orjson a batch at a time, one file, one loop) {least:.2f} us of CPU, "
          f"against the file sink's {', '.join(f'{a:+.2f}' for a in added)} us a row over no pipeline (the rows above)")
