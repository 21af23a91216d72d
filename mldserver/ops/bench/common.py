"""What every part of ``mldserver bench`` shares: a server in its own process, memory
figures from /proc, and the batches the coordinator and Spark parts feed::

    server, port = await start_server(tmp, "--sink", f"file:{tmp}/out", handler=PASSTHROUGH)
    sampler = Sampler()
    sampler.pids["server"] = [server.pid]
    sampler.start()
    ...                                   # drive the shards
    await sampler.stop()                  # sampler.peak["server"]: the peak PSS in KiB
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time

from typing import Any, Iterable, NamedTuple

import orjson

from ..emulators import STARTS, free_port, listens

# One row per record with everything the record carries (shipped with the package).
PASSTHROUGH = "mldserver.examples.passthrough:Passthrough"
RECORDS, SIZE = 10_000, 100  # the coordinator and Spark parts' batches


class Check(NamedTuple):
    """One promise a campaign holds the server to (chaos, outside, killed): ok or not, and why."""

    name: str
    ok: bool
    detail: str


def some(items: Iterable[Any], n: int = 3) -> str:
    """The first ``n`` of ``items``, sorted, and how many more: for a check's detail."""
    items = sorted(items)
    more = f" (and {len(items) - n} more)" if len(items) > n else ""
    return "; ".join(str(i) for i in items[:n]) + more


