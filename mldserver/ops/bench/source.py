"""``mldserver bench --part source``: a Kinesis stream read by the server itself
(``serve --source kinesis:STREAM``) against the same stream read by the real KCL
daemon through the relay (``mldserver run``), in one run, on local emulators.

kinesis-local holds a stream of ``--shards`` shards (2 by default) filled with
``RECORDS`` records of 1 KiB; DynamoDB Local keeps the daemon's leases
(``ops.emulators``: ``scripts/setup --test`` installs both). Each side reads the whole
stream from its trim horizon with the same handler (``Timed``: it reads every
record's ``data`` and checkpoints every few seconds), then gets records put one by one
(``PROBES``, 20 a second) whose data carries the time of its put. Reported side by
side:

- records/s, from the first shard initialized to the last record of the stream
  handled (the daemon's minute of start-up left out; kinesis-local's GetRecords of
  10 MB pages, JSON for the server and CBOR for the daemon's Java SDK, is part of it);
- CPU per record: every process of the side (the server and its handler processes;
  with the daemon, the JVM and the relays too: the JVM's share is shown) over the
  same span;
- the floor: the same pages, read once, parsed by orjson and every record's data
  base64-decoded in one loop (no call, no process between: the relay part's ceiling);
- from a put to the handler, p50 and p99 (each side polls an idle shard every 250 ms:
  the daemon's ``idleTimeBetweenReadsInMillis``, the server's ``source_poll_interval``).

The handler counts into one file per process and shard under ``MLDSERVER_BENCH_OUT``::

    40000                  # records handled in one batch
    40 231.5 198.0 ...     # a batch with probe records of this run: their latencies, ms
"""

from __future__ import annotations

import asyncio
import binascii
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from ...api.handler import Handler
from ...sources.kinesis import LIMIT
from .common import cpu_spent, descendants, tree_cpu_s

RECORDS, SIZE, PROBES = 20_000, 1024, 100
PROBE = b"P"  # a probe's data: P, the run's letter, its put time in ns (19 digits), padding


class Timed(Handler):
    """Reads every record's ``data``; writes what it handled, and the probes' latencies."""

    async def initialize(self, shard):
        out = Path(os.environ["MLDSERVER_BENCH_OUT"])
        self.run = os.environ["MLDSERVER_BENCH_RUN"].encode()
        self.file = open(out / f"{os.getpid()}-{shard.shard_id.replace('/', '_')}.txt", "a")
        self.checkpointed = time.monotonic()

    async def process_records(self, batch, checkpointer):
        now = time.time_ns()
        latencies = []
        for record in batch.records:
            data = record.data
            if data[:1] == PROBE and data[1:2] == self.run:
                latencies.append((now - int(data[2:21])) / 1e6)
        if batch.records:
            self.file.write(" ".join([str(len(batch.records)), *(f"{ms:.1f}" for ms in latencies)]) + "\n")
            self.file.flush()
            if time.monotonic() - self.checkpointed > 5:
                await checkpointer.checkpoint()
                self.checkpointed = time.monotonic()


def handled(out: Path) -> tuple[int, list[float]]:
    """Records handled so far, and the probes' latencies (ms)."""
    count, latencies = 0, []
    for path in out.glob("*.txt"):
        for line in path.read_text().splitlines():
            n, *ms = line.split()
            count += int(n)
            latencies += map(float, ms)
    return count, latencies


def put_all(client, stream: str, n: int) -> None:
    """``n`` records of SIZE bytes, 500 a call, four calls at a time, keys spread over
    the shards."""
    from concurrent.futures import ThreadPoolExecutor

    payload = os.urandom(SIZE)

    def put(start: int) -> None:
        entries = [{"Data": payload, "PartitionKey": f"pk-{i}"} for i in range(start, min(n, start + 500))]
        failed = client.put_records(StreamName=stream, Records=entries)["FailedRecordCount"]
        if failed:
            raise RuntimeError(f"kinesis-local refused {failed} records of a put")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, range(0, n, 500)))


async def probe(client, stream: str, run: bytes, n: int) -> None:
    """``n`` probe records, 20 a second, each with its put time."""
    for i in range(n):
        data = PROBE + run + str(time.time_ns()).zfill(19).encode() + bytes(SIZE - 21)
        await asyncio.to_thread(client.put_record, StreamName=stream, Data=data, PartitionKey=f"probe-{i}")
        await asyncio.sleep(0.05)


async def until(check, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the server exited {proc.returncode} (its log: {proc.args[-1]})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:g} s")
        await asyncio.sleep(0.05)


