"""Downstream of a batch: with a sink, rows go to the coordinator and checkpoints wait
for what it committed; without one, nothing waits."""

from __future__ import annotations

import mldserver
from mldserver.base.config import Settings
from mldserver.coordinator import Coordinator
from mldserver.base.positions import Position
from mldserver.rows.batch import Item, RowBatch
from mldserver.shard.downstream import CoordinatorLink, NoSink
from mldserver.sinks.file import FileSink
from mldserver.api.testing import SHARD_END, make_records

from ..harness import eventually, running


class EmitAndCheckpoint(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {"seq": record.sequence_number})
        await checkpointer.checkpoint()  # "everything": the server keeps it to what is committed


async def test_with_a_sink_no_checkpoint_passes_rows_the_sink_has_not_committed(tmp_path):
    out = tmp_path / "out"
    async with running(tmp_path, EmitAndCheckpoint, sink=f"file:{out}", window=3600.0, checkpoint_interval=0.0,
                       idle_timeout=3600.0) as (server, _, daemon):
        shard = await daemon.shard("shardId-1")
        # Behind the stream's tip: the watermark stays at the rows' time, the window open.
        await shard.process_records(make_records(10, 3), millis_behind_latest=1000)
        await shard.shutdown_requested()
        assert "shardId-1" not in daemon.checkpoints  # the window is still open: nothing is safe
        assert server.coordinator.ledger.rows == 3
        await shard.shard_ended()  # the rows are spooled, so SHARD_END may be stored
        assert daemon.checkpoints["shardId-1"] == SHARD_END
        spooled = (tmp_path / "state" / "spool" / "shardId-1.jsonl").read_text().splitlines()
        assert len(spooled) == 4  # a header and the three rows
        await shard.close()


async def test_rows_emitted_by_a_failed_attempt_are_not_kept(tmp_path):
    attempts = []

    class FailsOnce(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            for record in batch.records:
                batch.emit(record, {"seq": record.sequence_number, "attempt": len(attempts)})
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("flaky")

    async with running(tmp_path, FailsOnce, sink=f"file:{tmp_path / 'out'}", window=3600.0) as (server, _, daemon):
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(10, 2), millis_behind_latest=1000)  # window stays open
        rows = [r.data for r in server.coordinator.ledger.uncommitted("shardId-1")]
        assert rows == [b'{"seq":"10","attempt":1}', b'{"seq":"11","attempt":1}']
        await shard.lease_lost()
        await shard.close()


# -- with plain objects ----------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


async def test_without_a_sink_nothing_is_collected_clamped_or_checkpointed_by_the_server():
    released = []
    downstream = NoSink()
    assert not downstream.collects_rows and not downstream.holds_checkpoints
    assert await downstream.batch(RowBatch.empty(), Position(1, 0, "1"), 0, lambda: released.append(1)) is False
    assert downstream.safe() is None and released == []


async def test_the_coordinator_gets_the_rows_and_a_checkpoint_is_due_at_most_every_interval(tmp_path):
    settings = Settings(state_dir=str(tmp_path / "state"), sink=f"file:{tmp_path / 'out'}", window=3600.0)
    coordinator = Coordinator(settings, FileSink(tmp_path / "out"))
    clock = Clock()
    link = CoordinatorLink(coordinator, interval=10.0, clock=clock)
    released = []
    await link.open("s", None)
    seven = Position(7, 0, "7")
    due = await link.batch(RowBatch.of([Item(1000, seven, b'{"k":1}')]), seven, 1000, lambda: released.append(1))
    assert due is False and released == [1]
    assert [row.position for row in coordinator.ledger.uncommitted("s")] == [seven]
    assert link.safe() is None  # not committed yet
    clock.now = 10.0
    assert await link.batch(RowBatch.empty(), Position(8, 0, "8"), 1000, lambda: None) is True
    clock.now = 15.0
    assert await link.batch(RowBatch.empty(), Position(9, 0, "9"), 1000, lambda: None) is False


