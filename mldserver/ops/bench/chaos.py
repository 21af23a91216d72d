"""``mldserver bench --part chaos``: a seeded, randomised chaos campaign against a server
with handler processes, and the checks that say whether it kept its promises: no
connection closed, one status per action, no record lost.

The campaign drives ``shards`` shards through real relays (``mldserver connect``) with the
strict fake daemon (``mldserver.api.testing.FakeDaemon``): each is initialized, then sends
batches in lock-step (one batch, then its status). A batch is poisoned with probability
``fault_rate``: then it holds one record alone, whose partition key names a fault the
handler (``ChaosHandler``, this module's) performs in its handler process:

    exit    os._exit(3)                      segv   ctypes.string_at(0): SIGSEGV in C
    raise   raise RuntimeError               leak   keep 4 MiB for good, then succeed
    sleep   time.sleep past execution_timeout: the process's loop is blocked
    await   await asyncio.sleep past execution_timeout

Every other batch is 5 normal records. Meanwhile a killer SIGKILLs a random live handler
process every ``kill_interval`` seconds or so (randomised), as an OOM killer would. At the
end every shard gets ``shutdownRequested`` or ``shardEnded``, then its stdin is closed.
The same ``seed`` gives the same batches, faults, endings and kill intervals (not the same
timing: which process a kill lands on and what it is running then vary).

The handler appends ``<shard_id> <sequence_number>`` of every record it handles (normal
ones and ``leak`` ones) to ``$MLDSERVER_CHAOS_DIR/<pid>.handled``, flushed before it
checkpoints the batch's last record, so a status means the lines are written. The checks
(``checks``) then hold the server to:

- no connection closed (no ``DaemonExit``: the real daemon would exit, taking every shard
  of the worker with it);
- no status later than ``read_timeout`` seconds (the real daemon waits forever; here the
  shard is given up on: it is stuck, or its batch waited far too long);
- every action answered exactly once (as many statuses as actions, nothing after the last);
- every normal record of an answered batch handled (in a ``.handled`` file);
- every poisoned record dead-lettered with its data (``<state_dir>/dead-letters/<shard>.jsonl``,
  ``mldserver.base.deadletters``), except ``leak`` ones: handled and not dead-lettered;
- every ``shardEnded`` answered with SHARD_END stored;
- no ``driver_crashed`` (nor ``task_crashed``) in the server's log.

A campaign against a server of the caller's (as tests/pool/test_chaos.py runs it)::

    os.environ["MLDSERVER_CHAOS_DIR"] = handled   # before the server starts its processes
    server = Server(Settings(handler=HANDLER, port=0, workers=2, execution_timeout=2.0, ...))
    await server.start()
    report = await campaign(seed=7, shards=16, batches=20, fault_rate=0.08, kill_interval=1.5,
                            server_address=server.address,
                            pids=lambda: [p.pid for p in server.pool.processes if p.alive],
                            handled_dir=handled, state_dir=server.settings.state_dir)
    await server.shutdown()
    for check in checks(report, handled_dir=handled, state_dir=..., events=log_events):
        print("ok  " if check.ok else "FAIL", check.name, check.detail)

With a sink (``served(..., sink_dir=, outside_faults=)``, ``ChaosRowsHandler``) the
checks add that every record its shard checkpointed past has its row in the sink or in
the shard-end spool, once; ``outside.py`` breaks the sink and floods the admin port
meanwhile and adds that health told the truth; and every run checks that no handler
process outlives its server.

``mldserver bench --part chaos [--duration 300] [--seed N]`` runs a server of its own
(``mldserver serve --workers 2 --execution-timeout 2``, 64 batches in flight) with 24
shards, three times: undisturbed (no faults, no kills) for a short while; ``chaos``, one
batch in a thousand poisoned and a handler process SIGKILLed every ~10 s (at full speed
that is about two faults a second); ``storm``, one batch in twenty poisoned and a kill
every ~3 s; ``outside``, ``chaos``'s faults and kills with a file sink (2 s windows, on a
tmpfs of its own where one can be mounted) while its folder is replaced by a file, its
disk filled and the admin port flooded, in turn. Each chaos run lasts ``--duration`` seconds. It prints the three side by side
(actions, faults by kind, outside kills, handler process deaths from the server's
``handler_process_died`` events, connections closed, late statuses, normal batches'
round trips p50/p99/max), then the checks. Last, ``killed.py``'s phase: ``mldserver run``
with the real KCL daemon SIGKILLed and run again (3 times, once with ``--quick``).

What a bystander sees: a shard whose handler process dies has its call redone in another
(milliseconds); a shard whose call waits in a process whose loop another call blocks
(``time.sleep``) waits until that call is interrupted at ``execution_timeout``, as any
asyncio code waits behind a blocked loop. So the worst round trip stays under
``execution_timeout`` plus a few seconds in both runs, while the p99 tells how often a
normal batch shared a process with a fault: rarely in ``chaos``, for one batch in
twenty in ``storm``, where the p99 is ``execution_timeout`` by arithmetic.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import orjson

from ...base.durable import safe_filename
from ...api.handler import Handler
from ...api.testing import SHARD_END, DaemonExit, FakeDaemon, Shard, relay_command
from .common import Check, alive, handled_file, some
from .killed import lines as killed_lines
from .outside import KINDS as OUTSIDE_FAULTS, disturb, sink_rows, spooled_rows

HANDLER = "mldserver.ops.bench.chaos:ChaosHandler"
ROWS_HANDLER = "mldserver.ops.bench.chaos:ChaosRowsHandler"
ENV = "MLDSERVER_CHAOS_DIR"  # where handler processes write what they handled
FAULTS = ("exit", "segv", "raise", "leak", "sleep", "await")
SUCCEEDS = frozenset({"leak"})  # the fault that is no failure: handled, never dead-lettered
RECORDS = 5  # records in a normal batch
LEAK_BYTES = 4 << 20
FIRST_SEQUENCE_NUMBER = 1000
READ_TIMEOUT = 60.0  # seconds the fake daemon waits for a status before it gives the shard up

# -- the handler (runs in handler processes) -------------------------------------------------

_leaked: list[bytes] = []


def _handled() -> Any:
    """This process's file of handled records (opened once, appended to)."""
    return handled_file(ENV)


