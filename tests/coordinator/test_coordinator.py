"""The coordinator on an event loop with a fake clock and the real file sink:
commits, safe positions, back-pressure, the spool, a failing sink."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from mldserver.backoff import Backoff
from mldserver.config import Settings
from mldserver.coordinator import Coordinator
from mldserver.coordinator.ordering import Item
from mldserver.positions import Position
from mldserver.sinks.file import FileSink

MINUTE = 60_000


class Clock:
    def __init__(self, now=0):
        self.now = now

    def __call__(self):
        return self.now


def items(first_seq, times):
    return [Item(t, position(first_seq + i), orjson.dumps({"seq": first_seq + i})) for i, t in enumerate(times)]


def position(seq):
    return Position(seq, 0, str(seq))


async def eventually(check, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def output(directory):
    return {p.name: [orjson.loads(line)["seq"] for line in p.read_text().splitlines()]
            for p in sorted(directory.glob("*.jsonl"))}


@pytest.fixture
def settings(tmp_path):
    return Settings(window=60.0, idle_timeout=600.0, watermark_margin=5.0, state_dir=str(tmp_path / "state"),
                    sink=f"file:{tmp_path / 'out'}")


async def started(settings, tmp_path, clock, sink=None):
    coordinator = Coordinator(settings, sink or FileSink(tmp_path / "out"), clock=clock)
    await coordinator.start()
    return coordinator


async def test_closed_windows_reach_the_sink_and_make_positions_safe(settings, tmp_path):
    clock = Clock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        for s in ("A", "B"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 20_000, 70_000]), position(3), 100)
        c.add_batch("B", items(100, [15_000]), position(101), 100)
        await asyncio.sleep(0.05)
        assert not output(tmp_path / "out")  # B's watermark (15 s) holds window [0, 60 s)
        c.add_batch("B", items(102, [61_000]), position(102), 100)
        await eventually(lambda: output(tmp_path / "out"))
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 100, 2]}
        assert c.safe_position("A") == position(2)
        assert c.safe_position("B") == position(101)
    finally:
        await c.stop()


async def test_ahead_shard_waits_for_its_status_while_over_the_cap_and_the_holder_does_not(settings, tmp_path):
    clock = Clock(1_000)
    c = await started(settings.replace(max_buffered_rows=3), tmp_path, clock)
    try:
        for s in ("slow", "fast"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("slow", items(1, [1_000]), position(1), 100)
        c.add_batch("fast", items(100, [100_000, 110_000, 120_000, 130_000]), position(103), 100)
        fast = asyncio.create_task(c.admit("fast"))
        await asyncio.wait_for(c.admit("slow"), 1)  # the watermark's shard is never delayed
        await asyncio.sleep(0.1)
        assert not fast.done()
        c.add_batch("slow", items(2, [150_000]), position(2), 100)  # the watermark moves on
        await asyncio.wait_for(fast, 2)
        assert c.ledger.rows <= 3
    finally:
        await c.stop()


async def test_spooled_rows_of_an_ended_shard_are_replayed_after_a_restart_then_deleted(settings, tmp_path):
    clock = Clock(1_000)
    c = await started(settings, tmp_path, clock)
    await c.open_shard("P", "TRIM_HORIZON")
    await c.open_shard("X", "TRIM_HORIZON")
    c.add_batch("P", items(1, [10_000, 11_000]), position(2), 0)
    c.add_batch("X", items(50, [5_000]), position(50), 100)
    await c.shard_ended("P")
    spool = tmp_path / "state" / "spool" / "P.jsonl"
    assert spool.exists()
    await c.stop()  # a crash: nothing was committed

    c = await started(settings, tmp_path, clock)
    try:
        await c.open_shard("C", "TRIM_HORIZON")
        c.add_batch("C", items(1000, [12_000, 70_000]), position(1001), 100)
        await asyncio.sleep(0.05)
        assert spool.exists()  # P holds window [0, 60 s): its children are unknown
        clock.now += 600_001  # until the idle timeout
        await eventually(lambda: not spool.exists())
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 2, 1000], "60000-120000.jsonl": [1001]}
        assert c.ordering.duplicates == 0
    finally:
        await c.stop()


async def test_failing_sink_is_retried_and_nothing_is_safe_until_it_commits(settings, tmp_path):
    class Flaky(FileSink):
        failures = 2

        async def commit(self, window):
            if self.failures:
                self.failures -= 1
                raise OSError("disk full")
            await super().commit(window)

    clock = Clock(1_000)
    sink = Flaky(tmp_path / "out")
    c = await started(settings, tmp_path, clock, sink)
    c.sink_backoff = Backoff(first=0.05, cap=0.05)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        c.add_batch("A", items(1, [1_000, 61_000]), position(2), 100)
        await asyncio.sleep(0.03)
        assert c.safe_position("A") is None
        await eventually(lambda: c.safe_position("A") == position(1))
        assert sink.failures == 0 and output(tmp_path / "out") == {"0-60000.jsonl": [1]}
    finally:
        await c.stop()
