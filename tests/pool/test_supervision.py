"""A handler that kills its process (a fault in C, ``os._exit``, a SIGKILL mid-action):
8 shards through the relay with the strict fake daemon, one poisoned. Every relay stays
up, the daemon sees no EOF and no second status, the other shards' rows all reach the
sink, and the poisoned batch is redone in a fresh process, then bisected there: only its
poisoned record is dead-lettered with its data."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from ..harness import eventually, running
from .serving import dead_letters, drive, events, expected, pooled, seen

SHARDS, BATCHES, POISONED = 8, 4, 3  # shard 3's batch 1 is poisoned


@pytest.mark.parametrize("how", ["segv", "exit", "kill"])
async def test_a_handler_that_kills_its_process_costs_a_respawn_and_a_dead_letter(how, tmp_path, caplog,
                                                                                  monkeypatch):
    caplog.set_level(logging.INFO, logger="mldserver")
    marker = tmp_path / "blocked.pids"
    monkeypatch.setenv("MLDSERVER_TEST_POISON", "block" if how == "kill" else how)
    monkeypatch.setenv("MLDSERVER_TEST_MARKER", str(marker))

    async def killer():  # SIGKILL each process that blocks in the poisoned batch
        killed = set()
        while True:
            for line in marker.read_text().split() if marker.exists() else ():
                if line not in killed:
                    killed.add(line)
                    os.kill(int(line), signal.SIGKILL)
            await asyncio.sleep(0.05)

    async with running(tmp_path, **pooled("Emit", execution_timeout=120.0)) as (server, sink, daemon):
        kill = asyncio.ensure_future(killer()) if how == "kill" else None
        try:
            shards = await drive(daemon, SHARDS, BATCHES, {POISONED: {1}})
        finally:
            if kill is not None:
                kill.cancel()
        want = expected(SHARDS, BATCHES) - {("shardId-000000000003", "2002")}  # the poisoned record alone
        await eventually(lambda: seen(sink) >= want, timeout=20, what="every other row in the sink")
        assert seen(sink) == want
        for shard in shards:  # every relay is still up and the conversation goes on
            await shard.shard_ended()
            assert await shard.close() == 0
        assert all(daemon.checkpoints[s.shard_id] == "SHARD_END" for s in shards)
        attempts = server.settings.handler_retries + 1
        await eventually(lambda: len(events(caplog, "handler_process_started")) == 1, timeout=20,
                         what="the pool's dead process replaced")
        assert len(server.pool.serving()) == 2
        # The retries ran in quarantine, and so did the bisection's calls (its four halves of
        # halves): one process each, for shard 3 alone.
        quarantined = events(caplog, "handler_process_quarantined")
        assert [q["shard_id"] for q in quarantined] == ["shardId-000000000003"] * (attempts - 1 + 4)
        await eventually(lambda: not server.pool.quarantined, timeout=20, what="quarantine processes stopped")

    died = events(caplog, "handler_process_died")
    poisoned = [d for d in died if d["running"] == {"shard_id": "shardId-000000000003", "action": "process_records"}]
    assert len(poisoned) == attempts + 2  # and the halves that held the poisoned record: [2, 5), [2, 3)
    assert [d["quarantine"] for d in poisoned] == [False] + [True] * (attempts + 1)
    assert all(d["shards"] == ["shardId-000000000003"] for d in poisoned[1:])  # nobody else paid for it twice
    first = died[0]
    if how == "segv":
        assert first["signal"] == "SIGSEGV" and "pool_handlers.py" in first["stack"]
    elif how == "exit":
        assert first["exit_code"] == 3
    else:
        assert first["signal"] == "SIGKILL"
    assert "shardId-000000000003" in first["shards"]
    failed = [f for f in events(caplog, "handler_failed") if f["callback"] == "process_records"]
    assert len(failed) == attempts + 2 and not failed[-1]["retry"]
    letters = dead_letters(tmp_path, "shardId-000000000003")  # the poisoned record, with its data
    assert [letter["sequence_number"] for letter in letters] == ["2002"]
    assert letters[0]["partition_key"] == "poison" and letters[0]["data"]
    assert all("handler process died" in letter["error"] for letter in letters)


async def test_a_row_a_handler_process_cannot_encode_is_dead_lettered_and_the_others_go_on(tmp_path, caplog,
                                                                                           monkeypatch):
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_TEST_POISON", "badrow")
    async with running(tmp_path, **pooled("Emit")) as (server, sink, daemon):
        shards = await drive(daemon, 2, 2, {1: {1}})
        want = expected(2, 2) - {("shardId-000000000001", "2002")}
        await eventually(lambda: seen(sink) >= want, timeout=20, what="every other row in the sink")
        assert seen(sink) == want
        for shard in shards:
            await shard.shard_ended()
            assert await shard.close() == 0
    [letter] = dead_letters(tmp_path, "shardId-000000000001")
    assert (letter["reason"], letter["sequence_number"]) == ("bad row", "2002")
    assert letter["error"] == "row not JSON-encodable: Type is not JSON serializable: set"
    assert letter["partition_key"] == "poison" and letter["data"]
    assert not events(caplog, "handler_failed")


async def test_a_process_that_dies_during_a_checkpoint_round_trip_leaves_the_conversation_whole(
        tmp_path, caplog, monkeypatch):
    """The daemon's reply to a checkpoint the dead process asked for is read before the
    action is redone: the conversation never holds two round trips, or a status between."""
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_TEST_POISON", "checkpoint-exit")
    async with running(tmp_path, **pooled("EmitCheckpoint", sink=False)) as (server, _, daemon):
        shards = await drive(daemon, SHARDS, BATCHES, {POISONED: {1}}, last=False)
        for shard in shards:
            await shard.shard_ended()
            assert await shard.close() == 0
    attempts = server.settings.handler_retries + 1
    asked = [c for c in shards[POISONED].checkpoint_requests if c == ("2002", 0)]
    assert len(asked) == attempts + 2  # each attempt died with its checkpoint at the daemon, and the two
    # halves of the bisection that held the poisoned record
    assert [d["sequence_number"] for d in dead_letters(tmp_path, "shardId-000000000003")] == ["2002"]
    assert all(daemon.checkpoints[s.shard_id] == "SHARD_END" for s in shards)


def test_a_killed_servers_handler_process_files_are_removed_at_the_next_start(tmp_path):
    import subprocess
    import sys

    from mldserver.pool.process import clear_stale

    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a server pid no longer running
    gone.wait()
    for name in (f"process-{gone.pid}-1.run", f"process-{gone.pid}-1.stack", f"process-{os.getpid()}-3.run",
                 f"process-{os.getppid()}-2.run"):
        (tmp_path / name).write_text("")
    assert clear_stale(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"process-{os.getpid()}-3.run",
                                                                 f"process-{os.getppid()}-2.run"])