async def perform(fault: str | None, stall: float) -> None:
    """The fault a partition key names (nothing for any other key)."""
    if fault == "exit":
        os._exit(3)
    elif fault == "segv":
        ctypes.string_at(0)  # reads address 0
    elif fault == "raise":
        raise RuntimeError("chaos: a poisoned record")
    elif fault == "leak":
        _leaked.append(b"x" * LEAK_BYTES)  # written, so resident
    elif fault == "sleep":
        time.sleep(stall)
        raise RuntimeError(f"chaos: blocked the loop {stall} s and was not stopped")
    elif fault == "await":
        await asyncio.sleep(stall)
        raise RuntimeError(f"chaos: awaited {stall} s and was not stopped")


class ChaosHandler(Handler):
    """Performs the fault a record's partition key names; records every record it
    handles in ``$MLDSERVER_CHAOS_DIR/<pid>.handled``, then checkpoints the batch's last."""

    async def process_records(self, batch, checkpointer):
        settings = getattr(self.context, "settings", None)
        stall = 10 * (settings.execution_timeout if settings is not None else 60.0)  # well past it
        for record in batch.records:
            await perform(record.partition_key, stall)
            self.keep(batch, record)
        if batch.records:
            f = _handled()
            f.write("".join(f"{batch.shard.shard_id} {r.sequence_number}\n" for r in batch.records))
            f.flush()
            last = batch.records[-1]
            await checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)


    def keep(self, batch, record) -> None:
        """No rows: the server has no sink (``ChaosRowsHandler`` emits one a record)."""


class ChaosRowsHandler(ChaosHandler):
    """``ChaosHandler`` that emits one row a record it handles, ``{"shard", "seq"}``, for
    a sink: ``checks(..., rows=)`` holds the sink to each exactly once."""

    def keep(self, batch, record) -> None:
        batch.emit(record, {"shard": batch.shard.shard_id, "seq": record.sequence_number})


