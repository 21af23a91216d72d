"""``mldserver bench --part timers``: durable timers on the embedded store (SQLite in the
state dir), in one run. Each figure comes from a server of its own (``mldserver
serve``, its own process, with its handler processes):

- ``create``: 4 shards over direct TCP, batches of 1,000 records, one timer per record
  (due tomorrow), created by the handler in a handler process:

  - ``await each``  ``await self.timers.create(...)`` record by record, as a handler
                    loop does: each is checked and kept with the call, and the
                    batch's timers are committed (fsynced) in one commit before its
                    status;
  - ``gathered``    the batch's creates awaited together (``asyncio.gather``): the
                    same commit, reached through a task per create;
  - ``direct``      the design not taken: the handler process writes the SQLite file
                    itself (no request to the server), record by record.

- ``fire``: N timers already due in the store when the server starts (written into
  its database beforehand); a callback that does nothing; from the first callback
  seen on ``/metrics`` to the store found empty. The peak PSS of the server and its
  handler processes while it fires.
- ``memory``: the same server idle with 1,000,000 timers pending (due tomorrow) and
  with none: PSS, what the scheduler holds in memory, the database's size.

The handlers and the callback are this module's (``mldserver.ops.bench.timers:...``).
"""

from __future__ import annotations

import asyncio
import base64
import os
import sqlite3
import time
import urllib.request
from pathlib import Path

import orjson

from ...api.handler import Handler
from ...api.testing import Shard
from ...timers.sqlite import SCHEMA, SqliteStore
from ...timers.store import Timer, new_version
from .common import Sampler, close_shards, free_port, open_shards, start_server

SHARDS, PER_BATCH = 4, 1_000
TOMORROW = 86_400


async def tick(context) -> None:
    """The timers' callback: the cost of firing, not of the user's work."""


def _at(batch) -> float:
    return float(batch.records[0].data) if batch.records else 0.0


class Creator(Handler):
    async def process_records(self, batch, checkpointer):
        at = _at(batch)
        for record in batch.records:
            await self.timers.create(tick, at, record.partition_key)


class Gatherer(Handler):
    async def process_records(self, batch, checkpointer):
        at = _at(batch)
        await asyncio.gather(*(self.timers.create(tick, at, r.partition_key) for r in batch.records))


class Direct(Handler):
    """Writes the server's database itself, from its handler process."""

    store: SqliteStore | None = None

    async def process_records(self, batch, checkpointer):
        if Direct.store is None:
            Direct.store = SqliteStore(Path(self.context.settings.state_dir) / "timers" / "timers.db")
            await Direct.store.open()
        due = int(_at(batch) * 1000)
        for record in batch.records:
            await Direct.store.put([Timer("mldserver.ops.bench.timers:tick", record.partition_key, due, b"null",
                                          new_version())])


def batch_line(shard: int, first: int, n: int, at: float) -> tuple[bytes, dict]:
    data = base64.b64encode(repr(at).encode()).decode()
    recs = [{"action": "record", "data": data, "partitionKey": f"t-{shard}-{first + i}",
             "sequenceNumber": str(first + i + 1), "subSequenceNumber": 0, "approximateArrivalTimestamp": None}
            for i in range(n)]
    return orjson.dumps({"action": "processRecords", "records": recs, "millisBehindLatest": 0}) + b"\n", recs[-1]


def prefill(db: Path, n: int, due_ms: int) -> None:
    """``n`` timers straight into a timer database, as the server's store writes them."""
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(SCHEMA)
    step = 100_000
    for start in range(0, n, step):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO timers VALUES (?, ?, ?, ?, ?, 0)",
                         [("mldserver.ops.bench.timers:tick", f"p-{i}", due_ms, b"null", i + 1)
                          for i in range(start, min(n, start + step))])
        conn.execute("COMMIT")
    conn.close()


