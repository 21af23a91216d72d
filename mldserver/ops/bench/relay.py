"""``mldserver bench --part relay``: throughput, latency and memory, side by side in one run.

The fake daemon drives K shards in lock-step, the daemon's way (one batch, then wait
for its status), N batches of R records of B bytes each, against:

- ``mldserver``   the server (its own process) through one relay per shard;
- ``direct``      the same server over direct TCP connections (no relay): the relay's cost;
- ``amazon_kclpy`` one amazon_kclpy child process per shard (the package inside the PyPI
                   wheel kclpy-ext), as the MultiLangDaemon runs it today;
- ``ceiling``     orjson plus base64 decoding of the same lines in a tight loop, one core;
- ``+scrape``     with ``--scrape SECONDS``: the ``mldserver`` variant again with its admin
                   endpoint's ``/metrics`` scraped every SECONDS, as Prometheus would (the
                   cost of metrics, side by side with the unscraped run).

Every handler does the same work: decode each record's data and add up its length.
CPU per record is every process of a side over the timed part (user and system time):
the server, its handler processes and the relays, or the amazon_kclpy children; it
decides how many shards a core serves, where records/s on a shared machine only hints.
Under each server's rows, that CPU by process (the server alone, its handler processes,
the relays), beside the fake daemon's own (this process: not counted, but it shares the
machine) and the server's share of one core: the part that bounds records/s is the one
near a whole core.
Memory is PSS (shared pages split between the processes that map them), sampled
during the run, peak reported; "per shard" is one relay (or one kclpy child) plus the
server's whole PSS divided by K.

The variants take turns for three rounds (one with ``--quick``), each round's order the
reverse of the one before: a shared machine's speed drifts by 10% and more between
runs, and a single run of each swung 2.6x-3.3x against amazon_kclpy at 32 shards of
1 KiB. The rows are the median round's (by the first server's records/s against the
round's amazon_kclpy run), all from that one round; under them, each server's records/s
and CPU a record against amazon_kclpy's in every round, so the spread is on record
beside the median::

    over 3 rounds taking turns, mldserver w2 against amazon_kclpy: records/s 2.71x 2.88x 3.02x
      (median 2.88x); CPU a record 0.27x 0.28x 0.26x (median 0.27x)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ...api.testing import Child, FakeDaemon, Shard, SocketChild, relay_command
from .common import Sampler, close_shards, cpu_s, cpu_spent, descendants, free_port, pss_kb, rss_kb, start_server, tree_cpu_s


KCLPY_CHILD = """
from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