# -- the campaign -----------------------------------------------------------------------------


class Poison(NamedTuple):
    shard_id: str
    sequence_number: str
    fault: str
    data: str  # base64, as sent


@dataclass
class ChaosReport:
    seed: int
    shards: int
    seconds: float = 0.0
    actions: int = 0  # sent
    statuses: int = 0  # received
    batches: int = 0  # normal batches answered
    faults: Counter = field(default_factory=Counter)  # poisoned batches sent, by fault
    kills: int = 0  # SIGKILLs from outside
    closed: list[str] = field(default_factory=list)  # connections closed (DaemonExit): shard, action, why
    late: list[str] = field(default_factory=list)  # no status within read_timeout: shard, action
    cut_short: list[str] = field(default_factory=list)  # shards that ran out of ``duration`` before ``batches``
    leftovers: list[str] = field(default_factory=list)  # lines after a shard's last status
    not_ended: list[str] = field(default_factory=list)  # shardEnded answered without SHARD_END stored
    round_trips: list[float] = field(default_factory=list)  # seconds, normal batches
    normal: set[tuple[str, str]] = field(default_factory=set)  # (shard id, sequence number) sent
    poisoned: set[Poison] = field(default_factory=set)
    unanswered: set[tuple[str, str]] = field(default_factory=set)  # records of batches closed or late
    checkpoints: dict[str, Any] = field(default_factory=dict)  # the daemon's at the end: shard -> (seq, sub) or SHARD_END

    @property
    def lost(self) -> list[str]:
        """Shards given up on: their connection closed, or a status came too late."""
        return self.closed + self.late

    def percentile(self, q: float) -> float:
        if not self.round_trips:
            return 0.0
        ordered = sorted(self.round_trips)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _record(seq: int, key: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"action": "record", "data": base64.b64encode(orjson.dumps(body)).decode("ascii"), "partitionKey": key,
            "sequenceNumber": str(seq), "subSequenceNumber": 0,
            "approximateArrivalTimestamp": time.time_ns() // 1_000_000}


def _tail(shard: Shard) -> str:
    """The last line the relay wrote on stderr, if any (why it ended)."""
    lines = bytes(shard.child.stderr).decode("utf-8", "replace").strip().splitlines()
    return f"; relay stderr: {lines[-1][:300]}" if lines else ""


async def campaign(
    *,
    seed: int,
    shards: int,
    server_address: tuple[str, int],
    pids: Callable[[], Iterable[int]],
    handled_dir: str | os.PathLike,
    state_dir: str | os.PathLike,
    batches: int | None = None,
    duration: float | None = None,
    fault_rate: float = 0.08,
    kill_interval: float = 1.5,
    read_timeout: float = READ_TIMEOUT,
) -> ChaosReport:
    """Drive ``shards`` shards with ``batches`` batches each, or for ``duration`` seconds
    (whichever ends first), poisoning batches and killing handler processes (``pids()``:
    the live ones) as the module docstring says; 0 for ``fault_rate`` or ``kill_interval``
    turns that off. ``read_timeout``: how long the daemon waits for a status before the
    shard is given up on (generous: a poisoned batch costs timeouts, retries, respawns).
    ``handled_dir`` and ``state_dir`` are the server's, read by ``checks`` (not here)."""
    if batches is None and duration is None:
        raise ValueError("give batches, duration or both")
    loop = asyncio.get_running_loop()
    daemon = FakeDaemon(relay_command(*server_address), timeout=read_timeout)
    report = ChaosReport(seed, shards)
    started = loop.time()
    deadline = None if duration is None else started + duration
    children: list[Shard] = []

    async def answered(shard: Shard, step: Any, what: str) -> bool:
        """One action and its status; False (and the shard given up on) if none came."""
        report.actions += 1
        sent = loop.time()
        try:
            await step
        except TimeoutError:  # (before OSError, its base class)
            report.late.append(f"{shard.shard_id}: no status for {what} within {read_timeout:g} s "
                               f"(sent at {sent - started:.1f} s)")
        except (DaemonExit, OSError) as exc:  # OSError: the relay's stdin is gone (broken pipe)
            report.closed.append(f"{shard.shard_id}: {type(exc).__name__} during {what} "
                                 f"(sent at {sent - started:.1f} s): {exc}{_tail(shard)}")
        else:
            report.statuses += 1
            return True
        await shard.child.kill()
        return False

    async def start(shard_id: str) -> Shard | None:
        shard = await daemon.spawn(shard_id)
        children.append(shard)
        return shard if await answered(shard, shard.initialize(), "initialize") else None

    async def drive(index: int, shard: Shard) -> bool:
        rng = random.Random(f"{seed}/shard/{index}")
        seq = FIRST_SEQUENCE_NUMBER
        n = 0
        while (batches is None or n < batches) and (deadline is None or loop.time() < deadline):
            if fault_rate and rng.random() < fault_rate:
                fault = rng.choice(FAULTS)
                records = [_record(seq, fault, {"shard": shard.shard_id, "batch": n, "fault": fault})]
                report.faults[fault] += 1
                report.poisoned.add(Poison(shard.shard_id, str(seq), fault, records[0]["data"]))
            else:
                fault = None
                records = [_record(seq + i, f"pk-{n}-{i}", {"shard": shard.shard_id, "batch": n, "i": i})
                           for i in range(RECORDS)]
                report.normal.update((shard.shard_id, r["sequenceNumber"]) for r in records)
            seq += len(records)
            n += 1
            sent = loop.time()
            if not await answered(shard, shard.process_records(records), f"processRecords (batch {n - 1})"):
                report.unanswered.update((shard.shard_id, r["sequenceNumber"]) for r in records)
                return False
            if fault is None:
                report.round_trips.append(loop.time() - sent)
                report.batches += 1
        if batches is not None and n < batches:
            report.cut_short.append(f"{shard.shard_id}: {n} of {batches} batches in {duration:g} s")
        return True

    async def end(index: int, shard: Shard) -> None:
        how = random.Random(f"{seed}/end/{index}").choice(("shutdown_requested", "shard_ended"))
        if not await answered(shard, getattr(shard, how)(), how):
            return
        if how == "shard_ended" and daemon.checkpoints.get(shard.shard_id) != SHARD_END:
            report.not_ended.append(f"{shard.shard_id}: stored {daemon.checkpoints.get(shard.shard_id)!r}")
        try:
            code = await shard.close(read_timeout)
        except TimeoutError:
            report.late.append(f"{shard.shard_id}: the relay did not exit within {read_timeout:g} s of its stdin "
                               f"closing{_tail(shard)}")
            await shard.child.kill()
            return
        if code != 0:
            report.closed.append(f"{shard.shard_id}: the relay exited {code} at the end{_tail(shard)}")
        rest = (await shard.child.stdout.read()).strip()
        if rest:
            report.leftovers.append(f"{shard.shard_id}: {rest[:200]!r}")

    async def killer() -> None:
        rng = random.Random(f"{seed}/kills")
        while True:
            await asyncio.sleep(kill_interval * rng.uniform(0.5, 1.5))
            live = sorted(pids())
            if live:
                try:
                    os.kill(rng.choice(live), signal.SIGKILL)
                    report.kills += 1
                except ProcessLookupError:
                    pass

    try:
        ids = [f"shardId-{i:012d}" for i in range(shards)]
        opened = await asyncio.gather(*(start(shard_id) for shard_id in ids))
        killing = asyncio.create_task(killer()) if kill_interval else None
        try:
            going = await asyncio.gather(*(drive(i, s) for i, s in enumerate(opened) if s is not None))
        finally:
            if killing is not None:
                killing.cancel()
                await asyncio.gather(killing, return_exceptions=True)
        still = [(i, s) for i, s in enumerate(opened) if s is not None]
        await asyncio.gather(*(end(i, s) for (i, s), ok in zip(still, going) if ok))
    finally:
        for shard in children:
            await shard.child.kill()  # whatever is left (a harness error): no relay outlives the campaign
    report.seconds = loop.time() - started
    report.checkpoints = dict(daemon.checkpoints)
    return report


# -- the checks -------------------------------------------------------------------------------


def handled_records(handled_dir: str | os.PathLike) -> set[tuple[str, str]]:
    """(shard id, sequence number) of every record the handler processes handled."""
    out = set()
    for path in Path(handled_dir).glob("*.handled"):
        for line in path.read_text().splitlines():
            shard_id, _, seq = line.partition(" ")
            if seq:
                out.add((shard_id, seq))
    return out


def dead_letters(state_dir: str | os.PathLike, shard_ids: Iterable[str]) -> dict[tuple[str, str], list[dict]]:
    """The dead-lettered records of these shards, by (shard id, sequence number)."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for shard_id in shard_ids:
        path = Path(state_dir) / "dead-letters" / f"{safe_filename(shard_id)}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if entry.get("sequence_number") is not None:
                    out[(entry.get("shard_id"), entry["sequence_number"])].append(entry)
    return out


def read_log(path: str | os.PathLike) -> list[dict]:
    """The events of a server's JSON log file (``--log-file``)."""
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.startswith("{")]


