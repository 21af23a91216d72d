"""The chaos bench's ``run`` phase: ``mldserver run`` (the server and the real KCL
daemon as its child) SIGKILLed under load, then run again on the same state dir, a few
times; and the checks that say whether it kept its promises: nothing lost, nothing
left running, health told the truth.

kinesis-local holds a stream of ``shards`` shards; DynamoDB Local keeps the daemon's
leases (``ops.emulators``). ``mldserver run --workers 1 --sink file:DIR --window 1``
serves it with ``Kept``, a handler that emits one row a record, checkpoints each
batch's last record (the server keeps that to what the sink committed) and appends
what it saw to ``$MLDSERVER_KILLED_DIR/<pid>.handled``, rows and lines tagged with the
run (``$MLDSERVER_KILLED_RUN``: 1 for the first start, 2 for the restart after the
first kill, ...)::

    {"shard":"shardId-000000000000","seq":"49660182386224312845061740288","run":"1"}   # a row

    1 init shardId-000000000000 TRIM_HORIZON 0                           # .handled lines
    1 rec shardId-000000000000 49660182386224312845061740288 1763719200.123
    2 init shardId-000000000000 49660182386224312845061740288 0

Then, for each kill: ``BURST`` records a shard are put and handled, and their shards'
checkpoints stored in the lease table; records go on being put one by one for a
seeded while (0.5 to 5 s: the kill lands with records in flight, handled but not
committed, committed but not checkpointed); the server is SIGKILLed; ``BURST`` more
records a shard are put while it is down, and it is started again. Measured each time:
seconds until the daemon (its pid from ``<state-dir>/daemon/daemon.pid``) is gone, and
every process of the killed run (the relays and the handler process: whatever has the
run's ``$MLDSERVER_KILLED_RUN`` in its environment); seconds until the restart answers
``/readyz`` 200, and until it served the records put after the kill; and which records
the restart handled again though the checkpoint stored at the kill covered them (a
shard re-read from TRIM_HORIZON, or from anywhere behind its checkpoint). At the end
every record's row must be in the sink, the server is stopped (SIGTERM) and ``/proc``
is searched for what is left.

The checks (``Killed.checks``):

- every shard resumed at the checkpoint stored at the kill, and no record at or before
  it was handled again;
- every record put has its row in the sink. The file sink keeps no commit log, so a
  record committed but not yet checkpointed at a kill is read again by the restart and
  committed again (at least once: mldserver/sinks/file.py, docs/sources.md); so a
  record may have rows of several runs, but never two of one run, and none of a run
  after a kill at which its shard's stored checkpoint covered it;
- the daemon and every process of a killed run gone within ``GONE_WITHIN`` s of the
  SIGKILL (``ops.tether``, the handler process's parent-death signal, the relays' pipes),
  and nothing started by any run (its environment, or a command line naming the state
  dir or the properties file) left running after the final stop, which exits 0;
- ``/readyz`` (polled every ``POLL`` s throughout) never 200 from a kill until the
  restart listened, and 200 at every poll from the restart serving records until the
  next kill or the final stop (a poll is judged where it was sent and answered within
  one of those spans: one a kill cut off, or answered by the killed server, is not).
  (Readiness is the server's: it says ready once it listens, before the restarted
  daemon has its leases back, which the table shows.)

::

    killed = await run_phase(tmp, seed=7, kills=2, shards=2)
    for line in killed.table():
        print(line)          # figures a kill a column, then ok/FAIL for each check
    assert all(c.ok for c in killed.checks())

``bench --part chaos`` runs it last (``lines``: 3 kills, 1 with ``--quick``), or
says why not when the emulators or the daemon's jars are not installed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from ...api.handler import Handler
from ...errors import ConfigError
from ..tether import Pidfile, started
from .common import Check, epoch, handled_file, some
from .outside import get

HANDLER = "mldserver.ops.bench.killed:Kept"
ENV, RUN = "MLDSERVER_KILLED_DIR", "MLDSERVER_KILLED_RUN"
STREAM = "killed"
BURST = 10  # records a shard put before each kill, and again while the server is down
GONE_WITHIN = 20.0  # s from a SIGKILL to the daemon and every process of the run gone
FIRST_START = 300.0  # s to the first records handled (the daemon's first leases: about a minute)
RESTART = 300.0  # s for a restart to serve what was put after the kill
SETTLED = 120.0  # s for checkpoints to be stored, rows to be committed
POLL = 0.25  # s between /readyz polls
HASH_KEYS = 1 << 128
# Quick windows and checkpoints, so that rows commit and checkpoints are stored within
# seconds: a kill then finds every stage (handled, committed, checkpointed) in flight.
CONFIG = "watermark_margin = 1.0\ncheckpoint_interval = 2.0\n"

# -- the handler (runs in the handler process) ---------------------------------------------------



def _handled() -> Any:
    """This process's file of handled records (opened once, appended to)."""
    return handled_file(ENV)