def epoch(ts: str) -> float:
    """A log event's ``ts`` (``2026-11-21T10:00:00.123Z``) as seconds since the epoch."""
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def alive(pid: int) -> bool:
    """A process that runs (not a zombie waiting for its parent to read its status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


_handled_files: dict[str, Any] = {}


def handled_file(env: str) -> Any:
    """A handler process's file of what it handled, ``$<env>/<pid>.handled`` (opened once,
    appended to): the chaos campaign's and the killed phase's handlers write there."""
    if env not in _handled_files:
        directory = os.environ.get(env)
        if not directory:
            raise RuntimeError(f"{env} is not set: the bench's handler writes what it handled there")
        _handled_files[env] = open(os.path.join(directory, f"{os.getpid()}.handled"), "a")
    return _handled_files[env]


def _proc_kb(pid: int, file: str, key: str) -> int:
    """One ``Key: N kB`` figure from /proc/<pid>/<file> (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kb(pid: int) -> int:
    """Proportional set size: shared pages split between the processes mapping them."""
    return _proc_kb(pid, "smaps_rollup", "Pss:")


def rss_kb(pid: int) -> int:
    return _proc_kb(pid, "status", "VmRSS:")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used: less sensitive than
    throughput to what else a shared machine runs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def tree_cpu_s(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each process in the trees below ``pids`` (each pid included): read
    before and after a run, the difference is what every process of a side spent
    (``cpu_spent``), the processes started during the run included."""
    return {p: cpu_s(p) for root in pids for p in descendants(root)}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two ``tree_cpu_s`` readings (a process new in ``after`` counts whole)."""
    return sum(t - before.get(p, 0.0) for p, t in after.items())


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the server and its handler and Spark processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


class Sampler:
    """Samples the PSS of a set of processes while a run goes on; keeps the peak.
    ``trees`` groups are a process and all its descendants, found at each sample.

    Every ``PERIOD`` seconds, or less often for large processes: reading PSS walks
    every page a process maps (``smaps_rollup``), some 18 ms a sample (up to 29) for a
    coordinator run's server and handler processes holding 700 MiB against 8 ms for the
    no-pipeline run's, and on a machine of two cores that time is taken from the
    processes measured. The pause after a sample is at least ``1 / BUDGET`` times the
    sample's own time, so the sampler never takes more than ``BUDGET`` of a core, however
    large what it samples (at a fixed 0.2 s, 9% of a core in the run with a sink against
    4% without: a cost charged to the sink)."""

    PERIOD = 0.2
    BUDGET = 0.02  # of one core

    def __init__(self) -> None:
        self.pids: dict[str, list[int]] = {}
        self.trees: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.by_pid: dict[str, dict[int, int]] = {}  # each process's own peak, by group
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def sample(self) -> None:
        groups = {**self.pids, **{group: descendants(pid) for group, pid in self.trees.items()}}
        for group, pids in groups.items():
            each = {p: pss_kb(p) for p in pids}
            self.peak[group] = max(self.peak.get(group, 0), sum(each.values()))
            peaks = self.by_pid.setdefault(group, {})
            for p, kb in each.items():
                peaks[p] = max(peaks.get(p, 0), kb)

    async def _loop(self) -> None:
        while True:
            took = await asyncio.to_thread(self._timed_sample)
            await asyncio.sleep(max(self.PERIOD, took / self.BUDGET))

    def _timed_sample(self) -> float:
        """``sample``, and the CPU seconds it took (its thread's, the kernel's included)."""
        started = time.thread_time()
        self.sample()
        return time.thread_time() - started

    async def stop(self) -> None:
        assert self._task
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.sample()


async def open_shards(port: int, k: int, daemon: Any = None) -> list[Any]:
    """``k`` shards on direct connections to the server at ``port`` (no relay), each
    initialized at TRIM_HORIZON, as the fake daemon drives them in every bench part."""
    from ...api.testing import FakeDaemon, Shard, SocketChild

    daemon = daemon or FakeDaemon("", timeout=600)
    shards = []
    for i in range(k):
        shard = Shard(daemon, f"shardId-{i:012d}", await SocketChild.open("127.0.0.1", port))
        await shard.initialize("TRIM_HORIZON", 0)
        shards.append(shard)
    return shards


async def close_shards(shards: list[Any]) -> None:
    """The end of a run, as the daemon ends it: each shard's lease lost, then its
    connection closed (the status of each awaited)."""
    for shard in shards:
        await shard.lease_lost()
        await shard.close(30)


async def start_server(
    state_dir: str,
    *extra: str,
    handler: str = "mldserver.ops.bench.touch:TouchHandler",
    env: dict[str, str] | None = None,
    timeout: float = 30,
    admin: str = "off",
    workers: int | None = None,
) -> tuple[subprocess.Popen, int]:
    """``mldserver serve`` in its own process; ``admin`` off unless asked for (a bench
    run must not take the default admin port from a server running beside it). Up when
    the server itself listens on its port: one whose port another process bound first
    exits, and is started again on another (``STARTS`` tries), never taken for up
    because the other answers there."""
    if workers is not None:
        extra = (*extra, "--workers", str(workers))
    for _ in range(STARTS):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "mldserver", "serve", "--handler", handler, "--port",
             str(port), "--log-level", "warning", "--state-dir", state_dir, "--admin", admin, *extra],
            stdout=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if listens(proc.pid, port):
                return proc, port
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"bench server did not listen on port {port} within {timeout:g} s")
    raise RuntimeError(f"bench server exited as it started, {STARTS} times (its port taken each time?)")


def lines(batches: int, ms_per_batch: int = 10_000, align_ms: int = 1) -> list[tuple[bytes, dict]]:
    """``batches`` processRecords lines of RECORDS records, each batch covering
    ``ms_per_batch`` of event time, starting a day ago (at a multiple of ``align_ms``:
    say, the start of a window)."""
    payload = base64.b64encode(os.urandom(SIZE)).decode("ascii")
    start = time.time_ns() // 1_000_000 - 86_400_000  # a day ago: a caught-up watermark passes it all
    start -= start % align_ms
    out = []
    for b in range(batches):
        recs = [
            {"action": "record", "data": payload, "partitionKey": f"pk-{i}",
             "sequenceNumber": str(10**40 + b * RECORDS + i), "subSequenceNumber": 0,
             "approximateArrivalTimestamp": start + b * ms_per_batch + i * ms_per_batch // RECORDS}
            for i in range(RECORDS)
        ]
        line = orjson.dumps({"action": "processRecords", "records": recs, "millisBehindLatest": 1000}) + b"\n"
        out.append((line, recs[-1]))
    return out