def checks(report: ChaosReport, *, handled_dir: str | os.PathLike, state_dir: str | os.PathLike,
           events: Iterable[dict], rows: tuple[Counter, Counter] | None = None) -> list[Check]:
    """What the server promised, held against what the campaign sent and what the
    handler processes, the dead letters and the server's log (``events``: dicts with an
    ``event`` key) say happened; with ``rows`` (``outside.sink_rows`` and ``spooled_rows``:
    what a sink fed by ``ChaosRowsHandler`` and the spool hold), that the row of each
    record its shard checkpointed past is in one or the other, and in neither twice (in
    both is right: a spool is deleted only after the commit of its rows)."""
    handled = handled_records(handled_dir)
    shard_ids = {s for s, _ in report.normal} | {p.shard_id for p in report.poisoned}
    letters = dead_letters(state_dir, shard_ids)
    out = [Check("no connection closed", not report.closed,
                 f"{len(report.closed)} closed: {some(report.closed)}" if report.closed else ""),
           Check("no status late", not report.late,
                 f"{len(report.late)} late: {some(report.late)}" if report.late else "")]

    ok = report.statuses == report.actions and not report.leftovers
    detail = f"{report.actions} actions, {report.statuses} statuses"
    if report.lost:
        detail += f" ({len(report.lost)} shards given up on: above)"
    if report.leftovers:
        detail += f"; lines after the last status: {some(report.leftovers)}"
    out.append(Check("every action answered exactly once", ok, detail))

    answered = report.normal - report.unanswered
    missing = answered - handled
    detail = f"{len(answered)} records of answered batches"
    if report.unanswered:
        detail += f" ({len(report.normal & report.unanswered)} more in batches never answered, not counted)"
    if missing:
        lettered = {k: letters[k][-1].get("error") for k in missing if k in letters}
        detail += (f"; {len(missing)} not handled: {len(lettered)} dead-lettered "
                   f"({some({f'{s} {q}: {e}' for (s, q), e in lettered.items()})}), "
                   f"{len(missing) - len(lettered)} neither handled nor dead-lettered "
                   f"({some(f'{s} {q}' for s, q in missing - lettered.keys())})")
    out.append(Check("every normal record handled", not missing, detail))

    failing = [p for p in report.poisoned
               if p.fault not in SUCCEEDS and (p.shard_id, p.sequence_number) not in report.unanswered]
    absent = [p for p in failing if (p.shard_id, p.sequence_number) not in letters]
    wrong = [p for p in failing if (p.shard_id, p.sequence_number) in letters
             and not any(e.get("data") == p.data for e in letters[(p.shard_id, p.sequence_number)])]
    detail = f"{len(failing)} poisoned records"
    if absent:
        detail += f"; not dead-lettered: {some(f'{p.shard_id} {p.sequence_number} ({p.fault})' for p in absent)}"
    if wrong:
        detail += f"; dead-lettered without their data: {some(f'{p.shard_id} {p.sequence_number}' for p in wrong)}"
    out.append(Check("every poisoned record dead-lettered with its data", not absent and not wrong, detail))

    leaks = [p for p in report.poisoned
             if p.fault in SUCCEEDS and (p.shard_id, p.sequence_number) not in report.unanswered]
    unhandled = [p for p in leaks if (p.shard_id, p.sequence_number) not in handled]
    lettered = [p for p in leaks if (p.shard_id, p.sequence_number) in letters]
    detail = f"{len(leaks)} leak records"
    if unhandled:
        detail += f"; not handled: {some(f'{p.shard_id} {p.sequence_number}' for p in unhandled)}"
    if lettered:
        detail += f"; dead-lettered: {some(f'{p.shard_id} {p.sequence_number}' for p in lettered)}"
    out.append(Check("every leak record handled, none dead-lettered", not unhandled and not lettered, detail))

    out.append(Check("shardEnded stored SHARD_END", not report.not_ended, some(report.not_ended)))

    if rows is not None:
        # A record's row is committed once its shard checkpointed past it (with a sink,
        # checkpoints follow commits); a row not committed yet is read again after a
        # restart, from the checkpoint: not lost (but never twice).
        kept = {(s, q) for s, q in answered | {(p.shard_id, p.sequence_number) for p in leaks}
                if _checkpointed(report.checkpoints.get(s), q)}
        sink, spool = rows
        absent_rows = kept - sink.keys() - spool.keys()
        twice = {k: n for counted in rows for k, n in counted.items() if n > 1}
        stray = (sink.keys() | spool.keys()) - kept - report.normal - report.unanswered - {(p.shard_id, p.sequence_number)
                                                                          for p in report.poisoned if p.fault in SUCCEEDS}
        detail = f"{len(kept)} records answered and checkpointed, {sum(sink.values())} rows in the sink, {sum(spool.values())} spooled"
        if absent_rows:
            detail += f"; missing: {some(f'{s} {q}' for s, q in absent_rows)}"
        if twice:
            detail += f"; more than once: {some(f'{s} {q} x{n}' for (s, q), n in twice.items())}"
        if stray:
            detail += f"; rows of records never sent or dead-lettered: {some(f'{s} {q}' for s, q in stray)}"
        out.append(Check("every checkpointed record's row committed or spooled, once", not absent_rows and not twice
                         and not stray, detail))

    crashed = [e for e in events if e.get("event") in ("driver_crashed", "task_crashed")]
    out.append(Check("no driver_crashed or task_crashed in the log", not crashed,
                     some(f"{e.get('event')} {e.get('shard_id') or e.get('task')}: {_error(e)}" for e in crashed)))
    return out


