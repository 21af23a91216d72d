"""Timers from handlers in handler processes (and, for comparison, in the server's
loop), through the fake daemon and the real relay: a call's timers are durable before
its checkpoints and its status (a server SIGKILLed as the checkpoint reaches the
daemon has them on disk), in one commit, and a commit that fails fails the action and
loses nothing; replacements and cancellations made in a call hold, callbacks create
timers themselves, mistakes reach the handler and are counted, failures end in the
dead letters with their context."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time

import pytest
from prometheus_client import generate_latest

from mldserver.api.testing import DaemonExit, FakeDaemon

from ..harness import ServerProcess, eventually, relay_command, running
from .serving import HANDLER, dead_letters, fired_file, fired_lines, records

UNCHECKED = "tests.timer_handlers:Unchecked"  # never checkpoints: its timers go with its status
LATER = 3600  # create_in: due in an hour, never while a test runs

CB = "tests.timer_handlers:fired"


def stored(tmp_path) -> dict[str, bytes]:
    """What a fresh connection reads from the server's store: committed rows only."""
    path = tmp_path / "state" / "timers" / "timers.db"
    if not path.exists():
        return {}
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT reference, context FROM timers"))


def creates_and_cancels(n: int, prefix: str = "r") -> tuple[list[list], list[str]]:
    """``n`` records, each creating a timer; every third cancels it again in the same
    call. The records' ops and the references left."""
    ops, live = [], []
    for i in range(n):
        ref = f"{prefix}{i}"
        ops.append([["create_in", ref, LATER, {"ref": ref}]])
        if i % 3 == 2:
            ops[-1].append(["cancel", ref])
        else:
            live.append(ref)
    return ops, live


@pytest.mark.parametrize("workers", [2, 0])
async def test_a_create_is_committed_before_the_record_is_checkpointed(tmp_path, monkeypatch, workers):
    fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, HANDLER, workers=workers) as (server, _, daemon):
        shard = await daemon.shard("shardId-0")
        await shard.process_records(records(1, [[["create", "later", time.time() + 3600, {"n": 1}]]]))
        assert daemon.checkpoints["shardId-0"] == ("1", 0)
        assert stored(tmp_path) == {"later": b'{"n":1}'}
        await shard.close()


@pytest.mark.parametrize("workers", [2, 0])
async def test_live_timers_fire_once_with_their_latest_context_and_cancelled_ones_never(
        tmp_path, monkeypatch, workers):
    fired = fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, HANDLER, workers=workers) as (server, _, daemon):
        shards = [await daemon.shard(f"shardId-{s}") for s in range(2)]
        expected = {}
        for s, shard in enumerate(shards):
            ops = []
            for i in range(100):
                ref = f"s{s}-{i}"  # due 2 s after its create; the ops on one timer are back to back
                ops.append([["create_in", ref, 2, {"ref": ref, "v": 1}]])
                if i % 4 == 1:
                    ops[-1].append(["create_in", ref, 2, {"ref": ref, "v": 2}])
                if i % 4 == 2:
                    ops[-1].append(["cancel", ref])
                    continue
                expected[ref] = 2 if i % 4 == 1 else 1
            await shard.process_records(records(1, ops))
        lines = await eventually(lambda: len(fired_lines(fired)) >= len(expected) and fired_lines(fired), 30,
                                 what="every live timer fired")
        assert {line["ref"]: line["v"] for line in lines} == expected
        assert len(lines) == len(expected)  # no restart here: once each
        assert all(line["fired_at"] >= line["at"] for line in lines)
        await eventually(lambda: server.timers.store.pending == 0, what="every fired timer deleted")
        stats = server.timers.stats
        assert (stats.created, stats.cancelled, stats.success, stats.failure) == (250, 50, 150, 0)
        metrics = generate_latest(server.metrics.registry).decode()
        assert "mldserver_timer_callback_success_total 150.0" in metrics
        assert "mldserver_pending_timers 0.0" in metrics
        for shard in shards:
            await shard.close()


@pytest.mark.parametrize("workers", [2, 0])
async def test_a_callback_creates_the_next_timer(tmp_path, monkeypatch, workers):
    fired = fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, HANDLER, workers=workers) as (server, _, daemon):
        shard = await daemon.shard("shardId-0")
        await shard.process_records(records(1, [[["create", "chain", 0, {"ref": "chain", "left": 3}, "rearm"]]]))
        lines = await eventually(lambda: len(fired_lines(fired)) == 4 and fired_lines(fired), 20,
                                 what="the chain of four")
        assert [line["left"] for line in lines] == [3, 2, 1, 0]
        await shard.close()


@pytest.mark.parametrize("workers", [2, 0])
async def test_a_refused_create_fails_the_handler_call_and_is_counted(tmp_path, monkeypatch, workers):
    fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, HANDLER, workers=workers, handler_retries=0,
                       timer_context_size=64) as (server, _, daemon):
        shard = await daemon.shard("shardId-0")
        await shard.process_records(records(1, [[["create", "big", 0, {"blob": "x" * 100}]]]))
        assert "shardId-0" not in daemon.checkpoints  # the batch failed: dead-lettered, not checkpointed
        assert server.timers.stats.create_failures == 1 and server.timers.store.pending == 0
        letters = (tmp_path / "state" / "dead-letters" / "shardId-0.jsonl").read_text()
        assert "over timer_context_size (64 bytes)" in letters
        await shard.close()