class Kept(Handler):
    """One row a record for the sink, tagged with the run; what it saw, so tagged, in the
    ``.handled`` file (flushed before the checkpoint); checkpoints each batch's last."""

    async def initialize(self, shard):
        self.shard_id = shard.shard_id
        self.run = os.environ.get(RUN, "0")
        f = _handled()
        f.write(f"{self.run} init {shard.shard_id} {shard.sequence_number} {shard.sub_sequence_number or 0}\n")
        f.flush()

    async def process_records(self, batch, checkpointer):
        if not batch.records:
            return
        now = time.time()
        for record in batch.records:
            batch.emit(record, {"shard": self.shard_id, "seq": record.sequence_number, "run": self.run})
        f = _handled()
        f.write("".join(f"{self.run} rec {self.shard_id} {r.sequence_number} {now:.3f}\n" for r in batch.records))
        f.flush()
        last = batch.records[-1]
        await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


class Seen:
    """What the handler wrote, by run: ``initialized[run][shard]`` (sequence number,
    sub-sequence number) and ``handled[run]`` {(shard, seq): first time handled}."""

    def __init__(self, directory: Path | None = None) -> None:
        self.initialized: dict[int, dict[str, tuple[str, int]]] = defaultdict(dict)
        self.handled: dict[int, dict[tuple[str, str], float]] = defaultdict(dict)
        for path in directory.glob("*.handled") if directory is not None else ():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5 and parts[1] == "init":
                    self.initialized[int(parts[0])][parts[2]] = (parts[3], int(parts[4]))
                elif len(parts) == 5 and parts[1] == "rec":
                    self.handled[int(parts[0])].setdefault((parts[2], parts[3]), float(parts[4]))

    def all(self) -> set[tuple[str, str]]:
        return {k for by_run in self.handled.values() for k in by_run}


# -- what was measured ----------------------------------------------------------------------------


class Poll(NamedTuple):
    """One ``/readyz`` poll. It tells of the server between ``sent`` and ``answered``
    (time.time()), and is judged only where that span lies within one phase: an answer
    the server gave just before a kill, read just after it, is no lie, nor is a request
    the kill cut off."""

    sent: float
    answered: float
    status: int | None  # None: no answer


@dataclass
class Kill:
    at_s: float  # seconds of records put one by one before the SIGKILL (seeded)
    trickled: int = 0  # records put meanwhile
    stored: dict[str, tuple[str, int]] = field(default_factory=dict)  # lease checkpoints once the daemon was gone
    covered: set[tuple[str, str]] = field(default_factory=set)  # records put at or before them
    daemon_gone_s: float | None = None
    run_gone_s: float | None = None  # every process of the killed run
    left: list[str] = field(default_factory=list)  # processes of the killed run still there past GONE_WITHIN
    killed_at: float = 0.0  # time.time()
    restarted_at: float = 0.0  # time.time(): the restart's process started
    listened_at: float | None = None  # time.time(): the restart's ``listening`` event
    ready_s: float | None = None  # from the restart to /readyz 200
    served_s: float | None = None  # from the restart to every record put after the kill handled
    served_at: float | None = None  # time.time(): the first of them handled
    resumed: dict[str, tuple[str, int]] = field(default_factory=dict)  # the restart's initialize positions
    reread: set[tuple[str, str]] = field(default_factory=set)  # covered records the restart handled again
    leftover_stopped: int = 0  # daemon_leftover_stopped events of the restart