def _checkpointed(stored: Any, sequence_number: str) -> bool:
    """Is a record at or before its shard's stored checkpoint?"""
    if stored == SHARD_END:
        return True
    return isinstance(stored, tuple) and int(sequence_number) <= int(stored[0])


def _error(event: dict) -> str:
    """An event's error: its ``error`` field, else its traceback's last line."""
    lines = (event.get("traceback") or "").strip().splitlines()
    return event.get("error") or (lines[-1] if lines else "")


def summary(report: ChaosReport, results: list[Check] | None = None) -> str:
    """A few lines: what was sent and what happened (and the checks, if given)."""
    faults = ", ".join(f"{k} {report.faults[k]}" for k in FAULTS if report.faults[k]) or "none"
    lines = [f"chaos seed {report.seed}: {report.shards} shards, {report.seconds:.1f} s, {report.actions} actions, "
             f"{report.statuses} statuses, {report.batches} normal batches answered; faults: {faults}; "
             f"outside kills {report.kills}; connections closed {len(report.closed)}; statuses late "
             f"{len(report.late)}; normal batches' round trip p50 "
             f"{report.percentile(0.5) * 1000:.0f} ms, p99 {report.percentile(0.99) * 1000:.0f} ms, "
             f"max {max(report.round_trips, default=0) * 1000:.0f} ms"]
    for check in results or ():
        lines.append(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}{': ' + check.detail if check.detail else ''}")
    return "\n".join(lines)


