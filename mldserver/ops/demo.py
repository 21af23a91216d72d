"""``mldserver demo``: the whole pipeline on embedded defaults, driven by the fake daemon.

No AWS account, no Kinesis: the fake daemon launches one relay per shard exactly as
the MultiLangDaemon would and feeds each shard DynamoDB Streams change records of an
orders table (``mldserver/examples/orders.py``, shipped with the package: the demo
runs from an installed package, in any folder). The server runs the ``Orders`` handler on every
shard, merges all shards' rows into one ordered stream, and hands each 60 s event-time
window to embedded Spark, where ``per_customer`` counts orders per customer; the
output is committed exactly once. Midway one shard splits: the parent ends with
SHARD_END (its uncommitted rows spooled) and its two children start at TRIM_HORIZON.

Everything lands under ``--dir`` (default ``./mldserver-demo``), cleared at the start::

    mldserver-demo/server.log                      the server's JSON log lines
    mldserver-demo/output/window=<start>-<end>/    one parquet partition per window
    mldserver-demo/output/_commits/                the commit log
    mldserver-demo/state/                          spool, dead letters, Spark's scratch
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from ..base.config import Settings
from ..examples.orders import change_record
from ..base.logs import configure
from ..server.server import Server
from ..api.testing import SHARD_END, FakeDaemon, make_records, relay_command

BATCH = 1000
WINDOW = 60.0
SPAN_MS = 20 * 60_000  # the event time the demo's orders cover
CUSTOMERS = 500


def _orders(first_seq: int, count: int, first_order: int, start_ms: int, step_ms: float) -> list[dict]:
    def data(seq: int) -> bytes:
        n = seq - first_seq
        order = first_order + n
        return change_record(order, order * 7919 % CUSTOMERS, 5 + order % 97 * 0.5, int(start_ms + n * step_ms))

    return make_records(first_seq, count, data=data, approximate_arrival_timestamp=start_ms)


async def _drive(shard, first_seq: int, count: int, first_order: int, start_ms: int, end_ms: int, sent: list[int]):
    step = (end_ms - start_ms) / count
    for start in range(0, count, BATCH):
        n = min(BATCH, count - start)
        records = _orders(first_seq + start, n, first_order + start, int(start_ms + start * step), step)
        await shard.process_records(records, millis_behind_latest=0 if start + n == count else 60_000)
        sent[0] += n


async def _progress(server: Server, sent: list[int], started: float) -> None:
    coordinator = server.coordinator
    assert coordinator is not None
    while True:
        await asyncio.sleep(2.0)
        print(
            f"  {time.perf_counter() - started:5.1f} s  records in {sent[0]:>9,}   "
            f"windows committed {coordinator.committer.windows_committed:>3}   rows buffered {coordinator.status().buffered_rows:>8,}",
            flush=True,
        )


async def run(shards: int, records: int, directory: Path, admin: str = "off") -> None:
    for old in ("state", "output", "server.log"):
        target = directory / old
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    configure("json", "info", str(directory / "server.log"))
    settings = Settings(
        handler="mldserver.examples.orders:Orders",
        pipeline="mldserver.examples.orders:per_customer",
        sink=f"parquet:{(directory / 'output').resolve()}",
        port=0,
        state_dir=str(directory / "state"),
        window=WINDOW,
        watermark_margin=1.0,
        idle_timeout=10.0,
        checkpoint_interval=2.0,
        admin=admin,
    )
    print("starting the server and its Spark process (embedded Spark, local[*]) ...", flush=True)
    server = Server(settings)
    await server.start()
    host, port = server.address
    print(f"server listening on {host}:{port}; relay: mldserver connect {host}:{port}")
    if server.admin is not None and server.admin.bound:
        a_host, a_port = server.admin.bound
        print(f"admin endpoint http://{a_host}:{a_port}/: watch it with "
              f"`mldserver status --watch --admin {a_host}:{a_port}`", flush=True)
    coordinator = server.coordinator
    assert coordinator is not None

    now = int(time.time() * 1000)
    t0 = now - SPAN_MS - 120_000  # orders from about 22 minutes ago until 2 minutes ago
    t_split = t0 + SPAN_MS * 2 // 3
    per_shard = records // (shards + 1)  # the split's two children share one shard's part
    half = (records - per_shard * shards) // 2
    sent = [0]
    started = time.perf_counter()
    progress = asyncio.create_task(_progress(server, sent, started))
    daemon = FakeDaemon(relay_command(host, port))
    ids = [f"shardId-{i:012d}" for i in range(shards)]
    conversations = await asyncio.gather(*(daemon.shard(i) for i in ids))
    parent = conversations[0]
    await asyncio.gather(
        *(
            _drive(s, 10**20 * (n + 1), per_shard, n * per_shard, t0, t_split if n == 0 else t0 + SPAN_MS, sent)
            for n, s in enumerate(conversations)
        )
    )
    await parent.shard_ended()
    print(f"  split {parent.shard_id}: SHARD_END checkpointed, its uncommitted rows spooled")
    children = await asyncio.gather(*(daemon.shard(f"shardId-{shards + i:012d}") for i in range(2)))
    await asyncio.gather(
        *(
            _drive(c, 10**20 * (shards + 2 + i), half, (shards + i) * per_shard, t_split, t0 + SPAN_MS, sent)
            for i, c in enumerate(children)
        )
    )
    live = conversations[1:] + list(children)
    deadline = time.monotonic() + 120
    while coordinator.status().buffered_rows and time.monotonic() < deadline:  # every window closed and committed
        await asyncio.sleep(0.2)
    elapsed = time.perf_counter() - started
    progress.cancel()
    await asyncio.gather(*(s.shutdown_requested() for s in live))  # checkpoints what is committed
    await asyncio.gather(*(s.lease_lost() for s in live))
    await asyncio.gather(*(s.close() for s in [parent, *live]))
    sink = coordinator.committer.sink
    await server.shutdown()

    output = directory / "output"
    print()
    print("summary")
    print(f"  records in          {sent[0]:,} over {shards + 2} shards (one split into two)")
    print(f"  windows committed   {coordinator.committer.windows_committed} ({WINDOW:.0f} s of event time each), "
          f"{coordinator.committer.rows_committed:,} rows in")
    print(f"  rows out            {getattr(sink, 'rows_out', 0):,} (orders per customer per window)")
    late = coordinator.status().late_rows
    print(f"  late rows           {late:,}" + ("" if not late else
          " (rows whose window had closed, committed with a later one: see late in server.log)"))
    print(f"  throughput          {coordinator.committer.rows_committed / elapsed:,.0f} records/s end to end "
          f"({elapsed:.1f} s, relay to committed Spark output)")
    stored = sum(1 for v in daemon.checkpoints.values() if v != SHARD_END)
    print(f"  checkpoints         {stored} shards at their last committed record, 1 at SHARD_END")
    if coordinator.status().buffered_rows:
        print(f"  NOT COMMITTED       {coordinator.status().buffered_rows:,} rows (see {directory / 'server.log'})")
    print(f"  output              {output}  (spark.read.parquet or pyarrow.dataset; commit log in _commits/)")
    print(f"  server log          {directory / 'server.log'}")
    print(f"  Spark log           {directory / 'state' / 'spark' / 'spark.log'}")
    if coordinator.status().buffered_rows:
        raise SystemExit(1)


def main(args) -> None:
    import uvloop

    uvloop.run(run(args.shards, args.records, Path(args.dir), getattr(args, "admin", None) or "off"))