async def test_a_source_shard_is_checkpointed_as_soon_as_a_commit_moves_what_is_safe(tmp_path):
    """``on_commit`` (a --source shard): no interval to wait out; due each time what is
    safe has moved, and only then."""
    settings = Settings(state_dir=str(tmp_path / "state"), sink=f"file:{tmp_path / 'out'}", window=1.0)
    clock = Clock()  # the coordinator's, in epoch ms
    clock.now = 1000.0
    coordinator = Coordinator(settings, FileSink(tmp_path / "out"), clock=clock)
    await coordinator.start()
    link = CoordinatorLink(coordinator, interval=3600.0, on_commit=True, clock=lambda: 0.0)
    await link.open("s", None)
    seven, eight, nine = Position(7, 0, "7"), Position(8, 0, "8"), Position(9, 0, "9")
    assert await link.batch(RowBatch.of([Item(1000, seven, b'{"k":1}')]), seven, 100, lambda: None) is False
    assert await link.batch(RowBatch.of([Item(5000, eight, b'{"k":2}')]), eight, 100, lambda: None) is False
    assert await coordinator.step() == 1  # the window [1000, 2000) is committed: row 7 is safe
    assert link.safe() == seven
    assert await link.batch(RowBatch.empty(), nine, 100, lambda: None) is True  # at once, not in an hour
    assert await link.batch(RowBatch.empty(), nine, 100, lambda: None) is False  # nothing new is safe
    await coordinator.stop()


async def test_a_connection_that_ends_tells_the_coordinator_once_and_only_if_it_opened_its_shard(tmp_path):
    settings = Settings(state_dir=str(tmp_path / "state"), sink=f"file:{tmp_path / 'out'}", window=3600.0)
    coordinator = Coordinator(settings, FileSink(tmp_path / "out"))
    never_opened = CoordinatorLink(coordinator, interval=10.0)
    never_opened.close()
    assert not coordinator.shards.entries
    first, second = CoordinatorLink(coordinator, interval=10.0), CoordinatorLink(coordinator, interval=10.0)
    await first.open("s", None)
    await second.open("s", None)  # the shard on a second connection before the first ends
    first.close()
    first.close()
    assert coordinator.shards["s"].connections == 1 and not coordinator.shards["s"].gone
    second.close()
    assert coordinator.shards["s"].connections == 0 and coordinator.shards["s"].gone
    NoSink().close()


async def test_a_lost_lease_drops_the_shards_uncommitted_rows_from_the_coordinator(tmp_path):
    out = tmp_path / "out"
    async with running(tmp_path, EmitAndCheckpoint, sink=f"file:{out}", window=3600.0, checkpoint_interval=0.0,
                       idle_timeout=3600.0) as (server, _, daemon):
        lost, kept = await daemon.shard("shardId-1"), await daemon.shard("shardId-2")
        await lost.process_records(make_records(10, 3), millis_behind_latest=1000)
        await kept.process_records(make_records(20, 2), millis_behind_latest=1000)
        assert server.coordinator.ledger.rows == 5
        await lost.lease_lost()
        assert server.coordinator.ledger.rows == 2  # the new owner reads shardId-1's three again
        assert not server.coordinator.watermarks.tracks("shardId-1")
        await lost.close()
        await kept.close()


