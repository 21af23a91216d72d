"""``max_handler_memory``: a process over it is replaced between actions, its shards
move with fresh instances and nothing is lost. ``handler_block_warning``: a handler
that blocks its loop gets one log line with its stack, and is not killed. An idle
process beats once a second, and a call brings its short beat back at once."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from mldserver.pool.frames import BLOCKED, WATCH_INTERVAL

from ..harness import eventually, running
from .serving import T0, batch, dead_letters, drive, events, expected, pooled, seen

SHARDS = 8


async def test_a_process_over_max_handler_memory_is_replaced_between_actions_and_nothing_is_lost(
        tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_TEST_HOG", "200")
    async with running(tmp_path, **pooled("Hog", max_handler_memory=150)) as (server, sink, daemon):
        shards = await drive(daemon, SHARDS, 2, {3: {1}}, last=False)  # shard 3's batch 1 leaks 200 MiB
        [over] = await eventually(lambda: events(caplog, "handler_process_memory"), timeout=10,
                                  what="the process over the limit noticed")
        assert over["rss_mib"] > 150 and over["max_handler_memory"] == 150
        for n in (2, 3):  # the next actions move its shards; the leak goes with the old process
            await asyncio.gather(*(shard.process_records(batch(s, n, 1000 * (n + 1), at=T0 + n * 60_000),
                                                         millis_behind_latest=1000)
                                   for s, shard in enumerate(shards)))
        await eventually(lambda: events(caplog, "handler_process_retired"), timeout=10, what="the old one retired")
        await asyncio.gather(*(shard.process_records(batch(s, 99, 99_000, at=T0 + 600 * 60_000),
                                                     millis_behind_latest=1000) for s, shard in enumerate(shards)))
        want = expected(SHARDS, 4)
        await eventually(lambda: seen(sink) >= want, timeout=20, what="every row in the sink")
        assert seen(sink) == want
        for shard in shards:
            await shard.shard_ended()
            assert await shard.close() == 0
    [retired] = events(caplog, "handler_process_retired")
    assert retired["pid"] == over["pid"]
    moved = events(caplog, "shard_moved")
    assert len(moved) == over["shards"] and {m["from_pid"] for m in moved} == {over["pid"]}
    assert not events(caplog, "handler_process_died") and not events(caplog, "handler_failed")
    assert not any(dead_letters(tmp_path, f"shardId-{s:012d}") for s in range(SHARDS))


async def test_a_handler_blocking_its_loop_is_logged_once_with_its_stack_and_not_killed(tmp_path, caplog, capfd,
                                                                                       monkeypatch):
    caplog.set_level(logging.INFO, logger="mldserver")
    monkeypatch.setenv("MLDSERVER_TEST_SLEEP", "1.2")
    async with running(tmp_path, **pooled("Blocker", sink=False, handler_block_warning=0.3)) as (server, _, daemon):
        [shard] = await drive(daemon, 1, 2, {0: {1}}, last=False)
        await shard.shard_ended()
        assert await shard.close() == 0
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    # Each of the two handler processes has its watchdog, and a process the machine stalls
    # (its start-up, starved of CPU) is an episode of its own, logged with its loop's stack:
    # the blocking call is the one episode whose stack ends in the handler's time.sleep.
    [blocked] = [line for line in lines
                 if line["event"] == "handler_blocked" and "pool_handlers.py" in line["stack"]]
    innermost = blocked["stack"].split('  File "')[-1]  # where the loop was, and its code
    assert "pool_handlers.py" in innermost and "in process_records\n" in innermost and "time.sleep(" in innermost
    assert blocked["blocked_ms"] >= 300
    assert blocked["in_flight"] == [{"shard_id": "shardId-000000000000", "action": "process_records"}]
    assert not events(caplog, "handler_failed") and not events(caplog, "handler_process_died")


async def test_an_idle_process_beats_once_a_second_and_a_call_that_blocks_is_seen_within_short_beats(
        tmp_path, monkeypatch):
    monkeypatch.setenv("MLDSERVER_TEST_SLEEP", "2.0")
    short = BLOCKED * WATCH_INTERVAL * 1e9  # nanoseconds: how far ahead a busy loop's beat is due

    async with running(tmp_path, **pooled("Blocker", sink=False, workers=1)) as (server, _, daemon):
        shard = await daemon.shard("shardId-000000000000")
        [proc] = server.pool.processes
        await eventually(lambda: proc.life.beat_due() - time.monotonic_ns() > short, timeout=10,
                         what="an idle beat, due later than a busy one")
        assert not proc.blocked()
        # the batch blocks its loop 2 s: blocked from 0.2 s on (its beat short from the
        # call's arrival), where the idle beat would have said nothing for up to 4 s
        blocking = asyncio.ensure_future(shard.process_records(batch(0, 1, 1000, poison=True)))
        await eventually(proc.blocked, timeout=1.8, what="the blocked loop seen within its short beats")
        await blocking  # (its done frame may come before its loop's next beat)
        await eventually(lambda: proc.life.beat_due() - time.monotonic_ns() > short, timeout=10,
                         what="the idle beat again")
        assert not proc.blocked()
        await shard.shard_ended()
        assert await shard.close() == 0
