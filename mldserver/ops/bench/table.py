"""``mldserver bench --part table``: the table sink (``iceberg:``) against the parquet
sink, and how long a shard's committed position takes to read back, in one run.

- ``rows/s``     ``mldserver serve`` with the passthrough handler, fed over direct TCP
                 by the fake daemon in batches of 10,000 records x 100 B (ten batches
                 make one 100,000-row window), one shard per server; 1 and 2 servers
                 at once. ``parquet:`` runs the identity pipeline in each server's own
                 Spark process (each its own folder: a parquet sink has one writer);
                 ``iceberg:`` commits the rows as Arrow, no Spark, every server into
                 one table (a SQLite catalog). Rows/s is all rows over the time from
                 the first batch to the last ``window_committed``.
- ``read-back``  a table with ``--commits`` commits (10,000 by default; windows of 4
                 shards x 5 rows), then ``committed_position`` as a shard's
                 ``initialize`` asks it: the first read of a fresh server (its catalog
                 opened) and the median of the next 20.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import orjson

from ...api.testing import FakeDaemon, Shard, SocketChild
from .common import PASSTHROUGH, RECORDS, close_shards, free_port, lines, start_server

BATCHES_PER_WINDOW = 10


async def serve_and_feed(tmp: str, kind: str, servers: int, windows: int) -> float:
    """rows/s committed by ``servers`` servers, one shard each, into ``kind``."""
    root = Path(tmp) / f"table-{kind}-{servers}"
    root.mkdir(parents=True, exist_ok=True)
    config = root / "mldserver.toml"
    # The table sink keys positions by stream; lineage lookups go to a closed port and
    # fall back to what is seen (logged once per shard, before the clock starts).
    config.write_text(f'stream = "bench"\naws_region = "us-east-1"\naws_endpoint_url = "http://127.0.0.1:{free_port()}"\n')
    procs, logs = [], []
    batch_lines = lines(windows * BATCHES_PER_WINDOW, ms_per_batch=1_000)
    try:
        for n in range(servers):
            state = root / f"server-{n}"
            state.mkdir(exist_ok=True)
            sink = f"parquet:{state}/out" if kind == "parquet" else f"iceberg:{root}/lake"
            log = state / "server.log"
            proc, port = await start_server(
                str(state), "--log-file", str(log), "--log-level", "info", "--sink", sink, "--window", "10",
                "--config", str(config), handler=PASSTHROUGH, timeout=240,
                env={"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"},
            )  # fmt: skip
            procs.append((proc, port))
            logs.append(log)
        shards = []
        for n, (_, port) in enumerate(procs):
            shard = Shard(FakeDaemon("", timeout=600), f"shardId-{n:012d}", await SocketChild.open("127.0.0.1", port))
            await shard.initialize("TRIM_HORIZON", 0)
            shards.append(shard)
        total = len(batch_lines) * RECORDS * servers
        started = time.perf_counter()

        async def feed(shard: Shard) -> None:
            for line, last in batch_lines:
                await shard.process_line(line, last)
            await shard.process_records([], millis_behind_latest=0)  # caught up: the last window closes

        await asyncio.gather(*(feed(s) for s in shards))
        while sum(_committed(log) for log in logs) < total:
            await asyncio.sleep(0.05)
        seconds = time.perf_counter() - started
        await close_shards(shards)
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(60)
    return total / seconds


def _committed(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(orjson.loads(line)["rows"] for line in log.read_bytes().splitlines() if b'"window_committed"' in line)


async def read_back(tmp: str, commits: int) -> tuple[float, float, float, int, int]:
    """(seconds to build, first read ms, median read ms, metadata bytes, snapshots)."""
    from ...base.config import Settings
    from ...base.handoff import JsonLines, Window
    from ...base.deadletters import DeadLetters
    from ...base.logs import get_logger
    from ...base.positions import Position
    from ...sinks.iceberg import IcebergSink

    root = Path(tmp) / "table-read-back"
    settings = Settings(stream="bench", state_dir=str(root / "state"), sink=f"iceberg:{root / 'lake'}")
    dead = DeadLetters(root / "state" / "dead-letters", get_logger("mldserver.bench"))
    sink = IcebergSink(settings, root / "lake", dead)
    await sink.start()
    built = time.perf_counter()
    for c in range(commits):
        rows, sources = [], []
        for s in range(4):
            for r in range(5):
                seq = c * 5 + r
                rows.append(orjson.dumps({"shard_id": f"shardId-{s:012d}", "seq": seq}))
                sources.append((f"shardId-{s:012d}", Position(seq, 0, str(seq))))
        last = {f"shardId-{s:012d}": Position(c * 5 + 4, 0, str(c * 5 + 4)) for s in range(4)}
        await sink.commit(Window(c * 1000, c * 1000 + 1000, JsonLines.of(rows), 0, last, sources))
        if c and c % 1000 == 0:
            print(f"    ... {c:,} commits ({time.perf_counter() - built:,.0f} s)", flush=True)
    built = time.perf_counter() - built
    fresh = IcebergSink(settings.replace(server_id="reader"), root / "lake", dead)  # a server just started
    await fresh.start()
    started = time.perf_counter()
    position = await fresh.committed_position("shardId-000000000002")
    first = (time.perf_counter() - started) * 1000
    assert position == Position(commits * 5 - 1, 0, str(commits * 5 - 1)), position
    times = []
    for _ in range(20):
        started = time.perf_counter()
        await fresh.committed_position("shardId-000000000001")
        times.append((time.perf_counter() - started) * 1000)
    table = fresh.catalog.load_table(fresh.identifier)  # type: ignore[union-attr]
    size = os.path.getsize(table.metadata_location.removeprefix("file://"))
    return built, first, statistics.median(times), size, len(table.snapshots())


async def run(quick: bool, tmp: str, commits: int | None = None) -> None:
    windows = 2 if quick else 6
    commits = commits or (200 if quick else 10_000)
    rows = RECORDS * BATCHES_PER_WINDOW
    print(f"\ntable: {windows} windows of {rows:,} rows per server (passthrough rows, one shard per server)")
    print(f"  {'servers':>7} {'parquet: rows/s':>16} {'iceberg: rows/s':>16} {'iceberg/parquet':>16}")
    for servers in (1, 2):
        parquet = await serve_and_feed(tmp, "parquet", servers, windows)
        iceberg = await serve_and_feed(tmp, "iceberg", servers, windows)
        print(f"  {servers:7d} {parquet:16,.0f} {iceberg:16,.0f} {100 * iceberg / parquet:15.0f}%", flush=True)
    print(f"  read-back: building a table of {commits:,} commits (4 shards x 5 rows each)", flush=True)
    built, first, median, size, snapshots = await read_back(tmp, commits)
    print(f"  {'commits':>8} {'built in':>9} {'first read':>11} {'median read':>12} {'metadata':>9} {'snapshots':>10}")
    print(f"  {commits:8,d} {built:8,.0f}s {first:9,.1f}ms {median:10,.1f}ms {size / 1024:7,.0f}KiB {snapshots:10d}")