async def measure(side: str, argv: list[str], env: dict[str, str], out: Path, total: int, run: bytes,
                  client, stream: str, probes: int, log: Path) -> dict[str, float]:
    """One side: start it, time the stream read to its end, probe it, stop it."""
    out.mkdir()
    env = {**os.environ, **env, "MLDSERVER_BENCH_OUT": str(out), "MLDSERVER_BENCH_RUN": run.decode()}
    proc = subprocess.Popen([*argv, "--log-file", str(log)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # From the first shard initialized (the daemon's minute of start-up left out): the
        # reads, the hand-over and the handler, every page of the stream.
        await until(lambda: log.exists() and b'"event":"initialize"' in log.read_bytes(), 300,
                    f"{side}: the first shard initialized", proc)
        first, started = handled(out)[0], time.perf_counter()
        before = tree_cpu_s([proc.pid])
        await until(lambda: handled(out)[0] >= total, 600, f"{side}: the whole stream", proc)
        seconds = time.perf_counter() - started
        after = tree_cpu_s([proc.pid])
        jvm = [p for p in after if b"java" in _cmdline(p)]
        counted = handled(out)[0] - first
        await probe(client, stream, run, probes)
        await until(lambda: len(handled(out)[1]) >= probes, 120, f"{side}: the probes", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    latencies = sorted(handled(out)[1])
    per = 1e6 / counted if counted else float("nan")  # nan: the whole stream came in the first batches
    return {
        "records/s": counted / seconds if counted else float("nan"),
        "cpu": cpu_spent(before, after) * per,
        "jvm": cpu_spent({p: before.get(p, 0.0) for p in jvm}, {p: after[p] for p in jvm}) * per,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def floor(client, stream: str) -> tuple[int, float]:
    """(records, CPU us a record) with no call and no process between: the stream's
    pages, read once as kinesis-local sent them, parsed by orjson and every record's
    data base64-decoded in one loop (the relay part's ceiling, on these pages)."""
    bodies: list[bytes] = []

    def keep(response_dict, **_) -> None:
        bodies.append(bytes(response_dict["body"]))

    event = "before-parse.kinesis.GetRecords"
    client.meta.events.register_first(event, keep)
    try:
        for shard in client.list_shards(StreamName=stream)["Shards"]:
            it = client.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                           ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            while it:
                page = client.get_records(ShardIterator=it, Limit=LIMIT)
                it = page.get("NextShardIterator") if page.get("Records") else None  # (an empty page: its head)
    finally:
        client.meta.events.unregister(event, keep)
    records, cpu = 0, time.process_time()
    for body in bodies:
        for record in orjson.loads(body).get("Records") or ():
            binascii.a2b_base64(record["Data"])
            records += 1
    return records, (time.process_time() - cpu) / max(records, 1) * 1e6


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def run(args, tmp: str) -> None:
    from ..emulators import DynamoDBLocal, KinesisLocal, daemon_properties

    shards = args.shards[0] if args.shards != [1, 32] else 2
    records, probes = (2_000, 20) if args.quick else (RECORDS, PROBES)
    base = Path(tmp) / "source"
    base.mkdir()
    print(f"\nsource: a stream of {shards} shards, {records:,} records x {SIZE} B then {probes} put one by one "
          f"(kinesis-local), read by the server (--source) and by the KCL daemon through the relay")
    kinesis, dynamodb = KinesisLocal(base), DynamoDBLocal(base)
    try:
        kinesis.create_stream("bench", shards)
        await asyncio.to_thread(put_all, kinesis.client, "bench", records)
        parsed, least = await asyncio.to_thread(floor, kinesis.client, "bench")
        aws = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1"}
        common = ["--handler", f"{__name__}:Timed", "--port", "0", "--admin", "off", "--log-level", "info"]
        polling = base / "source.toml"  # polled as often as the daemon's properties ask (250 ms)
        polling.write_text("source_poll_interval = 0.25\n")
        own = await measure(
            "--source", [sys.executable, "-m", "mldserver", "serve", "--source", "kinesis:bench",
                         "--state-dir", str(base / "state-source"), "--config", str(polling), *common],
            {**aws, "AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint}, base / "out-source", records, b"a",
            kinesis.client, "bench", probes, base / "source.log")
        properties = daemon_properties(base / "bench.properties", stream="bench", app=f"bench-{os.getpid()}",
                                       kinesis=kinesis.endpoint, dynamodb=dynamodb.endpoint)
        daemon = await measure(
            "daemon", [sys.executable, "-m", "mldserver", "run", "--properties", str(properties),
                       "--state-dir", str(base / "state-daemon"), *common],
            aws, base / "out-daemon", records + probes, b"b", kinesis.client, "bench", probes, base / "daemon.log")
    finally:
        kinesis.terminate()
        dynamodb.terminate()
    print(f"  {'path':<28} {'records/s':>10} {'CPU us/record':>14} {'of which JVM':>13} {'put to handler p50 / p99':>25}")
    for name, r in (("serve --source kinesis:", own), ("KCL daemon + relay (run)", daemon)):
        print(f"  {name:<28} {r['records/s']:10,.0f} {r['cpu']:14.1f} {r['jvm']:13.1f} "
              f"{r['p50']:11.0f} / {r['p99']:.0f} ms")
    print(f"  {'floor (orjson, base64)':<28} {'':>10} {least:14.1f}    ({parsed:,} records: the pages parsed and "
          f"their data decoded in one loop)")
    print(f"  --source against the daemon: {own['records/s'] / daemon['records/s']:.2f}x records/s, "
          f"{own['cpu'] / daemon['cpu']:.2f}x CPU per record")