@dataclass
class Killed:
    seed: int
    shards: int
    first_start_s: float = 0.0
    put: set[tuple[str, str]] = field(default_factory=set)
    kills: list[Kill] = field(default_factory=list)
    rows: Counter = field(default_factory=Counter)  # (shard, seq, run) -> rows in the sink
    seen: Seen = field(default_factory=Seen)  # what the handler wrote
    polls: list[Poll] = field(default_factory=list)  # every /readyz poll
    stopped_at: float = 0.0  # time.time(): SIGTERM for the final stop
    exit_code: int | None = None
    left: list[str] = field(default_factory=list)  # processes left after the final stop
    problem: str | None = None  # what cut the phase short

    def checks(self) -> list[Check]:
        out = []
        moved = [f"kill {i}: {s} stored {k.stored[s]}, resumed at {k.resumed.get(s)}"
                 for i, k in enumerate(self.kills, 1) for s in k.stored if k.resumed.get(s) != k.stored[s]]
        reread = {r for k in self.kills for r in k.reread}
        covered = sum(len(k.covered) for k in self.kills)
        detail = f"{len(self.kills)} restarts, {covered} records covered by a checkpoint at a kill"
        if moved:
            detail += f"; resumed elsewhere: {some(moved)}"
        if reread:
            detail += f"; handled again: {some(f'{s} {q}' for s, q in reread)}"
        out.append(Check("every shard resumed at its checkpoint, nothing checkpointed read again",
                         bool(self.kills) and not moved and not reread and not self.problem,
                         detail + (f"; {self.problem}" if self.problem else "")))

        kept = {(s, q) for s, q, _ in self.rows}
        missing, stray = self.put - kept, kept - self.put
        doubled = {k: n for k, n in self.rows.items() if n > 1}  # twice by one run
        again = {(s, q, run) for i, k in enumerate(self.kills, 1) for s, q, run in self.rows
                 if run > i and (s, q) in k.covered}  # committed after a kill whose checkpoint covered it
        runs = Counter((s, q) for s, q, _ in self.rows)
        detail = (f"{len(self.put)} records put, {sum(self.rows.values())} rows; {sum(n > 1 for n in runs.values())} "
                  f"records committed by two runs (committed, not yet checkpointed at a kill: the file sink's "
                  f"at least once)")
        if missing:
            detail += f"; no row: {some(f'{s} {q}' for s, q in missing)}"
        if stray:
            detail += f"; rows of records never put: {some(f'{s} {q}' for s, q in stray)}"
        if doubled:
            detail += f"; twice by one run: {some(f'{s} {q} run {r} x{n}' for (s, q, r), n in doubled.items())}"
        if again:
            detail += (f"; committed again though checkpointed at a kill: "
                       f"{some(f'{s} {q} by run {r}' for s, q, r in again)}")
        out.append(Check("every record's row in the sink, none again once checkpointed",
                         not missing and not stray and not doubled and not again, detail))

        slow = [f"kill {i}: daemon {_s(k.daemon_gone_s)}, run {_s(k.run_gone_s)}"
                + (f" ({some(k.left)})" if k.left else "")
                for i, k in enumerate(self.kills, 1) if k.run_gone_s is None or k.daemon_gone_s is None]
        detail = (f"daemon gone {_span(k.daemon_gone_s for k in self.kills)}, the killed run's processes "
                  f"{_span(k.run_gone_s for k in self.kills)}; final stop exit {self.exit_code}; "
                  f"leftover daemons stopped at restarts {sum(k.leftover_stopped for k in self.kills)}")
        if slow:
            detail += f"; not within {GONE_WITHIN:g} s: {'; '.join(slow)}"
        if self.left:
            detail += f"; left after the final stop: {some(self.left)}"
        out.append(Check(f"nothing left running (a killed run's within {GONE_WITHIN:g} s, all after the stop)",
                         not slow and not self.left and self.exit_code == 0, detail))

        down = up = 0
        lies = []
        for i, k in enumerate(self.kills, 1):
            until = self.kills[i].killed_at if i < len(self.kills) else self.stopped_at
            for sent, answered, status in self.polls:
                if k.killed_at <= sent and answered < (k.listened_at or until):
                    down += 1
                    if status == 200:
                        lies.append(f"kill {i}: 200 at {sent - k.killed_at:.1f} s, before the restart listened")
                elif k.served_at is not None and k.served_at <= sent and answered < until:
                    up += 1
                    if status != 200:
                        lies.append(f"kill {i}: {status or 'no answer'} at {sent - k.killed_at:.1f} s, after "
                                    f"the restart served")
        unserved = [i for i, k in enumerate(self.kills, 1) if k.served_at is None]
        detail = f"{down} polls while down (none 200), {up} while serving again (each 200)"
        if lies:
            detail += f"; {len(lies)} wrong: {some(lies)}"
        if unserved:
            detail += f"; restarts that never served: {unserved}"
        out.append(Check("/readyz told the truth: not ready until the restart listened, ready once it served",
                         bool(self.kills) and not lies and not unserved, detail))
        return out

    def table(self) -> list[str]:
        checks = self.checks()
        lines = [f"  run killed: mldserver run (the KCL daemon) on kinesis-local + DynamoDB Local, {self.shards} "
                 f"shards, --sink file: (1 s windows); first start {self.first_start_s:.0f} s; "
                 f"{len(self.put)} records put; seed {self.seed}"]
        width = 44

        def row(label: str, values) -> str:
            return f"    {label:{width}}" + "".join(f"{v:>10}" for v in values)

        ks = self.kills
        seen = self.seen
        # What the run killed handled and its restart handled again (kill i ends run i), and
        # of those what both committed.
        again = [(seen.handled[i].keys() & seen.handled[i + 1].keys()) - k.reread for i, k in enumerate(ks, 1)]
        committed = [{(s, q) for s, q, run in self.rows if run == i} & {(s, q) for s, q, run in self.rows
                                                                        if run == i + 1} for i in range(1, len(ks) + 1)]
        lines += [row("", (f"kill {i}" for i in range(1, len(ks) + 1))),
                  row("records put one by one before it (s)", (f"{k.at_s:.1f}" for k in ks)),
                  row("records put one by one before it", (k.trickled for k in ks)),
                  row("records checkpointed at it", (len(k.covered) for k in ks)),
                  row("daemon gone (s)", (_s(k.daemon_gone_s) for k in ks)),
                  row("every process of the run gone (s)", (_s(k.run_gone_s) for k in ks)),
                  row("restart: /readyz 200 (s)", (_s(k.ready_s) for k in ks)),
                  row("restart: served what was put after (s)", (_s(k.served_s) for k in ks)),
                  row("shards resumed at their checkpoint",
                      (f"{sum(k.resumed.get(s) == p for s, p in k.stored.items())}/{len(k.stored)}" for k in ks)),
                  row("checkpointed records read again", (len(k.reread) for k in ks)),
                  row("others read again (handled, not checkpointed)", (len(a) for a in again)),
                  row("  of which committed again", (len(a & c) for a, c in zip(again, committed)))]
        for check in checks:
            lines.append(f"    {'ok  ' if check.ok else 'FAIL'} {check.name}"
                         + (f": {check.detail[:1000]}" if check.detail and not check.ok else ""))
        return lines


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.2f}" if seconds < 10 else f"{seconds:.0f}"


