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
    mldserver-demo/stderr.log                      what the server's processes wrote on stderr

The console has the demo's own lines only: its progress every 2 s, then a summary (the
windows, late rows and dead letters and where to find them). A sink that keeps failing
(``sink_commit_failed`` ``FAILED_ATTEMPTS`` times for one window) stops the demo with one
line naming the cause and the log to read, and exit status 1::

    demo stopped: the sink cannot commit window 1795814160000-1795814220000 (3 attempts): SparkError:
    Py4JJavaError: An error occurred while calling o62.save. <- org.apache.hadoop.fs.ParentNotDirectoryException:
    Parent path is not a directory: file:/.../output/_staging; see mldserver-demo/server.log (sink_commit_failed)

A Ctrl-C (SIGINT) or a SIGTERM stops it the same way, in order (exit status 130 or
143, as a shell says it); a second one is Python's own (it stops at once)::

    demo stopped: interrupted (Ctrl-C); a second one stops it at once
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from ..base.config import Settings
from ..coordinator.committer import SinkFailing
from ..examples.orders import change_record
from ..base.logs import configure
from ..server.server import Server
from ..api.testing import SHARD_END, FakeDaemon, make_records, relay_command
from .daemon_messages import EXCEPTION, deepest_cause

BATCH = 1000
WINDOW = 60.0
SPAN_MS = 20 * 60_000  # the event time the demo's orders cover
CUSTOMERS = 500
FAILED_ATTEMPTS = 3  # one window's commit failed this often: the demo stops and says why


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
        failing = coordinator.committer.failing
        print(
            f"  {time.perf_counter() - started:5.1f} s  records in {sent[0]:>9,}   "
            f"windows committed {coordinator.committer.windows_committed:>3}   rows buffered {coordinator.status().buffered_rows:>8,}"
            + ("" if failing is None else f"   a commit failed ({failing.attempts} of {FAILED_ATTEMPTS} attempts)"),
            flush=True,
        )


class DemoStopped(Exception):
    """The demo cannot go on: its one line says why (and which log to read)."""


async def _sink_watch(server: Server, log_path: Path) -> None:
    """Raise DemoStopped once one window's commit has failed FAILED_ATTEMPTS times."""
    committer = server.coordinator.committer  # type: ignore[union-attr]
    while True:
        await asyncio.sleep(0.2)
        failing = committer.failing
        if failing is not None and failing.attempts >= FAILED_ATTEMPTS:
            raise DemoStopped(_sink_failing(failing, log_path))


def _sink_failing(failing: SinkFailing, log_path: Path) -> str:
    return (f"the sink cannot commit window {failing.window} ({failing.attempts} attempts): "
            f"{cause(failing.error)}; see {log_path} (sink_commit_failed)")


def cause(error: str, limit: int = 400) -> str:
    r"""An error message (a Python one, or a Spark one carrying Java's stack trace) as one
    line: its first line, and the Java exception under it when there is one (the deepest
    ``Caused by:``, where the trouble began)::

        cause("SparkError: Py4JJavaError: An error occurred while calling o62.save.\n"
              ": org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o\n"
              "\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs(RawLocalFileSystem.java:873)")
        -> "SparkError: Py4JJavaError: An error occurred while calling o62.save. <- "
           "org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o"
    """
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    thrown = next((line.removeprefix(": ") for line in lines[1:] if EXCEPTION.match(line.removeprefix(": "))), None)
    java = deepest_cause(lines[1:]) or thrown
    text = lines[0] + (f" <- {java}" if java else "")
    return text if len(text) <= limit else text[:limit - 3] + "..."