# -- the bench part ---------------------------------------------------------------------------

SHARDS = 24
# (name, share of batches poisoned, seconds between outside kills)
CAMPAIGNS = (("chaos", 0.001, 10.0), ("storm", 0.05, 3.0))
IN_FLIGHT = 64  # max_batches_in_flight of the bench's server


def handler_pids(server_pid: int) -> list[int]:
    """The server's live handler processes: its children running ``mldserver.pool.child``."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{server_pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{server_pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for pid in children:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"mldserver.pool.child" in cmdline and alive(pid):
                out.append(pid)
    return out


@dataclass
class ChaosRun:
    name: str
    report: ChaosReport
    results: list[Check]
    events: list[dict]

    def deaths(self) -> int:
        return sum(1 for e in self.events if e.get("event") == "handler_process_died")


async def served(tmp: str, name: str, seed: int, seconds: float, fault_rate: float, kill_interval: float, *,
                 sink_dir: str | os.PathLike | None = None, outside_faults: Iterable[str] = (),
                 shards: int = SHARDS, batches: int | None = None) -> ChaosRun:
    """A campaign against ``mldserver serve`` in its own process, and its checks. With
    ``sink_dir``, the server commits ``ChaosRowsHandler``'s rows there (``--sink file:``,
    2 s windows, the admin port on), and ``outside_faults`` (``OUTSIDE_FAULTS``) break the
    sink and flood the admin port meanwhile: the checks add that every answered
    record's row was committed once and that health told the truth."""
    from ..emulators import free_port
    from .common import start_server

    state = os.path.join(tmp, f"chaos-{name}")
    handled = os.path.join(state, "handled")
    os.makedirs(handled)
    log = os.path.join(tmp, f"chaos-{name}.log")
    config = os.path.join(tmp, "chaos.toml")
    with open(config, "w") as f:
        f.write(f"max_batches_in_flight = {IN_FLIGHT}\n")
    extra: tuple[str, ...] = ()
    admin = None
    if sink_dir is not None:
        Path(sink_dir).mkdir(parents=True, exist_ok=True)
        admin = ("127.0.0.1", free_port())
        extra = ("--sink", f"file:{sink_dir}", "--window", "2", "--log-level", "info")
    server, port = await start_server(state, "--execution-timeout", "2", "--config", config, "--log-file", log,
                                      *extra, handler=HANDLER if sink_dir is None else ROWS_HANDLER,
                                      env={ENV: handled}, workers=2,
                                      admin="off" if admin is None else f"{admin[0]}:{admin[1]}")
    seen_pids: set[int] = set()

    def pids() -> list[int]:
        live = handler_pids(server.pid)
        seen_pids.update(live)
        return live

    stop = asyncio.Event()
    disturbing = None
    try:
        if admin is not None and outside_faults:
            disturbing = asyncio.ensure_future(disturb(seed=seed, admin=admin, sink_dir=Path(sink_dir),
                                                               stop=stop, kinds=outside_faults))
        try:
            report = await campaign(seed=seed, shards=shards, batches=batches, duration=seconds,
                                    fault_rate=fault_rate, kill_interval=kill_interval,
                                    server_address=("127.0.0.1", port), pids=pids, handled_dir=handled,
                                    state_dir=state)
        finally:
            stop.set()
            disturbance = await disturbing if disturbing is not None else None  # every fault mended
    finally:
        server.terminate()
        await asyncio.to_thread(server.wait, 120)
    events = read_log(log)
    rows = (sink_rows(Path(sink_dir)), spooled_rows(Path(state))) if sink_dir is not None else None
    results = checks(report, handled_dir=handled, state_dir=state, events=events, rows=rows)
    if disturbance is not None:
        results += disturbance.checks(events)
    left = sorted(pid for pid in seen_pids if alive(pid))
    results.append(Check("no handler process left running once the server stopped", not left,
                         f"{len(seen_pids)} seen" + (f"; left: {left[:5]}" if left else "")))
    return ChaosRun(name, report, results, events)