def scrape(admin: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    return {name: float(value) for name, _, value in (line.partition(" ") for line in text.splitlines())
            if name.startswith("mldserver_timer") or name.startswith("mldserver_pending")}


async def wait_metrics(admin: str) -> dict[str, float]:
    while True:
        try:
            return await asyncio.to_thread(scrape, admin)
        except OSError:
            await asyncio.sleep(0.05)


async def create_rate(tmp: str, handler: str, per_shard: int, workers: int | None) -> float:
    state = os.path.join(tmp, f"create-{handler}-{workers}")
    server, port = await start_server(state, handler=f"mldserver.ops.bench.timers:{handler}", workers=workers)
    try:
        shards = await open_shards(port, SHARDS)
        at = time.time() + TOMORROW
        batches = [[batch_line(s, first, min(PER_BATCH, per_shard - first), at)
                    for first in range(0, per_shard, PER_BATCH)] for s in range(SHARDS)]
        started = time.perf_counter()

        async def one(shard: Shard, lines: list) -> None:
            for line, last in lines:
                await shard.process_line(line, last)

        await asyncio.gather(*(one(shard, lines) for shard, lines in zip(shards, batches)))
        seconds = time.perf_counter() - started
        await close_shards(shards)
    finally:
        server.terminate()
        server.wait(30)
    return SHARDS * per_shard / seconds


async def fire_rate(tmp: str, n: int, workers: int | None) -> tuple[float, int]:
    """Timers fired per second from a store of ``n`` due ones, and the peak PSS (KiB)."""
    state = os.path.join(tmp, f"fire-{workers}")
    prefill(Path(state) / "timers" / "timers.db", n, int(time.time() * 1000))
    admin = f"127.0.0.1:{free_port()}"
    sampler = Sampler()
    server, _ = await start_server(state, handler="mldserver.ops.bench.timers:Creator", workers=workers, admin=admin)
    try:
        sampler.trees["server"] = server.pid
        sampler.start()
        first = last = None
        while True:
            m = await wait_metrics(admin)
            now = time.perf_counter()
            if first is None and m.get("mldserver_timer_callback_success_total", 0) > 0:
                first = (now, m["mldserver_timer_callback_success_total"])
            if first is not None and m.get("mldserver_pending_timers") == 0:
                last = (now, m["mldserver_timer_callback_success_total"])
                break
            await asyncio.sleep(0.02)
        await sampler.stop()
    finally:
        server.terminate()
        server.wait(60)
    return (last[1] - first[1]) / (last[0] - first[0]), sampler.peak.get("server", 0)


async def idle_memory(tmp: str, n: int) -> tuple[int, dict[str, float], int]:
    """PSS (KiB) of an idle server with ``n`` timers pending (due tomorrow), its timer
    metrics, and the database's size in bytes."""
    state = os.path.join(tmp, f"idle-{n}")
    db = Path(state) / "timers" / "timers.db"
    if n:
        prefill(db, n, int((time.time() + TOMORROW) * 1000))
    admin = f"127.0.0.1:{free_port()}"
    server, _ = await start_server(state, handler="mldserver.ops.bench.timers:Creator", admin=admin)
    try:
        metrics = await wait_metrics(admin)
        await asyncio.sleep(2.0)  # a few scheduler passes: whatever it reads ahead is in
        metrics = await wait_metrics(admin)
        sampler = Sampler()
        sampler.trees["server"] = server.pid
        sampler.sample()
    finally:
        server.terminate()
        server.wait(60)
    size = sum(p.stat().st_size for p in db.parent.glob("timers.db*")) if db.parent.exists() else 0
    return sampler.peak.get("server", 0), metrics, size


def commit_ms(tmp: str, n: int = 200) -> float:
    """The disk's cost of one durable commit here: ``n`` one-row transactions of the
    store's kind (WAL, synchronous FULL), median milliseconds."""
    db = Path(tmp) / "probe" / "probe.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    times = []
    for i in range(n):
        started = time.perf_counter()
        conn.execute("INSERT INTO t VALUES (?)", (i,))
        times.append(time.perf_counter() - started)
    conn.close()
    return sorted(times)[n // 2] * 1000


async def run(quick: bool, tmp: str, workers: list[int | None]) -> None:
    each_n, gathered_n = (500, 2_000) if quick else (5_000, 25_000)
    n_fire = 20_000 if quick else 200_000
    n_idle = 50_000 if quick else 1_000_000
    print(f"\ntimers: embedded store (SQLite, WAL, synchronous FULL), {SHARDS} shards, batches of {PER_BATCH:,}; "
          f"one durable commit takes {await asyncio.to_thread(commit_ms, tmp):.2f} ms on this disk (median)")
    print(f"  create (timers/s, all shards together; await each and direct: {SHARDS} x {each_n:,}, "
          f"gathered: {SHARDS} x {gathered_n:,}):")
    print(f"  {'workers':>7} {'await each':>11} {'gathered':>10} {'direct':>10}")
    for w in workers:
        each = await create_rate(tmp, "Creator", each_n, w)
        gathered = await create_rate(tmp, "Gatherer", gathered_n, w)
        direct = await create_rate(tmp, "Direct", each_n, w) if w != 0 else None
        print(f"  {'-' if w is None else w:>7} {each:11,.0f} {gathered:10,.0f} "
              f"{'-' if direct is None else f'{direct:,.0f}':>10}")
    print(f"  fire, {n_fire:,} due at start-up (timers/s; peak PSS of the server and its handler processes):")
    for w in workers:
        rate, pss = await fire_rate(tmp, n_fire, w)
        print(f"  {'-' if w is None else w:>7} {rate:11,.0f}/s {pss / 1024:8.1f} MiB")
    empty, _, _ = await idle_memory(tmp, 0)
    full, metrics, size = await idle_memory(tmp, n_idle)
    print(f"  memory, idle: {n_idle:,} pending {full / 1024:.1f} MiB PSS against {empty / 1024:.1f} MiB with none "
          f"(held in memory: {metrics.get('mldserver_timers_held', 0):,.0f}); the database: {size / 2**20:.1f} MiB")