def _span(values) -> str:
    seen = [v for v in values if v is not None]
    return "-" if not seen else f"{min(seen):.2f}-{max(seen):.2f} s"


def sink_rows(sink_dir: Path) -> Counter:
    """(shard id, sequence number, run) of every row the file sink committed, with how
    many times (``outside.sink_rows``, with the run ``Kept`` tags its rows with)."""
    seen: Counter = Counter()
    for path in Path(sink_dir).glob("*.jsonl"):
        if not path.name.startswith("_"):  # the sink's temporary names
            for line in path.read_bytes().splitlines():
                row = orjson.loads(line)
                seen[(row["shard"], row["seq"], int(row["run"]))] += 1
    return seen


def _after(stored: tuple[str, int] | None, sequence_number: str) -> bool:
    """Is a record at or before a stored checkpoint (a sequence number, not
    TRIM_HORIZON or the like)?"""
    return stored is not None and stored[0].isdigit() and int(sequence_number) <= int(stored[0])


# -- the processes -------------------------------------------------------------------------------


def ours(marks: list[bytes], env_marks: list[bytes]) -> list[str]:
    """Processes (not zombies) whose command line holds one of ``marks`` or whose
    environment holds every one of ``env_marks``: ``pid command``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            if started(int(name)) is None:
                continue
            try:
                environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            except OSError:
                environ = []
        except OSError:
            continue
        if any(m in cmdline for m in marks) or (env_marks and all(m in environ for m in env_marks)):
            command = cmdline.replace(b"\0", b" ").decode("utf-8", "replace")[:120].strip()
            found.append(f"{name} {command}")
    return found


class Phase:
    """One phase's components and runs (``run_phase`` drives it)."""

    def __init__(self, base: Path, seed: int, shards: int, kinesis: Any, dynamodb: Any) -> None:
        from ..emulators import daemon_properties, free_port

        self.base, self.kinesis, self.dynamodb = base, kinesis, dynamodb
        self.app = f"bench-killed-{os.getpid()}-{seed}"
        self.state, self.sink, self.handled = base / "state", base / "out", base / "handled"
        self.handled.mkdir(parents=True)
        self.config = base / "killed.toml"
        self.config.write_text(CONFIG)
        self.properties = daemon_properties(base / "killed.properties", stream=STREAM, app=self.app,
                                            kinesis=kinesis.endpoint, dynamodb=dynamodb.endpoint)
        self.admin = ("127.0.0.1", free_port())
        self.result = Killed(seed, shards)
        self.proc: subprocess.Popen | None = None
        self.run = 0
        self.log: Path | None = None

    # -- the stream

    def put(self, records: list[tuple[int, str]]) -> list[tuple[str, str]]:
        """(shard index, data) records, each put on its shard: their (shard id, sequence number)."""
        shards = self.result.shards
        entries = [{"Data": data.encode(), "PartitionKey": data,
                    "ExplicitHashKey": str(i * (HASH_KEYS // shards) + 1)} for i, data in records]
        out = []
        for start in range(0, len(entries), 500):
            answer = self.kinesis.client.put_records(StreamName=STREAM, Records=entries[start:start + 500])
            if answer.get("FailedRecordCount"):
                raise RuntimeError(f"kinesis-local refused {answer['FailedRecordCount']} records of a put")
            out += [(r["ShardId"], r["SequenceNumber"]) for r in answer["Records"]]
        self.result.put.update(out)
        return out

    async def burst(self, tag: str) -> set[tuple[str, str]]:
        records = [(i, f"{tag}-{i}-{n}") for n in range(BURST) for i in range(self.result.shards)]
        return set(await asyncio.to_thread(self.put, records))

    # -- the server

    async def start(self) -> None:
        self.run += 1
        self.log = self.base / f"run-{self.run}.log"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
               "AWS_REGION": "us-east-1", ENV: str(self.handled), RUN: str(self.run)}
        with open(self.base / f"run-{self.run}.stderr", "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mldserver", "run", "--properties", str(self.properties),
                 "--handler", HANDLER, "--port", "0", "--state-dir", str(self.state), "--log-file", str(self.log),
                 "--log-level", "info", "--admin", f"{self.admin[0]}:{self.admin[1]}", "--workers", "1",
                 "--sink", f"file:{self.sink}", "--window", "1", "--config", str(self.config)],
                env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        await self.until(lambda: self.event("daemon_started"), 120, "mldserver run: the daemon started")

    def events(self) -> list[dict]:
        if self.log is None or not self.log.exists():
            return []
        return [orjson.loads(line) for line in self.log.read_bytes().splitlines() if line.startswith(b"{")]

    def event(self, name: str) -> dict | None:
        return next((e for e in self.events() if e.get("event") == name), None)

    async def until(self, check, timeout: float, what: str, *, server: bool = True) -> Any:
        """Poll ``check`` until true; RuntimeError if the server exits meanwhile, or
        TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            if result := await asyncio.to_thread(check):
                return result
            if server and self.proc is not None and self.proc.poll() is not None:
                err = (self.base / f"run-{self.run}.stderr").read_text()[-1000:]
                raise RuntimeError(f"{what}: mldserver run exited {self.proc.returncode} ({self.log}): {err}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            await asyncio.sleep(0.1)

    def seen(self) -> Seen:
        return Seen(self.handled)

    def checkpointed(self, records: set[tuple[str, str]]) -> bool:
        stored = self.dynamodb.leases(self.app)
        return all(_after(stored.get(s), q) for s, q in records)

    async def poll_ready(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sent = time.time()
            answer = await get(self.admin, "/readyz", timeout=2.0)
            self.result.polls.append(Poll(sent, time.time(), None if answer is None else answer[0]))
            try:
                await asyncio.wait_for(stop.wait(), POLL)
            except TimeoutError:
                pass

    async def kill(self, rng: random.Random) -> bool:
        """One kill and the restart after it; False if the restart did not serve."""
        r = self.result
        before = await self.burst(f"k{len(r.kills) + 1}")
        await self.until(lambda: before <= self.seen().all(), SETTLED, "the burst handled")
        await self.until(lambda: self.checkpointed(before), SETTLED, "the burst checkpointed")
        kill = Kill(at_s=rng.uniform(0.5, 5.0))
        r.kills.append(kill)
        loop = asyncio.get_running_loop()
        until = loop.time() + kill.at_s
        n = 0
        while loop.time() < until:  # one by one, round the shards, as fast as they go
            await asyncio.to_thread(self.put, [(n % r.shards, f"t{len(r.kills)}-{n}")])
            n += 1
        kill.trickled = n

        held = Pidfile(self.state / "daemon" / "daemon.pid").read()
        if held is None:
            raise RuntimeError(f"no daemon pidfile under {self.state}")
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        kill.killed_at, began = time.time(), time.monotonic()
        await asyncio.to_thread(self.proc.wait)
        gone_by = began + GONE_WITHIN
        while started(held["pid"]) == held["started"] and time.monotonic() < gone_by:
            await asyncio.sleep(0.01)
        if started(held["pid"]) != held["started"]:
            kill.daemon_gone_s = time.monotonic() - began
        marks = [f"{ENV}={self.handled}".encode(), f"{RUN}={self.run}".encode()]
        while (left := ours([], marks)) and time.monotonic() < gone_by:
            await asyncio.sleep(0.05)
        kill.left = left
        if not left:
            kill.run_gone_s = time.monotonic() - began
        # The daemon is gone: what the lease table holds now is what the restart resumes at.
        kill.stored = await asyncio.to_thread(self.dynamodb.leases, self.app)
        kill.covered = {(s, q) for s, q in r.put if _after(kill.stored.get(s), q)}

        after = await self.burst(f"a{len(r.kills)}")
        kill.restarted_at, began = time.time(), time.monotonic()
        run = self.run + 1
        await self.start()
        listening = self.event("listening")
        kill.listened_at = epoch(listening["ts"]) if listening else None
        kill.leftover_stopped = sum(1 for e in self.events() if e.get("event") == "daemon_leftover_stopped")
        try:
            await self.until(lambda: after <= self.seen().handled[run].keys(), RESTART,
                             "the restart served what was put after the kill")
        except TimeoutError as exc:
            r.problem = f"kill {len(r.kills)}: {exc}"
            return False
        kill.served_s = time.monotonic() - began
        seen = self.seen()
        kill.served_at = min(seen.handled[run][k] for k in after)
        ready = [p.answered for p in r.polls if p.sent >= kill.restarted_at and p.status == 200]
        kill.ready_s = ready[0] - kill.restarted_at if ready else None
        kill.resumed = {s: seen.initialized[run].get(s) for s in kill.stored}
        kill.reread = kill.covered & seen.handled[run].keys()
        return True

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.result.stopped_at = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
        self.result.exit_code = proc.returncode


async def run_phase(tmp: str | os.PathLike, *, seed: int, kills: int = 3, shards: int = 3) -> Killed:
    """The phase, in ``tmp/killed``: ``kills`` SIGKILLs of ``mldserver run`` on a stream
    of ``shards`` shards (the module docstring). ConfigError when the emulators or the
    daemon are not installed; RuntimeError or TimeoutError when the first start fails."""
    from ..daemon import jars
    from ..emulators import DynamoDBLocal, KinesisLocal
    from ...server import preflight

    jars()  # ConfigError, before anything is started
    preflight.java("the killed phase (mldserver run)")
    base = Path(tmp) / "killed"
    base.mkdir()
    kinesis = KinesisLocal(base)
    phase = None
    try:
        dynamodb = DynamoDBLocal(base)
        try:
            kinesis.create_stream(STREAM, shards)
            phase = Phase(base, seed, shards, kinesis, dynamodb)
            r = phase.result
            rng = random.Random(f"{seed}/killed")
            stop = asyncio.Event()
            polling = asyncio.create_task(phase.poll_ready(stop))
            try:
                first = await phase.burst("first")
                began = time.monotonic()
                await phase.start()
                await phase.until(lambda: first <= phase.seen().all(), FIRST_START, "the first records handled")
                r.first_start_s = time.monotonic() - began
                for _ in range(kills):
                    if not await phase.kill(rng):
                        break
                try:
                    await phase.until(lambda: r.put <= {(s, q) for s, q, _ in sink_rows(phase.sink)}, SETTLED,
                                      "every record's row in the sink")
                except TimeoutError:
                    pass  # a check says which
            finally:
                stop.set()
                await polling
                await phase.stop()
            r.rows = sink_rows(phase.sink)
            r.seen = phase.seen()
            r.left = ours([str(phase.state).encode(), str(phase.properties).encode()],
                          [f"{ENV}={phase.handled}".encode()])
            return r
        finally:
            if phase is not None and phase.proc is not None and phase.proc.poll() is None:
                os.killpg(phase.proc.pid, signal.SIGKILL)  # a harness error: nothing outlives the phase
                phase.proc.wait()
            dynamodb.terminate()
    finally:
        kinesis.terminate()


async def lines(args, tmp: str, seed: int) -> list[str]:
    """The phase for ``bench --part chaos``: 3 kills (1 with ``--quick``), its table;
    one line saying why not when the emulators or the daemon are not installed."""
    kills = 1 if args.quick else 3
    head = (f"\nkilled: mldserver run SIGKILLed {kills} time{'s' * (kills > 1)}, each at a seeded moment, and "
            f"run again on its state dir")
    try:
        killed = await run_phase(tmp, seed=seed, kills=kills)
    except ConfigError as exc:
        return [head, f"  skipped: {exc}"]
    return [head, *killed.table()]