def _table(runs: list[ChaosRun]) -> list[str]:
    width = max(len(c.name) for r in runs for c in r.results) + 2

    def row(label: str, values: Iterable[Any]) -> str:
        return f"  {label:{width}}" + "".join(f"{v:>14}" for v in values)

    reports = [r.report for r in runs]
    lines = [row("", (r.name for r in runs)),
             row("seconds", (f"{r.seconds:.0f}" for r in reports)),
             row("actions sent", (r.actions for r in reports)),
             row("statuses received", (r.statuses for r in reports)),
             row("normal batches answered", (r.batches for r in reports))]
    lines += [row(f"faults: {kind}", (r.faults[kind] for r in reports)) for kind in FAULTS]
    lines += [row("outside kills", (r.kills for r in reports)),
              row("handler process deaths", (r.deaths() for r in runs)),
              row("connections closed", (len(r.closed) for r in reports)),
              row(f"statuses late (> {READ_TIMEOUT:g} s)", (len(r.late) for r in reports)),
              row("round trip p50 (ms)", (f"{r.percentile(0.5) * 1000:.0f}" for r in reports)),
              row("round trip p99 (ms)", (f"{r.percentile(0.99) * 1000:.0f}" for r in reports)),
              row("round trip max (ms)", (f"{max(r.round_trips, default=0) * 1000:.0f}" for r in reports))]
    lines.append("  checks")
    names = list(dict.fromkeys(c.name for r in runs for c in r.results))
    for check_name in names:
        got = [{c.name: c.ok for c in r.results}.get(check_name) for r in runs]
        lines.append(row(f"  {check_name}", ("-" if ok is None else "ok" if ok else "FAIL" for ok in got)))
    for r in runs:
        for check in r.results:
            if not check.ok:
                lines.append(f"  {r.name}: FAIL {check.name}: {check.detail[:1000]}")
    return lines