async def test_shards_ahead_wait_below_the_byte_cap_and_the_watermark_shard_never_waits(tmp_path):
    """Six shards far ahead of a slow one, on the real server and its handler processes:
    their statuses stop coming once the rows they added pass three quarters of
    ``max_buffered_bytes``, what is buffered never passes the cap, and the slow shard,
    which holds the watermark back, goes on at once all along."""
    import asyncio

    from mldserver.coordinator.pressure import HIGH_WATER

    assert Settings().max_buffered_bytes == 256 * 2**20  # the default
    cap, t0 = 300_000, 1476889707000
    async with running(tmp_path, "tests.pool_handlers:Emit", sink=f"file:{tmp_path / 'out'}", window=3600.0,
                       idle_timeout=3600.0, max_buffered_bytes=cap, shutdown_timeout=1.0) as (server, _, daemon):
        coordinator = server.coordinator
        slow = await daemon.shard("shardId-slow")
        await slow.process_records(make_records(1, 5, approximate_arrival_timestamp=t0), millis_behind_latest=1000)
        sent = {}

        async def ahead(shard, n, first=0, last=200):
            for b in range(first, last):  # 20 rows of ~130 bytes a batch: some 4 kB held, far below the cap
                await shard.process_records(make_records(10_000 + 20 * b, 20, 100,
                                                         approximate_arrival_timestamp=t0 + 10**7 + n),
                                            millis_behind_latest=1000)
                sent[n] = b + 1

        fast = [await daemon.shard(f"shardId-fast-{n}") for n in range(6)]
        for n, shard in enumerate(fast):  # each one's first batch through before any runs ahead
            await ahead(shard, n, 0, 1)
        tasks = [asyncio.create_task(ahead(shard, n, 1)) for n, shard in enumerate(fast)]
        try:
            # Each fast shard stops (its status waits) once the rows pass the high-water mark.
            await eventually(lambda: coordinator.ledger.bytes > cap * HIGH_WATER, 60, what="the high-water mark")
            stalled = -1
            while stalled != sum(sent.values()):  # (a batch read before the mark may still come back)
                stalled = sum(sent.values())
                await asyncio.sleep(1.0)
            assert not any(task.done() for task in tasks) and len(sent) == 6
            assert cap * HIGH_WATER < coordinator.ledger.bytes <= coordinator.status().peak_bytes <= cap
            for b in range(10):  # the watermark's shard is never delayed, however full
                await asyncio.wait_for(slow.process_records(
                    make_records(100 + 5 * b, 5, approximate_arrival_timestamp=t0 + b), millis_behind_latest=1000), 5)
            assert stalled == sum(sent.values()) and coordinator.status().peak_bytes <= cap
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_shard_held_by_back_pressure_checkpoints_what_commits_meanwhile_every_interval(tmp_path):
    """A shard far ahead waits for its status over the row cap; a window with some of
    its rows commits while it still waits: the checkpoint of what committed is made
    then (once the interval has passed), not only once the shard may go on."""
    import asyncio

    import orjson

    settings = Settings(window=60.0, idle_timeout=600.0, watermark_margin=5.0, state_dir=str(tmp_path / "state"),
                        sink=f"file:{tmp_path / 'out'}", max_buffered_rows=3)
    coordinator = Coordinator(settings, FileSink(tmp_path / "out"), clock=lambda: 1_000)
    await coordinator.start()
    clock = Clock()
    slow, fast = CoordinatorLink(coordinator, interval=10.0, clock=clock), CoordinatorLink(coordinator, interval=10.0,
                                                                                           clock=clock)

    def rows(first: int, times: list[int]) -> RowBatch:
        return RowBatch.of(Item(t, Position(first + i, 0, str(first + i)), orjson.dumps({"seq": first + i}))
                           for i, t in enumerate(times))

    checkpointed: list[Position | None] = []

    async def checkpoint_safe():
        checkpointed.append(fast.safe())

    try:
        await slow.open("slow", None)
        await fast.open("fast", None)
        assert await slow.batch(rows(1, [1_000]), Position(1, 0, "1"), 100, lambda: None) is False
        clock.now = 10.0  # a checkpoint is due at the next chance
        held = asyncio.create_task(fast.batch(rows(100, [1_000, 100_000, 110_000, 130_000]), Position(103, 0, "103"),
                                              100, lambda: None, meanwhile=checkpoint_safe))
        await eventually(lambda: coordinator.watermarks.holder(1_000) == "slow", what="the fast shard added")
        for _ in range(20):
            await asyncio.sleep(0)
        assert not held.done() and checkpointed == []  # held; nothing committed yet
        # The slow shard moves on: [0, 60 s) closes and commits with the fast shard's first
        # row, and the fast one, still far ahead over the cap, goes on waiting.
        await slow.batch(rows(2, [70_000]), Position(2, 0, "2"), 100, lambda: None)
        assert await coordinator.step() == 1
        await eventually(lambda: checkpointed, what="a checkpoint while held")
        assert checkpointed == [Position(100, 0, "100")] and not held.done()
        assert await coordinator.step() == 0  # another pass, the interval not passed again: no checkpoint
        for _ in range(20):
            await asyncio.sleep(0)
        assert checkpointed == [Position(100, 0, "100")] and not held.done()
        await slow.batch(rows(3, [150_000]), Position(3, 0, "3"), 100, lambda: None)
        assert await coordinator.step() == 1  # [60 s, 120 s): the fast shard goes on, its checkpoint made a moment ago
        assert await asyncio.wait_for(held, 2) is False
    finally:
        held.cancel()
        await coordinator.stop()