class Touch(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        pass
    def process_records(self, process_records_input):
        total = 0
        for record in process_records_input.records:
            total += len(record.binary_data)
    def lease_lost(self, lease_lost_input):
        pass
    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()
    def shutdown_requested(self, shutdown_requested_input):
        pass

kcl.KCLProcess(Touch()).run()
"""


def batch_line(first_seq: int, records: int, size: int) -> tuple[bytes, dict]:
    payload = base64.b64encode(os.urandom(size)).decode("ascii")
    recs = [
        {"action": "record", "data": payload, "partitionKey": f"pk-{i}", "sequenceNumber": str(first_seq + i),
         "subSequenceNumber": 0, "approximateArrivalTimestamp": 1476889707000 + i}
        for i in range(records)
    ]
    line = orjson.dumps({"action": "processRecords", "records": recs, "millisBehindLatest": 0}) + b"\n"
    return line, recs[-1]


@dataclass
class RelayResult:
    name: str
    shards: int
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    round_trips: list[float] = field(default_factory=list)
    per_shard_pss_kb: float = 0.0
    total_pss_kb: int = 0
    server_cpu_s: float = 0.0  # the server's CPU seconds during the run
    handlers_cpu_s: float | None = None  # its handler processes' (None: it has none)
    relays_cpu_s: float | None = None  # the relays' (None: there are none)
    daemon_cpu_s: float = 0.0  # the fake daemon's (this process's), not counted in cpu_s
    cpu_s: float = 0.0  # every process of the side: server, handler processes and relays (or the kclpy children)
    server_peaks_kb: list[int] = field(default_factory=list)  # the server's, then its handler processes'
    checkpoints: dict = field(default_factory=dict)  # what the fake daemon stored, by shard (a sanity check)

    @property
    def cpu_us_per_record(self) -> float:
        return self.server_cpu_s / self.records * 1e6 if self.records else 0.0

    @property
    def all_cpu_us_per_record(self) -> float:
        return self.cpu_s / self.records * 1e6 if self.records else 0.0

    def cpu_by_process(self) -> str:
        """Where a record's CPU went: the server, its handler processes, the relays, the
        fake daemon; and the server's share of one core."""
        def us(seconds: float) -> str:
            return f"{seconds / self.records * 1e6:.2f} us" if self.records else "-"

        core = self.server_cpu_s / self.seconds if self.seconds else 0.0
        return (f"CPU a record: server {us(self.server_cpu_s)} ({core:.0%} of a core)"
                + ("" if self.handlers_cpu_s is None else f", handler processes {us(self.handlers_cpu_s)}")
                + ("" if self.relays_cpu_s is None else f", relays {us(self.relays_cpu_s)}")
                + f"; the fake daemon {us(self.daemon_cpu_s)}")

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    def row(self, baseline: "RelayResult | None") -> str:
        rt = sorted(self.round_trips) or [0.0]
        p50 = rt[len(rt) // 2] * 1000
        p99 = rt[min(len(rt) - 1, int(len(rt) * 0.99))] * 1000
        ratio = f"{self.rate / baseline.rate:5.2f}x" if baseline and baseline.rate else "   - "
        cpu = f"{self.all_cpu_us_per_record:7.2f}" if self.cpu_s else f"{'-':>7}"
        cpu_ratio = (f"{self.all_cpu_us_per_record / baseline.all_cpu_us_per_record:5.2f}x"
                     if baseline and baseline.cpu_s and self.cpu_s else "   - ")
        mem = f"{self.per_shard_pss_kb / 1024:7.1f} {self.total_pss_kb / 1024:8.1f}" if self.total_pss_kb else f"{'-':>7} {'-':>8}"
        return (f"  {self.name:13} {self.shards:4d} {self.rate:12,.0f} {ratio} {self.bytes / self.seconds / 1e6:8.1f} "
                f"{p50:8.1f} {p99:8.1f} {cpu} {cpu_ratio} {mem}")


HEADER = (f"  {'variant':13} {'K':>4} {'records/s':>12} {'vs kclpy':>6} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'us CPU/r':>7} {'vs kclpy':>6} {'MiB/shd':>7} {'MiB all':>8}")


async def drive(shards: list[Shard], line: bytes, last: dict, batches: int, result: RelayResult) -> None:
    async def one(shard: Shard) -> None:
        for _ in range(batches):
            t0 = time.perf_counter()
            await shard.process_line(line, last)
            result.round_trips.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(one(s) for s in shards))
    result.seconds = time.perf_counter() - started


SCRAPED = "+scrape"


TOUCH = "mldserver.ops.bench.touch:TouchHandler"


async def run_variant(name: str, k: int, records: int, size: int, batches: int, tmp: str,
                      workers: int | None = None, scrape: float | None = None, *, handler: str = TOUCH,
                      kclpy_child: str = KCLPY_CHILD) -> RelayResult:
    """One run on a fresh server (memory left by an earlier run must not count);
    ``workers``: its handler processes (their memory counts as the server's);
    ``handler`` the server's, ``kclpy_child`` the script each amazon_kclpy child runs."""
    server = None
    admin = f"127.0.0.1:{free_port()}" if name == SCRAPED else "off"
    if name != "amazon_kclpy":
        server, port = await start_server(os.path.join(tmp, f"state-{name}-{k}-{workers}"), admin=admin,
                                          workers=workers, handler=handler)
    scraper = None
    if name == SCRAPED:
        assert scrape is not None
        scraper = asyncio.ensure_future(_scrape(f"http://{admin}/metrics", scrape))
    try:
        result = await _run_variant("mldserver" if name == SCRAPED else name, k, records, size, batches,
                                    port if server else None, server.pid if server else None, tmp, kclpy_child)
        result.name = name if workers is None else f"{name} w{workers}"
        return result
    finally:
        if scraper is not None:
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
        if server is not None:
            server.terminate()
            server.wait(30)


async def _scrape(url: str, every: float) -> None:
    """GET ``url`` every ``every`` seconds (Prometheus's way: the next after the last)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url) as resp:
                await resp.read()
            await asyncio.sleep(every)


async def _run_variant(name: str, k: int, records: int, size: int, batches: int, port: int | None,
                       server_pid: int | None, tmp: str, kclpy_child: str = KCLPY_CHILD) -> RelayResult:
    line, last = batch_line(10**50, records, size)
    daemon = FakeDaemon("", timeout=600)
    sampler = Sampler()
    shards: list[Shard] = []
    script = Path(tmp) / "kclpy_child.py"
    if name == "amazon_kclpy":
        script.write_text(kclpy_child)
    for i in range(k):
        if name == "direct":
            child: Child = await SocketChild.open("127.0.0.1", port)  # type: ignore[arg-type]
        elif name == "mldserver":
            child = await Child.spawn(relay_command("127.0.0.1", port))  # type: ignore[arg-type]
        else:
            child = await Child.spawn(f"{sys.executable} {script}")
        shard = Shard(daemon, f"shardId-{i:012d}", child)
        await shard.initialize("TRIM_HORIZON", 0)
        shards.append(shard)
    if name != "direct":
        sampler.pids["children"] = [s.child.proc.pid for s in shards]
    if server_pid and name != "amazon_kclpy":
        sampler.trees["server"] = server_pid  # with its handler processes
    result = RelayResult(name, k, records * batches * k, len(line) * batches * k)
    sampler.start()
    # The side's CPU: the server's tree (itself, its handler processes) and the children's.
    servers = [server_pid] if server_pid else []
    children = [s.child.proc.pid for s in shards if name != "direct"]
    cpu, server_tree, child_trees = cpu_s(server_pid) if server_pid else 0.0, tree_cpu_s(servers), tree_cpu_s(children)
    driving = time.process_time()
    await drive(shards, line, last, batches, result)
    result.daemon_cpu_s = time.process_time() - driving
    result.server_cpu_s = cpu_s(server_pid) - cpu if server_pid else 0.0
    server_after = tree_cpu_s(servers)
    children_cpu = cpu_spent(child_trees, tree_cpu_s(children))
    result.cpu_s = cpu_spent(server_tree, server_after) + children_cpu
    if len(server_after) > 1:  # (the server has handler processes)
        result.handlers_cpu_s = cpu_spent(server_tree, server_after) - result.server_cpu_s
    if name == "mldserver":
        result.relays_cpu_s = children_cpu
    await sampler.stop()
    await close_shards(shards)
    result.checkpoints = dict(daemon.checkpoints)
    children, server = sampler.peak.get("children", 0), sampler.peak.get("server", 0)
    result.total_pss_kb = children + server
    result.per_shard_pss_kb = (children + server) / k
    if server_pid:
        peaks = sampler.by_pid.get("server", {})
        result.server_peaks_kb = [peaks.get(server_pid, 0)] + [kb for p, kb in sorted(peaks.items()) if p != server_pid]
    return result


def ceiling(records: int, size: int, batches: int) -> RelayResult:
    line, _ = batch_line(10**50, records, size)
    result = RelayResult("ceiling", 1, records * batches, len(line) * batches)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        t0 = time.perf_counter()
        message = orjson.loads(line)
        total = 0
        for r in message["records"]:
            total += len(binascii.a2b_base64(r["data"]))
        result.round_trips.append(time.perf_counter() - t0)
    result.seconds = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu
    return result


async def relay_startup(port: int) -> tuple[float, int, int]:
    """Milliseconds from spawn to the first relayed status, and the relay's RSS and PSS in KiB."""
    t0 = time.perf_counter()
    child = await Child.spawn(relay_command("127.0.0.1", port))
    shard = Shard(FakeDaemon(""), "shardId-startup", child)
    await shard.initialize()
    ms = (time.perf_counter() - t0) * 1000
    rss, pss = rss_kb(child.proc.pid), pss_kb(child.proc.pid)
    await shard.lease_lost()
    await shard.close()
    return ms, rss, pss


Round = dict[tuple[str, int | None], RelayResult]  # (variant, workers) -> its run in one round


def median_round(rounds: list[Round], server: tuple[str, int | None], with_kclpy: bool) -> Round:
    """The round whose ``server`` run is the median one: by its records/s against the
    round's amazon_kclpy run, or by its records/s alone without one. Its rows are shown
    together, so each row's ratio is one round's."""
    def key(r: Round) -> float:
        ours = r[server].rate
        return ours / r["amazon_kclpy", None].rate if with_kclpy and r["amazon_kclpy", None].rate else ours

    return sorted(rounds, key=key)[len(rounds) // 2]


def spread(name: str, pairs: list[tuple[RelayResult, RelayResult]]) -> str:
    """A server's records/s and CPU a record against amazon_kclpy's, round by round
    (``pairs``: the server's run and amazon_kclpy's of each round), and their medians."""
    def line(ratios: list[float]) -> str:
        return f"{' '.join(f'{x:.2f}x' for x in ratios)} (median {statistics.median(ratios):.2f}x)"

    rates = [a.rate / b.rate for a, b in pairs if b.rate]
    cpus = [a.all_cpu_us_per_record / b.all_cpu_us_per_record for a, b in pairs if a.cpu_s and b.cpu_s]
    return (f"  over {len(pairs)} round{'s' if len(pairs) > 1 else ''} taking turns, {name} against amazon_kclpy: "
            f"records/s {line(rates)}" + (f"; CPU a record {line(cpus)}" if cpus else ""))


def batches_for(k: int, records: int, size: int, quick: bool) -> int:
    if quick:
        return 2
    budget = 400_000_000  # JSON bytes per run: a few seconds per variant, enough to smooth out noise
    per_batch = records * (size * 4 // 3 + 130)
    return max(3, budget // (per_batch * k))


async def run(args, shard_counts: list[int], with_kclpy: bool, tmp: str) -> None:
    """The relay part: start-up cost, then every load at every shard count."""
    loads = [tuple(int(x) for x in spec.split("x")) for spec in args.load]
    scrape = getattr(args, "scrape", None)
    server, port = await start_server(os.path.join(tmp, "state"), workers=args.workers[0])
    try:
        ms, rss, pss = await relay_startup(port)
        print(f"relay start-up: {ms:.0f} ms to the first status; RSS {rss / 1024:.1f} MiB, PSS {pss / 1024:.1f} MiB")
        idle = sum(pss_kb(p) for p in descendants(server.pid))
        print(f"server idle (--workers {args.workers[0]}, with its handler processes): PSS {idle / 1024:.1f} MiB")
    finally:
        server.terminate()
        server.wait(30)
    for records, size in loads:
        print(f"\nload: batches of {records:,} records x {size} B (lock-step per shard)")
        print(HEADER)
        c = ceiling(records, size, batches_for(1, records, size, args.quick))
        for k in shard_counts:
            batches = args.batches or batches_for(k, records, size, args.quick)
            variants = ([("amazon_kclpy", None)] if with_kclpy else []) + [
                (name, w) for w in args.workers for name in ("mldserver", "direct")]
            rounds: list[Round] = []
            for r in range(1 if args.quick else 3):  # rounds taking turns, as the coordinator part's
                rounds.append({})
                for name, w in variants if r % 2 == 0 else variants[::-1]:
                    rounds[-1][name, w] = await run_variant(name, k, records, size, batches, tmp, w)
            shown = median_round(rounds, ("mldserver", args.workers[0]), with_kclpy)
            base = shown.get(("amazon_kclpy", None))
            rows = [shown[v] for v in variants]
            pairs = [(w, shown["mldserver", w], shown["direct", w]) for w in args.workers]
            if scrape:
                scraped = await run_variant(SCRAPED, k, records, size, batches, tmp, args.workers[0], scrape)
                rows.append(scraped)
            for r in rows:
                print(r.row(base))
            if k == shard_counts[0]:
                print(c.row(base))
            for w, relay, direct in pairs:
                print(f"  --workers {w}, K={k}: relay cost {100 * (1 - relay.rate / direct.rate):+.1f}% records/s "
                      f"vs direct" + (f"; memory per shard {relay.per_shard_pss_kb / base.per_shard_pss_kb:.2f}x "
                                      f"one amazon_kclpy child" if base is not None else ""))
                if relay.server_peaks_kb:
                    server_kb, *handlers = relay.server_peaks_kb
                    print(f"    peak PSS: server {server_kb / 1024:.1f} MiB"
                          + (f", handler processes {', '.join(f'{kb / 1024:.1f}' for kb in handlers)} MiB"
                             if handlers else ""))
                for variant in (relay, direct):
                    print(f"    {variant.name}: {variant.cpu_by_process()}")
                if with_kclpy:
                    print(spread(relay.name, [(x["mldserver", w], x["amazon_kclpy", None]) for x in rounds]))
            if scrape:
                relay = pairs[0][1]
                print(f"  /metrics every {scrape:g} s at K={k}: {scraped.rate:,.0f} vs {relay.rate:,.0f} records/s "
                      f"({100 * (scraped.rate / relay.rate - 1):+.1f}%); server CPU "
                      f"{scraped.cpu_us_per_record:.2f} vs {relay.cpu_us_per_record:.2f} us/record "
                      f"({100 * (scraped.cpu_us_per_record / relay.cpu_us_per_record - 1):+.1f}%)")