async def run(args, tmp: str) -> None:
    duration = args.duration if args.duration is not None else (20.0 if args.quick else 300.0)
    calm = min(30.0, max(5.0, duration / 10))
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"\nchaos: {SHARDS} shards through relays, the strict fake daemon; mldserver serve --workers 2 "
          f"--execution-timeout 2, {IN_FLIGHT} batches in flight; seed {seed} (--seed {seed} reruns it)")
    print(f"  undisturbed for {calm:g} s, then {duration:g} s of each: "
          + "; ".join(f"{name}: {rate:.1%} of batches poisoned ({', '.join(FAULTS)}) and a handler process "
                      f"SIGKILLed every ~{kills:g} s" for name, rate, kills in CAMPAIGNS), flush=True)
    sink_dir, kinds, note = _sink_of_its_own(tmp)
    name, rate, kills = CAMPAIGNS[0]
    print(f"  outside: {name}'s faults and kills, rows committed into --sink file: (2 s windows), and "
          f"{', '.join(kinds)} in turn (outside.py){note}", flush=True)
    runs = [await served(tmp, "undisturbed", seed, calm, 0.0, 0.0)]
    for name, rate, kills in CAMPAIGNS:
        runs.append(await served(tmp, name, seed, duration, rate, kills))
    try:
        runs.append(await served(tmp, "outside", seed, duration, CAMPAIGNS[0][1], CAMPAIGNS[0][2],
                                 sink_dir=sink_dir, outside_faults=kinds))
    finally:
        if "full" in kinds:
            subprocess.run(["umount", "-l", str(sink_dir.parent)], capture_output=True)
    for line in _table(runs):
        print(line)
    for line in await killed_lines(args, tmp, seed):  # killed.py: mldserver run SIGKILLed, the real daemon
        print(line, flush=True)


def _sink_of_its_own(tmp: str) -> tuple[Path, tuple[str, ...], str]:
    """The outside run's sink folder, on a 1 GiB tmpfs of its own where one can be
    mounted (root), so that ``full`` fills it and nothing else; else without ``full``."""
    disk = Path(tmp) / "sink-disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(disk)], capture_output=True,
                          text=True)
    if done.returncode == 0:
        return disk / "out", OUTSIDE_FAULTS, ""
    return disk / "out", tuple(k for k in OUTSIDE_FAULTS if k != "full"), \
        f" (no disk full: a tmpfs cannot be mounted here: {done.stderr.strip()[:100]})"