@pytest.mark.parametrize("workers", [2, 0])
async def test_a_callback_that_keeps_failing_is_dead_lettered_with_its_context(tmp_path, monkeypatch, workers):
    fired = fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, HANDLER, workers=workers, handler_retries=2) as (server, _, daemon):
        shard = await daemon.shard("shardId-0")
        await shard.process_records(records(1, [[["create", "bad", 0, {"ref": "bad", "order": 7}, "failing"]]]))
        await eventually(lambda: dead_letters(tmp_path), 20, what="the dead letter")
        [letter] = dead_letters(tmp_path)
        assert letter["context"] == {"ref": "bad", "order": 7} and letter["attempts"] == 3
        assert letter["error"] == "ValueError: no such order: bad"
        assert len(fired_lines(fired)) == 3 and server.timers.stats.failure == 3
        # dead-lettered first, deleted from the store after: a crash between fires it again, never loses it
        await eventually(lambda: server.timers.store.pending == 0, what="the timer deleted")
        await shard.close()


@pytest.mark.parametrize("handler", [HANDLER, UNCHECKED])
@pytest.mark.parametrize("workers", [2, 0])
async def test_a_calls_timers_are_one_commit_and_a_cancel_in_it_nets_to_nothing(tmp_path, monkeypatch, workers,
                                                                                  handler):
    fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, handler, workers=workers) as (server, _, daemon):
        shard = await daemon.shard("shardId-0")
        group = server.timers.store.group
        ops, live = creates_and_cancels(600)
        for first in (1, 301):  # two batches: two calls, two commits
            commits = group.commits
            await shard.process_records(records(first, ops[first - 1 : first + 299]))
            assert group.commits == commits + 1
        assert sorted(stored(tmp_path)) == sorted(live)
        stats = server.timers.stats
        assert (stats.created, stats.cancelled, stats.create_failures) == (600, 200, 0)
        await shard.close()


def sigkill_at_checkpoint(server: ServerProcess, tmp_path, seen: list):
    """A FakeDaemon ``errors`` hook: the server SIGKILLed as its first checkpoint
    request reaches the daemon, then what its store holds."""
    def hook(shard, seq, sub):
        if not seen:
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
            seen.append(stored(tmp_path))
        return None

    return hook


@pytest.mark.parametrize("workers", ["2", "0"])
async def test_a_server_sigkilled_as_the_checkpoint_reaches_the_daemon_has_the_calls_timers(
        tmp_path, monkeypatch, workers):
    fired_file(tmp_path, monkeypatch)
    server = ServerProcess(HANDLER, tmp_path, "--workers", workers)
    seen: list[dict] = []
    daemon = FakeDaemon(relay_command(server.port), errors=sigkill_at_checkpoint(server, tmp_path, seen))
    try:
        shard = await daemon.shard("shardId-0")
        ops, live = creates_and_cancels(300)
        with pytest.raises(DaemonExit, match="ended before a status"):  # the server is gone
            await shard.process_records(records(1, ops))
    finally:
        server.stop()
    assert sorted(seen[0]) == sorted(live)


@pytest.mark.parametrize("workers", ["2", "0"])
async def test_a_server_sigkilled_as_the_status_reaches_the_daemon_has_the_calls_timers(
        tmp_path, monkeypatch, workers):
    fired_file(tmp_path, monkeypatch)
    server = ServerProcess(UNCHECKED, tmp_path, "--workers", workers)
    shard = None
    try:
        shard = await FakeDaemon(relay_command(server.port)).shard("shardId-0")
        ops, live = creates_and_cancels(300)
        await shard.process_records(records(1, ops))  # its status is in
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
    finally:
        server.stop()
        if shard is not None:
            await shard.child.kill()  # its relay, reaped before the test's loop closes
    assert sorted(stored(tmp_path)) == sorted(live)


@pytest.mark.parametrize("handler", [HANDLER, UNCHECKED])
@pytest.mark.parametrize("workers", [2, 0])
async def test_a_commit_that_fails_fails_the_action_and_loses_no_timer(tmp_path, monkeypatch, workers, handler):
    fired_file(tmp_path, monkeypatch)
    async with running(tmp_path, handler, workers=workers, handler_retries=2,
                       handler_backoff=1.0) as (server, _, daemon):
        shard = await daemon.shard("shardId-0")
        await shard.process_records(records(1, [[["create_in", "first", LATER, {}]]]))  # the file, open
        store = server.timers.store
        store._conn.execute("PRAGMA busy_timeout = 50")
        blocker = sqlite3.connect(store.path, timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database: no commit can happen
        ops, live = creates_and_cancels(100)
        try:
            batch = asyncio.ensure_future(shard.process_records(records(2, ops)))
            await eventually(lambda: server.timers.stats.create_failures, 10, what="the commit failed")
        finally:
            blocker.rollback()  # the disk is back before the retry (a second later)
            blocker.close()
        await batch
        assert server.timers.stats.create_failures == len(live) + 100 // 3  # the creates of the attempt that failed
        assert sorted(stored(tmp_path)) == sorted(["first", *live])
        assert not (tmp_path / "state" / "dead-letters" / "shardId-0.jsonl").exists()
        if handler == HANDLER:
            assert daemon.checkpoints["shardId-0"] == ("101", 0)
        await shard.close()
