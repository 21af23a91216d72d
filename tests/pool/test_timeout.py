"""``execution_timeout`` stops the one call that ran past it, and only it: a handler
that blocks its loop (``time.sleep``) is interrupted there, one that awaits is
cancelled, and only one that will not stop (it swallows the interrupt and blocks again)
has its process killed. Each time its stack is logged, the batch is retried in a process
of its own (quarantine), then dead-lettered; the other shards do not wait for it and,
when the call was stopped alone, keep their handler processes and instances."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

from mldserver.api.records import ShardInfo
from mldserver.base.backoff import Backoff
from mldserver.base.config import Settings
from mldserver.base.logs import get_logger
from mldserver.pool import calls as pool_calls
from mldserver.pool.calls import ProcessCalls
from mldserver.pool.process import HandlerProcess, ProcessDied, describe_exit

from ..harness import running
from .serving import dead_letters, drive, events, pooled

SHARDS, BATCHES, POISONED = 8, 6, 3
POISONED_ID = f"shardId-{POISONED:012d}"


@pytest.mark.parametrize("how, stopped", [("block", "interrupted"), ("await", "cancelled"), ("stubborn", "killed")])
async def test_a_call_past_the_execution_timeout_is_stopped_alone_retried_in_quarantine_and_dead_lettered(
        tmp_path, caplog, monkeypatch, how, stopped):
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_TEST_POISON", how)
    # A call that ends once interrupted or cancelled is given all the time a loaded
    # machine's starved process needs to answer (past STOP_GRACE it would be killed: the
    # stubborn case's escalation, tested with the grace as shipped)
    monkeypatch.setattr(pool_calls, "STOP_GRACE", pool_calls.STOP_GRACE if stopped == "killed" else 60.0)
    timeout = 1.0
    async with running(tmp_path, **pooled("Emit", sink=False, execution_timeout=timeout)) as (server, _, daemon):
        pids = {p.pid for p in server.pool.processes}
        disturbed: dict[int, list[float]] = {}
        shards = await drive(daemon, SHARDS, BATCHES, {POISONED: {1}}, rtts=disturbed, last=False)
        for shard in shards:  # every relay is up, every action answered once
            await shard.shard_ended()
            assert await shard.close() == 0
        assert all(daemon.checkpoints[s.shard_id] == "SHARD_END" for s in shards)
        survivors = {p.pid for p in server.pool.processes}

    # The batch's attempts, then its bisection in quarantine: [2000, 2002) is handled, and
    # [2002, 2005), which holds the poisoned record, times out past the bisection's budget
    # (execution_timeout): it is dead-lettered whole.
    attempts = server.settings.handler_retries + 1
    calls = attempts + 1
    assert server.metrics.registry.get_sample_value("mldserver_handler_timeouts_total",
                                                    {"callback": "process_records"}) == calls
    timed_out = events(caplog, "handler_timed_out")
    assert [t["stopped"] for t in timed_out] == [stopped] * calls
    failed = [f for f in events(caplog, "handler_failed") if f["callback"] == "process_records"]
    assert len(failed) == calls and f"execution_timeout): {stopped}" in failed[-1]["error"]
    # Where it was: where it blocked or awaited (its traceback, or faulthandler's stack).
    where = "asyncio.sleep(60)" if stopped == "cancelled" else "misbehave"
    assert all(where in t["stack"] for t in timed_out), [t["stack"] for t in timed_out]
    quarantined = events(caplog, "handler_process_quarantined")
    died = events(caplog, "handler_process_died")
    if stopped == "killed":  # every attempt killed its process: the first shared, then each quarantine
        assert [d["signal"] for d in died] == ["SIGKILL"] * calls
        assert all(d["running"] == {"shard_id": POISONED_ID, "action": "process_records"} for d in died)
        assert [d["quarantine"] for d in died] == [False] + [True] * (calls - 1)
        assert len(quarantined) == attempts - 1 + 2
    else:  # stopped alone: no process died, one quarantine process served every retry, one each half
        assert died == [] and survivors == pids
        assert len(quarantined) == 1 + 2 and {q["shard_id"] for q in quarantined} == {POISONED_ID}
        assert {m["shard_id"] for m in events(caplog, "shard_moved")} <= {POISONED_ID}
    letters = dead_letters(tmp_path, POISONED_ID)
    assert [letter["sequence_number"] for letter in letters] == ["2002", "2003", "2004"]
    assert disturbed[POISONED][1] >= timeout * calls

    # The shards of the process that was not stopped or killed did not wait for the call:
    # each answered all its batches while the poisoned batch was still being tried (it took
    # every attempt's execution_timeout, asserted above). An order, not a pace: the batches
    # of a shard run one after another, all shards from the same start, so a shard's last
    # answer came at the sum of its round trips.
    touched = {shard for d in died for shard in d["shards"]}
    calm_shards = [s for s in range(SHARDS) if s != POISONED and f"shardId-{s:012d}" not in touched]
    assert calm_shards, "every shard was in a killed process"
    poisoned_answered = sum(disturbed[POISONED][:2])
    calm_done = {s: sum(disturbed[s]) for s in calm_shards}
    assert all(done < poisoned_answered for done in calm_done.values()), (poisoned_answered, calm_done)


async def test_a_process_killed_twice_before_its_death_is_noticed_is_reported_killed_by_sigkill(tmp_path, monkeypatch):
    """``kill_for`` kills the process of a call that will not stop; until its death is
    noticed, the pool's supervisor may kill it again (it is not alive). The second kill
    must not reap it behind the loop's back: the stock loop's child watcher would then
    report exit code 255 for it, not SIGKILL."""
    # The stock loop's watcher waits for the process in a thread of its own: held here until
    # both kills are done, as a loaded machine may hold it. (uvloop reaps it in the loop,
    # which does not turn meanwhile.)
    gate = threading.Event()
    watcher = asyncio.unix_events.ThreadedChildWatcher
    waitpid = watcher._do_waitpid
    monkeypatch.setattr(watcher, "_do_waitpid", lambda self, *args: (gate.wait(30), waitpid(self, *args)))
    proc = HandlerProcess(Settings(handler="tests.pool_handlers:Emit", state_dir=str(tmp_path / "state")),
                          log=get_logger("t"))
    await proc.start()
    try:
        proc.kill()
        stat = Path(f"/proc/{proc.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)  # until it is dead, not yet reaped
        proc.kill()
    finally:
        gate.set()
    await asyncio.wait_for(proc.life.died.wait(), 10)
    await proc.stop()
    assert describe_exit(proc.life.returncode) == {"signal": "SIGKILL"}


class Killed:
    """A handler process killed for another shard's call that would not stop (``kill_for``),
    its death not noticed yet: no longer alive, that call still marked running."""

    alive = False
    pid = 1

    def __init__(self) -> None:
        self.death: asyncio.Future = asyncio.get_running_loop().create_future()

    async def call(self, frame, body, requests, what, check=None):
        return await self.death  # ProcessDied, once its death is noticed

    def running(self) -> int:
        return 1  # the call it was killed for

    def interrupt(self, call_id: int) -> None:
        pass

    async def stack(self) -> str:
        return ""


async def test_a_call_whose_time_runs_out_while_its_process_is_killed_for_another_is_not_timed_out():
    """A bystander's own time may run out between the kill of its process (another call's
    time-out) and the notice of its death (later on a loaded machine): it is not stopped,
    counted nor quarantined as timed out; the death ends it with ProcessDied, not blamed
    on it (the call is redone elsewhere)."""
    calls = ProcessCalls(None, None, retries=2, timeout=0.05, backoff=Backoff(), log=get_logger("t"))
    calls.shard = ShardInfo("shardId-000000000001", "TRIM_HORIZON", 0)
    proc = Killed()
    asyncio.get_running_loop().call_later(0.3, proc.death.set_exception, ProcessDied("signal SIGKILL", blamed=False))
    with pytest.raises(ProcessDied) as died:
        await calls._wait(proc, {"op": "call", "id": 2, "action": "process_records"}, b"", None, "process_records")
    assert not died.value.blamed