async def _feed(server: Server, daemon: FakeDaemon, shards: int, records: int, sent: list[int],
                fed: list[float]) -> list:
    """Every shard's orders through the relays, the split midway; the live shards once
    every window is committed (or 120 s have passed). ``fed`` gets the time
    (``time.perf_counter``) the last order was in."""
    coordinator = server.coordinator
    assert coordinator is not None
    now = int(time.time() * 1000)
    t0 = now - SPAN_MS - 120_000  # orders from about 22 minutes ago until 2 minutes ago
    t_split = t0 + SPAN_MS * 2 // 3
    per_shard = records // (shards + 1)  # the split's two children share one shard's part
    half = (records - per_shard * shards) // 2
    ids = [f"shardId-{i:012d}" for i in range(shards)]
    conversations = await asyncio.gather(*(daemon.shard(i) for i in ids))
    parent = conversations[0]
    children: list = []

    async def split() -> None:
        """The parent's orders, then at once its SHARD_END and its children's orders, as
        the daemon does beside the other shards. (Ended only once every shard had sent
        all, the parent sat quiet for as long as the others took: past the 10 s
        idle_timeout on a busy machine, then windows closed without it, and its
        children's orders were late.)"""
        await _drive(parent, 10**20, per_shard, 0, t0, t_split, sent)
        await parent.shard_ended()
        print(f"  split {parent.shard_id}: SHARD_END checkpointed, its uncommitted rows spooled")
        children.extend(await asyncio.gather(*(daemon.shard(f"shardId-{shards + i:012d}") for i in range(2))))
        await asyncio.gather(
            *(
                _drive(c, 10**20 * (shards + 2 + i), half, (shards + i) * per_shard, t_split, t0 + SPAN_MS, sent)
                for i, c in enumerate(children)
            )
        )

    await asyncio.gather(
        split(),
        *(_drive(s, 10**20 * (n + 1), per_shard, n * per_shard, t0, t0 + SPAN_MS, sent)
          for n, s in enumerate(conversations) if n),
    )
    fed.append(time.perf_counter())
    deadline = time.monotonic() + 120
    while coordinator.status().buffered_rows and time.monotonic() < deadline:  # every window closed and committed
        await asyncio.sleep(0.2)
    return conversations[1:] + list(children)


async def _interrupted() -> tuple[str, int]:
    """Returns at the first Ctrl-C (SIGINT) or SIGTERM, saying which, and the exit
    status a shell gives a process it ended (128 + the signal: 130, 143); the next one
    is the default again (a second Ctrl-C stops the demo at once, as in ``serve``)."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[int] = loop.create_future()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, lambda sig=sig: got.done() or got.set_result(sig))
    try:
        sig = await got
    finally:
        for s in signals:
            loop.remove_signal_handler(s)
    return ("interrupted (Ctrl-C)" if sig == signal.SIGINT else "stopped by SIGTERM"), 128 + sig


def dead_letters(state: Path) -> tuple[int, int]:
    """(entries, files) in the state dir's dead letters: one JSON line each."""
    files = sorted((state / "dead-letters").glob("*.jsonl"))
    return sum(f.read_bytes().count(b"\n") for f in files), len(files)


