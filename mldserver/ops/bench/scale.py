"""``mldserver bench --part scale``: servers joining and dying on one stream, on loopback.

kinesis-local holds a stream of ``shards`` shards (6); DynamoDB Local the KCL's lease
table; each server is ``mldserver run`` with its own real KCL daemon and state dir,
the passthrough handler (one row a record) and ``--sink iceberg:DIR``: one table with a
SQLite catalog that every server commits into, as servers on many machines share a
networked catalog. A producer thread puts records as fast as kinesis-local takes them,
round the shards, for the whole run. Then, in turn::

    server 1 starts                   -> it holds every lease
    server 2 starts                   -> the leases settle over both
    server 3 starts                   -> over all three
    a server that is not the leader is SIGKILLed -> its leases settle over the others
    it starts again on its state dir  -> it takes some back
    the KCL's leader is SIGKILLed (not with --quick) -> every lease to the others
    the producer stops; every record put must be in the table once

Each phase waits until its leases are settled (every lease held by a live server, each
live server holding one, read from the lease table's ``leaseOwner``) and stay so for
``STABLE`` s: the time to settle is from the phase's start or kill to the last move.
(KCL 3.x balances by each worker's load, not by count: 4 / 2 over two servers on one
machine is its balance.) The leader is the worker named in the KCL 3.x leader lock
(the ``<app>-CoordinatorState`` table's ``Leader`` item).
Figures, one column a phase (1, 2 and 3 servers side by side, then after each kill),
over ``MEASURE`` s once its leases settled: rows each server committed a second (its
``window_committed`` events),
records put a second, commit conflicts a minute (``table_commit_conflict``), and the
commit's duration p50/p99 (``window_committed`` ``duration_ms``: the catalog's
compare-and-swap and the retries a conflict costs). The checks: every record put is in
the table exactly once (read back with pyiceberg), and each phase's leases settled::

    scale = await run_scale(tmp, quick=True)
    for line in scale.table():
        print(line)
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...errors import ConfigError
from .common import PASSTHROUGH, Check, epoch, some

STREAM = "scale"
SHARDS = 6
HASH_KEYS = 1 << 128
JOIN = 300.0  # s for a server's start to settle (the daemon's first leases: about a minute)
DEATH = 400.0  # s for a dead server's leases to move (the leader's lock: about two minutes)
STABLE = 20.0  # s with no lease moving: settled
MEASURE = 60.0  # s of each phase's figures, once settled (20 with --quick)
DRAIN = 300.0  # s for every record put to be in the table once the producer stops
CONFIG = """\
window = 2.0
watermark_margin = 1.0
checkpoint_interval = 2.0
table_maintenance_interval = 0
"""
EXTRA = {"failoverTimeMillis": "10000", "shardSyncIntervalMillis": "10000"}


@dataclass
class ScalePhase:
    name: str
    began: float  # time.time(): its start or kill, then (once settled) the start of its figures
    ended: float = 0.0
    settled_s: float | None = None  # from its event (a start, a kill) to the leases' last move
    leases: str = "-"  # leases each live server holds then, in start order
    put: int = 0  # records put meanwhile


@dataclass
class Scale:
    shards: int
    phases: list[ScalePhase] = field(default_factory=list)
    put: set[tuple[str, str]] = field(default_factory=set)  # (shard, sequence number)
    rows: Counter = field(default_factory=Counter)  # (shard, sequence number) -> rows in the table
    events: dict[str, list[dict]] = field(default_factory=dict)  # server name -> its log
    problem: str | None = None

    def table(self) -> list[str]:
        head = ["phase"] + [p.name for p in self.phases]
        rows = [head, ["leases settled after (s)"] + [_s(p.settled_s) for p in self.phases],
                ["leases per server"] + [p.leases for p in self.phases]]
        for name in sorted(self.events):
            rows.append([f"rows/s {name}"] + [f"{self._rows(name, p) / _span(p):,.0f}" for p in self.phases])
        rows.append(["rows/s in all"] + [f"{sum(self._rows(n, p) for n in self.events) / _span(p):,.0f}"
                                         for p in self.phases])
        rows.append(["records put/s"] + [f"{p.put / _span(p):,.0f}" for p in self.phases])
        rows.append(["conflicts/min"] + [f"{self._count('table_commit_conflict', p) * 60 / _span(p):.1f}"
                                         for p in self.phases])
        for q, label in ((50, "commit p50 ms"), (99, "commit p99 ms")):
            rows.append([label] + [_ms(self._durations(p), q) for p in self.phases])
        width = [max(len(r[i]) for r in rows) for i in range(len(head))]
        out = ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width)))
               for r in rows]
        return out + [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks()]

    def checks(self) -> list[Check]:
        missing = self.put - self.rows.keys()
        twice = {k for k, n in self.rows.items() if n > 1}
        unsettled = [p.name for p in self.phases if p.settled_s is None]
        return [
            Check("every record put is in the table once", not missing and not twice,
                  f"{len(self.put):,} put, {sum(self.rows.values()):,} rows, {len(missing)} missing "
                  f"({some(missing)}), {len(twice)} twice ({some(twice)})"),
            Check("the leases settled after each join and death", not unsettled and self.problem is None,
                  self.problem or (f"not in {some(unsettled)}" if unsettled else
                                   f"{len(self.phases)} phases")),
        ]

    def _in(self, event: dict, phase: ScalePhase) -> bool:
        return phase.began <= event["at"] < phase.ended

    def _rows(self, name: str, phase: ScalePhase) -> int:
        return sum(e["rows"] for e in self.events[name] if e["event"] == "window_committed" and self._in(e, phase))

    def _count(self, event: str, phase: ScalePhase) -> int:
        return sum(1 for es in self.events.values() for e in es if e["event"] == event and self._in(e, phase))

    def _durations(self, phase: ScalePhase) -> list[float]:
        return [e["duration_ms"] for es in self.events.values() for e in es
                if e["event"] == "window_committed" and self._in(e, phase)]


def _span(phase: ScalePhase) -> float:
    return max(phase.ended - phase.began, 1e-9)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ms(values: list[float], q: int) -> str:
    if len(values) < 2:
        return f"{values[0]:.0f}" if values else "-"
    return f"{statistics.quantiles(values, n=100)[q - 1]:.0f}"


class ServerProcess:
    """One ``mldserver run`` with its own state dir, log and daemon."""

    def __init__(self, base: Path, name: str, properties: Path, config: Path, sink: str) -> None:
        self.name, self.dir = name, base / name
        self.dir.mkdir()
        self.log = self.dir / "server.log"
        self._worker: str | None = None  # read from its log once (settled() asks twice a second)
        self.command = [sys.executable, "-m", "mldserver", "run", "--properties", str(properties), "--handler",
                        PASSTHROUGH, "--port", "0", "--admin", "127.0.0.1:0", "--state-dir", str(self.dir / "state"),
                        "--log-file", str(self.log), "--workers", "1", "--sink", sink,
                        "--server-id", name, "--config", str(config)]
        self.start()

    def start(self) -> None:
        """(Again, after a kill: the same state dir, so the same KCL worker.)"""
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
               "AWS_REGION": "us-east-1"}
        with open(self.dir / "stderr", "ab") as stderr:
            self.proc = subprocess.Popen(self.command, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                         start_new_session=True)

    def events(self) -> list[dict]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_bytes().splitlines():
            if line.startswith(b"{"):
                event = orjson.loads(line)
                event["at"] = epoch(event["ts"])
                out.append(event)
        return out

    def worker(self) -> str | None:
        """Its KCL worker id (the same after a restart: the state dir's), once its daemon started."""
        if self._worker is None:
            self._worker = next((e["worker_id"] for e in self.events() if e["event"] == "daemon_started"), None)
        return self._worker

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the server; its daemon dies with it (tether)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.kill()


class Producer(threading.Thread):
    """Puts records round the shards, as fast as kinesis-local takes them, until stopped."""

    def __init__(self, kinesis: Any, shards: int) -> None:
        super().__init__(daemon=True)
        self.client, self.shards = kinesis.client, shards
        self.put: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.halt.is_set():
                entries = [{"Data": f"r{n + i}".encode(), "PartitionKey": f"r{n + i}",
                            "ExplicitHashKey": str((n + i) % self.shards * (HASH_KEYS // self.shards) + 1)}
                           for i in range(100)]
                answer = self.client.put_records(StreamName=STREAM, Records=entries)
                done = {(r["ShardId"], r["SequenceNumber"]) for r in answer["Records"] if "SequenceNumber" in r}
                with self.lock:
                    self.put |= done
                n += len(entries)
                time.sleep(0.05)  # some 2,000 records/s at most: the servers, not the producer, are measured
        except BaseException as exc:  # the bench says why
            self.error = exc

    def count(self) -> int:
        with self.lock:
            return len(self.put)


class Bench:
    def __init__(self, base: Path, kinesis: Any, dynamodb: Any, shards: int,
                 table_catalog: dict[str, str] | None = None) -> None:
        from ..emulators import daemon_properties

        self.base, self.dynamodb, self.shards = base, dynamodb, shards
        self.app = f"bench-scale-{os.getpid()}"
        self.properties = daemon_properties(base / "scale.properties", stream=STREAM, app=self.app,
                                            kinesis=kinesis.endpoint, dynamodb=dynamodb.endpoint, extra=EXTRA)
        self.config = base / "scale.toml"
        self.catalog = dict(table_catalog or {})
        if self.catalog:  # a networked catalog naming its warehouse: no folder (as on many machines)
            self.sink = "iceberg:"
            self.config.write_text(CONFIG + "[table_catalog]\n" + "".join(f'"{k}" = "{v}"\n'
                                                                          for k, v in self.catalog.items()))
        else:  # SQLite in one folder every server reaches
            self.sink = f"iceberg:{base / 'lake'}"
            self.config.write_text(CONFIG)
        self.servers: list[ServerProcess] = []
        self.producer = Producer(kinesis, shards)
        self.measure = MEASURE
        self.result = Scale(shards)

    def owners(self) -> Counter:
        """Leases held, by worker (None: a lease no worker holds); empty before the daemon
        made its lease table."""
        client = self.dynamodb.client
        try:
            items = client.scan(TableName=self.app, ConsistentRead=True)["Items"]
        except client.exceptions.ResourceNotFoundException:
            return Counter()
        return Counter(i.get("leaseOwner", {}).get("S") for i in items)

    def leader(self) -> str | None:
        try:
            items = self.dynamodb.client.scan(TableName=f"{self.app}-CoordinatorState", ConsistentRead=True)["Items"]
        except Exception:
            return None
        return next((i["ownerName"]["S"] for i in items if "ownerName" in i), None)

    def settled(self, live: list[ServerProcess]) -> tuple[str, ...] | None:
        """Who holds each lease when every lease is held by a live server and each live
        server holds one at least (None before): the assignment the phase waits to be
        stable. KCL 3.x balances by each worker's load, not by count: 4 / 2 is balanced
        when the servers share a machine."""
        workers = [s.worker() for s in live]
        owners = self.owners()
        if None in workers or sum(owners.values()) < self.shards or set(owners) - set(workers):  # (None: unowned)
            return None
        if not all(owners.get(w) for w in workers):
            return None
        return tuple(owners.get(w, 0) for w in workers)

    async def phase(self, name: str, live: list[ServerProcess], limit: float) -> None:
        """A phase begins (a start or a kill just happened): until the leases are settled
        and stay so for ``STABLE`` s, then its figures over ``measure`` s more."""
        began = time.time()
        phase = ScalePhase(name, began)
        self.result.phases.append(phase)
        deadline = time.monotonic() + limit
        last, changed = None, began
        while True:
            for s in live:
                if s.proc.poll() is not None:
                    raise RuntimeError(f"{s.name} exited {s.proc.returncode}: {(s.dir / 'stderr').read_text()[-500:]}")
            now, settled = time.time(), await asyncio.to_thread(self.settled, live)
            if settled != last:
                last, changed = settled, now
            elif settled is not None and now - changed >= STABLE:
                phase.settled_s, phase.leases = changed - began, "/".join(map(str, settled))
                break
            if time.monotonic() > deadline:
                self.result.problem = f"{name}: leases {dict(self.owners())} not settled in {limit:g} s"
                break
            await asyncio.sleep(0.5)
        phase.began, put = time.time(), self.producer.count()  # the figures: a while once settled
        await asyncio.sleep(self.measure)
        phase.ended = time.time()
        phase.put = self.producer.count() - put

    def start(self) -> ServerProcess:
        server = ServerProcess(self.base, f"server-{len(self.servers) + 1}", self.properties, self.config, self.sink)
        self.servers.append(server)
        return server

    def open_table(self) -> Any:
        """The table as another reader opens it (pyiceberg, the servers' catalog); None
        before the first commit made it."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        if self.catalog:
            properties = dict(self.catalog)
            catalog = load_catalog(properties.pop("name", "mldserver"), **properties)
        else:
            lake = self.base / "lake"
            catalog = load_catalog("mldserver", type="sql", uri=f"sqlite:///{lake}/catalog.db",
                                   warehouse=f"file://{lake}")
        try:
            return catalog.load_table(("mldserver", "windows"))
        except NoSuchTableError:
            return None

    def table_rows(self) -> Counter:
        table = self.open_table()
        if table is None:
            return Counter()
        rows = table.scan(selected_fields=("shard_id", "sequence_number")).to_arrow().to_pylist()
        return Counter((r["shard_id"], r["sequence_number"]) for r in rows)


async def run_scale(tmp: str | os.PathLike, *, quick: bool = False, shards: int = SHARDS,
                    table_catalog: dict[str, str] | None = None) -> Scale:
    """The module docstring's run in ``tmp/scale``; ``table_catalog``: the servers'
    ``[table_catalog]`` (say PostgreSQL and an S3 warehouse), else SQLite in one folder.
    ConfigError when the emulators or the daemon are not installed."""
    from ..daemon import jars
    from ..emulators import DynamoDBLocal, KinesisLocal
    from ...server import preflight

    jars()
    preflight.java("the scale bench (mldserver run)")
    base = Path(tmp) / "scale"
    base.mkdir()
    kinesis = KinesisLocal(base)
    dynamodb = bench = None
    try:
        dynamodb = DynamoDBLocal(base)
        kinesis.create_stream(STREAM, shards)
        bench = Bench(base, kinesis, dynamodb, shards, table_catalog)
        if quick:
            bench.measure = MEASURE / 3
        bench.producer.start()
        one = [bench.start()]
        await bench.phase("1 server", one, JOIN)
        two = one + [bench.start()]
        await bench.phase("2 servers", two, JOIN)
        three = two + [bench.start()]
        await bench.phase("3 servers", three, JOIN)
        leader = await asyncio.to_thread(bench.leader)
        victim = next(s for s in three if s.worker() != leader)
        victim.kill()
        await bench.phase("SIGKILL, not leader", [s for s in three if s is not victim], DEATH)
        victim.start()
        await bench.phase("it restarts", three, JOIN)
        if not quick:
            leader_server = next((s for s in three if s.worker() == leader), three[0])
            leader_server.kill()
            await bench.phase("SIGKILL, leader", [s for s in three if s is not leader_server], DEATH)
        bench.producer.halt.set()
        bench.producer.join()
        if bench.producer.error is not None:
            raise RuntimeError(f"the producer failed: {bench.producer.error!r}")
        r = bench.result
        r.put = bench.producer.put
        deadline = time.monotonic() + DRAIN
        while (r.put - (rows := await asyncio.to_thread(bench.table_rows)).keys()) and time.monotonic() < deadline:
            await asyncio.sleep(2)
        r.rows = rows
        for s in bench.servers:
            await asyncio.to_thread(s.stop)
        r.events = {s.name: s.events() for s in bench.servers}
        return r
    finally:
        if bench is not None:
            bench.producer.halt.set()
            for s in bench.servers:
                if s.proc.poll() is None:
                    s.kill()
        if dynamodb is not None:
            dynamodb.terminate()
        kinesis.terminate()


async def run(args: Any, tmp: str) -> None:
    """``bench --part scale``: the run and its table (the leader's death left out with
    ``--quick``), or one line saying why not."""
    print(f"\nscale: mldserver run servers (each with its real KCL daemon) on one {SHARDS}-shard kinesis-local "
          f"stream, one Iceberg table; servers join, one dies, {'' if args.quick else 'then the leader, '}"
          f"records put throughout")
    try:
        scale = await run_scale(tmp, quick=args.quick)
    except ConfigError as exc:
        print(f"  skipped: {exc}")
        return
    for line in scale.table():
        print(line)
