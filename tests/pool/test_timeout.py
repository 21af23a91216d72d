"""``execution_timeout`` holds against a handler that blocks (``time.sleep``): its
process's stack is logged, the process killed and replaced, the batch retried, then
dead-lettered; the shards of the other handler process keep their pace (compared with
an undisturbed run in the same test, with generous bounds)."""

from __future__ import annotations

import logging
import statistics

from .serving import dead_letters, drive, events, running

SHARDS, BATCHES, POISONED = 8, 6, 3


async def test_a_handler_blocking_past_the_execution_timeout_is_killed_retried_and_dead_lettered(
        tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_TEST_POISON", "block")  # time.sleep(60) on the poisoned record
    timeout = 1.0
    async with running(tmp_path, "Emit", sink=False, execution_timeout=timeout) as (server, _, daemon):
        calm: dict[int, list[float]] = {}
        shards = await drive(daemon, SHARDS, BATCHES, rtts=calm, last=False)
        for shard in shards:
            await shard.lease_lost()
            assert await shard.close() == 0
        disturbed: dict[int, list[float]] = {}
        shards = await drive(daemon, SHARDS, BATCHES, {POISONED: {1}}, rtts=disturbed, last=False)
        for shard in shards:  # every relay is up, every action answered once
            await shard.shard_ended()
            assert await shard.close() == 0
        assert all(daemon.checkpoints[s.shard_id] == "SHARD_END" for s in shards)

    attempts = server.settings.handler_retries + 1
    assert server.metrics.registry.get_sample_value("mldserver_handler_timeouts_total",
                                                    {"callback": "process_records"}) == attempts
    timed_out = events(caplog, "handler_timed_out")
    assert len(timed_out) == attempts
    assert all("time.sleep" in t["stack"] or "misbehave" in t["stack"] for t in timed_out)
    died = events(caplog, "handler_process_died")
    assert [d["signal"] for d in died] == ["SIGKILL"] * attempts
    assert all(d["running"] == {"shard_id": "shardId-000000000003", "action": "process_records"} for d in died)
    failed = [f for f in events(caplog, "handler_failed") if f["callback"] == "process_records"]
    assert len(failed) == attempts and "execution_timeout" in failed[-1]["error"]
    letters = dead_letters(tmp_path, "shardId-000000000003")
    assert [letter["sequence_number"] for letter in letters] == [str(2000 + i) for i in range(5)]
    assert disturbed[POISONED][1] >= timeout * attempts

    # The other process's shards kept their pace while the poisoned one was killed thrice.
    touched = {shard for d in died for shard in d["shards"]}
    calm_shards = [s for s in range(SHARDS) if f"shardId-{s:012d}" not in touched]
    assert calm_shards, "every shard was in a killed process"
    before = statistics.median(t for s in calm_shards for t in calm[s])
    during = statistics.median(t for s in calm_shards for t in disturbed[s])
    worst = max(t for s in calm_shards for t in disturbed[s])
    assert during < 5 * before + 0.25, (before, during)
    assert worst < timeout, (before, worst)