async def run(shards: int, records: int, directory: Path, admin: str = "off") -> None:
    for old in ("state", "output", "server.log"):
        target = directory / old
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "server.log"
    configure("json", "info", str(log_path))
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
        shutdown_timeout=5.0,  # a stopped demo's shards wait behind a failing commit: not for long
    )
    print("starting the server and its Spark process (embedded Spark, local[*]) ...", flush=True)
    server = Server(settings)
    await server.start()
    host, port = server.address
    print(f"server listening on {host}:{port}; relay: mldserver connect {host}:{port}", flush=True)
    if server.admin is not None and server.admin.bound:
        a_host, a_port = server.admin.bound
        print(f"admin endpoint http://{a_host}:{a_port}/: watch it with "
              f"`mldserver status --watch --admin {a_host}:{a_port}`", flush=True)
    coordinator = server.coordinator
    assert coordinator is not None

    sent = [0]
    started = time.perf_counter()
    daemon = FakeDaemon(relay_command(host, port), timeout=120.0)  # a failing sink is _sink_watch's to tell
    progress = asyncio.create_task(_progress(server, sent, started))
    watch = asyncio.create_task(_sink_watch(server, log_path))
    fed: list[float] = []
    feed = asyncio.create_task(_feed(server, daemon, shards, records, sent, fed))
    interrupt = asyncio.create_task(_interrupted())
    stopped: str | None = None
    code = 1  # the exit status when it stops early (a signal: _interrupted's)
    try:
        await asyncio.wait([feed, watch, interrupt], return_when=asyncio.FIRST_COMPLETED)
        if interrupt.done():
            said, code = interrupt.result()
            stopped = f"{said}; a second one stops it at once"
        elif watch.done():
            stopped = str(watch.exception())
        elif feed.exception() is not None:
            exc = feed.exception()
            stopped = (f"a shard's conversation failed ({type(exc).__name__}: {exc}"[:300] + "); the server's "
                       f"log says why: {log_path}")
            failing = coordinator.committer.failing
            if failing is not None:  # the daemon's wait ran out behind a failing commit
                stopped = _sink_failing(failing, log_path)
    finally:
        for task in (progress, watch, feed, interrupt):
            task.cancel()
        await asyncio.gather(progress, watch, feed, interrupt, return_exceptions=True)
    elapsed = time.perf_counter() - started
    if stopped is None:
        live = feed.result()
        await asyncio.gather(*(s.shutdown_requested() for s in live))  # checkpoints what is committed
        await asyncio.gather(*(s.lease_lost() for s in live))
        await asyncio.gather(*(s.close() for s in daemon.shards))
    else:
        print(f"demo stopped: {stopped}", flush=True)
        print(f"  stopping the server (at most {settings.shutdown_timeout:g} s for the shards waiting behind it) ...",
              flush=True)
    await daemon.close()  # every relay ended: the server's connections end with them
    sink = coordinator.committer.sink
    await server.shutdown()

    output = directory / "output"
    state = directory / "state"
    print()
    print("summary")
    print(f"  records in          {sent[0]:,} over {len(daemon.shards)} shards"
          + (" (one split into two)" if stopped is None else ""))
    print(f"  windows committed   {coordinator.committer.windows_committed} ({WINDOW:.0f} s of event time each), "
          f"{coordinator.committer.rows_committed:,} rows in")
    print(f"  rows out            {getattr(sink, 'rows_out', 0):,} (orders per customer per window)")
    late = coordinator.status().late_rows
    print(f"  late rows           {late:,}" + ("" if not late else
          f" (their window had closed: committed with a later one, counted in each commit's \"late\" in "
          f"{output / '_commits'} and in window_committed in {log_path})"))
    letters, files = dead_letters(state)
    print(f"  dead letters        {letters:,}" + ("" if not letters else
          f" in {files} files under {state / 'dead-letters'} (records not processed, each with its data, "
          f"reason and error; `mldserver redrive` sends them again)"))
    if elapsed > 0 and stopped is None:
        print(f"  throughput          {coordinator.committer.rows_committed / elapsed:,.0f} records/s end to end "
              f"({elapsed:.1f} s, relay to committed Spark output)")
        if fed:  # the stream goes quiet: its last window closes at the idle timeout, not by a later record
            print(f"                      every order in at {fed[0] - started:.1f} s; the last window then waits "
                  f"for the {settings.idle_timeout:g} s idle_timeout (no later order closes it)")
        stored = sum(1 for v in daemon.checkpoints.values() if v != SHARD_END)
        print(f"  checkpoints         {stored} shards at their last committed record, 1 at SHARD_END")
    buffered = coordinator.status().buffered_rows
    if buffered:
        print(f"  NOT COMMITTED       {buffered:,} rows (see {log_path})")
    print(f"  output              {output}  (spark.read.parquet or pyarrow.dataset; commit log in _commits/)")
    print(f"  server log          {log_path}")
    print(f"  server stderr       {directory / 'stderr.log'}")
    print(f"  Spark log           {state / 'spark' / 'spark.log'}")
    if stopped is not None or buffered:
        raise SystemExit(code)


def main(args) -> None:
    import uvloop

    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    with _stderr_to(directory / "stderr.log"):
        uvloop.run(run(args.shards, args.records, directory, getattr(args, "admin", None) or "off"))


@contextlib.contextmanager
def _stderr_to(path: Path):
    """The processes the server starts (handler processes, Spark's JVM before its own log
    opens) write on file descriptor 2: into ``path`` for the demo, whose console is its own
    lines; this process's ``sys.stderr`` stays the terminal."""
    sys.stderr.flush()
    terminal = os.dup(2)
    with open(path, "wb") as file:
        os.dup2(file.fileno(), 2)
    saved = sys.stderr
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = saved
        os.dup2(terminal, 2)
        os.close(terminal)
