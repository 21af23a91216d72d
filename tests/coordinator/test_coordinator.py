"""The coordinator on an event loop with a fake clock and the real file sink:
commits, safe positions, back-pressure, the spool, a failing sink. Tests drive the
committer with ``step()`` at a clock they move; the background committer may run
too, but a pass at the same clock finds nothing more to do."""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import orjson
import pytest

from mldserver.base.backoff import Backoff
from mldserver.base.config import Settings
from mldserver.base.deadletters import DeadLetters
from mldserver.spark.commitlog import CommitLog
from mldserver.base.handoff import Committed
from mldserver.base.intervals import after
from mldserver.coordinator import Coordinator
from mldserver.errors import SparkError
from mldserver.server.metrics import Metrics
from mldserver.base.positions import Position
from mldserver.rows.batch import Item, RowBatch
from mldserver.sinks.file import FileSink
from mldserver.spark.frames import commit_entry, window_frame

from ..harness import eventually
from ..helpers import FakeClock, resident_kib

MINUTE = 60_000


def items(first_seq, times):
    return RowBatch.of(Item(t, position(first_seq + i), orjson.dumps({"seq": first_seq + i}))
                       for i, t in enumerate(times))


def position(seq):
    return Position(seq, 0, str(seq))


def output(directory):
    return {p.name: [orjson.loads(line)["seq"] for line in p.read_text().splitlines()]
            for p in sorted(directory.glob("*.jsonl"))}


async def settle():
    """Let every task that is ready run (loop turns, not time)."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def settings(tmp_path):
    return Settings(window=60.0, idle_timeout=600.0, watermark_margin=5.0, state_dir=str(tmp_path / "state"),
                    sink=f"file:{tmp_path / 'out'}")


class Held(FileSink):
    """A file sink whose commits wait for ``gate``."""

    def __init__(self, directory, gate):
        super().__init__(directory)
        self.gate = gate

    async def commit(self, window):
        await self.gate.wait()
        await super().commit(window)


async def started(settings, tmp_path, clock, sink=None):
    coordinator = Coordinator(settings, sink or FileSink(tmp_path / "out"), clock=clock)
    await coordinator.start()
    return coordinator


async def test_closed_windows_reach_the_sink_and_make_positions_safe(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        for s in ("A", "B"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 20_000, 70_000]), position(3), 100)
        c.add_batch("B", items(100, [15_000]), position(101), 100)
        assert await c.step() == 0
        assert not output(tmp_path / "out")  # B's watermark (15 s) holds window [0, 60 s)
        assert c.safe_position("A") is None
        c.add_batch("B", items(102, [61_000]), position(102), 100)
        assert await c.step() == 1
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 100, 2]}
        assert c.safe_position("A") == position(2)
        assert c.safe_position("B") == position(101)
    finally:
        await c.stop()


async def test_the_status_is_one_snapshot_of_what_is_buffered_committed_and_holding(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        before = c.status()
        assert (before.global_watermark, before.buffered_rows, before.last_commit, dict(before.watermarks)) == (
            float("inf"), 0, None, {})  # no shard holds anything back
        for s in ("A", "B"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 70_000]), position(2), 100)
        c.add_batch("B", items(100, [15_000]), position(100), 100)
        held = c.status()
        assert held.global_watermark == 15_000 and dict(held.watermarks) == {"A": 70_000, "B": 15_000}
        assert (held.buffered_rows, held.open_windows, held.windows_committed) == (3, 2, 0)
        assert held.buffered_bytes == held.peak_bytes > 0 and held.peak_rows == 3
        c.add_batch("B", items(101, [65_000]), position(101), 100)
        assert await c.step() == 1
        done = c.status()
        assert (done.windows_committed, done.rows_committed, done.buffered_rows, done.open_windows) == (1, 2, 2, 1)
        assert (done.last_commit.window, done.last_commit.rows, done.last_commit.late) == ("0-60000", 2, 0)
        assert done.peak_rows == 4 and done.late_rows == 0 and held.buffered_rows == 3  # a snapshot stays as read
    finally:
        await c.stop()


async def test_ahead_shard_waits_for_its_status_while_over_the_cap_and_the_holder_does_not(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings.replace(max_buffered_rows=3), tmp_path, clock)
    try:
        for s in ("slow", "fast"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("slow", items(1, [1_000]), position(1), 100)
        c.add_batch("fast", items(100, [100_000, 110_000, 120_000, 130_000]), position(103), 100)
        fast = asyncio.create_task(c.admit("fast"))
        await asyncio.wait_for(c.admit("slow"), 1)  # the watermark's shard is never delayed
        assert await c.step() == 0  # a pass wakes the waiters: still over the cap, still ahead
        await settle()
        assert not fast.done()
        c.add_batch("slow", items(2, [150_000]), position(2), 100)  # the watermark moves on
        assert await c.step() == 2
        await asyncio.wait_for(fast, 2)
        assert c.ledger.rows <= 3
    finally:
        await c.stop()


async def test_over_the_cap_the_shards_the_open_window_needs_go_on_together_and_those_past_it_wait(
        settings, tmp_path):
    """Shards still short of the end of the window the watermark is in all go on (it
    closes only once each passes its end), not one at a time as each becomes the
    holder; a shard past that end waits until the window commits."""
    clock = FakeClock(1_000)
    c = await started(settings.replace(max_buffered_rows=4), tmp_path, clock)
    try:
        for s in ("A", "B", "C", "D"):
            await c.open_shard(s, "TRIM_HORIZON")
        for i, s in enumerate(("A", "B", "C")):
            c.add_batch(s, items(10 * i + 1, [1_000, 2_000]), position(10 * i + 2), 100)
        c.add_batch("D", items(31, [61_000]), position(31), 100)  # past the window [0, 60 s)
        ahead = asyncio.create_task(c.admit("D"))
        for s in ("A", "B", "C"):  # A holds the watermark (ties at 2 s); B and C are as needed
            await asyncio.wait_for(c.admit(s), 1)
        await settle()
        assert not ahead.done()
        for i, s in enumerate(("A", "B", "C")):
            c.add_batch(s, items(10 * i + 3, [62_000]), position(10 * i + 3), 100)
        assert await c.step() == 1  # every shard past 60 s: [0, 60 s) commits
        await asyncio.wait_for(ahead, 2)
    finally:
        await c.stop()


async def test_rows_past_the_memory_cap_wait_in_files_and_commit_as_they_were(settings, tmp_path):
    """The holder must go on for a window to close, whatever memory it takes: what
    lands past max_buffered_bytes is spilled, so the memory buffered never passes it."""
    clock = FakeClock(1_000)
    cap = 3 * items(1, [1_000] * 100).held_bytes()
    c = await started(settings.replace(max_buffered_bytes=cap), tmp_path, clock)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        for b in range(6):  # six batches of 100 rows in one window: twice the cap
            c.add_batch("A", items(100 * b + 1, [1_000 + b] * 100), position(100 * b + 100), 100)
            assert c.ledger.bytes <= cap
        assert c.spill.bytes > 0 and c.ledger.rows == 600
        c.add_batch("A", items(601, [MINUTE + 1]), position(601), 100)  # the window closes
        assert await c.step() == 1
        assert output(tmp_path / "out") == {"0-60000.jsonl": list(range(1, 601))}
        assert c.ledger.safe("A") == position(600) and c.ledger.bytes < cap
    finally:
        await c.stop()
    assert list((tmp_path / "state" / "spill").iterdir()) == []


async def test_a_committed_windows_spilled_rows_let_their_pages_go_while_their_segment_lives_on(settings, tmp_path):
    """The sink reads a window's spilled rows through the segment's map; once the window
    commits, those pages go back to the page cache, though later rows in the same
    segment keep it open."""
    clock = FakeClock(1_000)
    big = [1_000] * 2_000
    cap = items(1, big).held_bytes()
    c = await started(settings.replace(max_buffered_bytes=cap), tmp_path, clock)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        for b in range(4):  # 8,000 rows in window 0, three batches of them spilled
            c.add_batch("A", items(2_000 * b + 1, big), position(2_000 * b + 2_000), 100)
        spilled = c.spill.bytes
        c.add_batch("A", items(8_001, [MINUTE + 1] * 2_000), position(10_000), 100)  # window 1, spilled too
        assert c.spill.bytes > spilled > 200_000
        assert await c.step() == 1
        assert len(output(tmp_path / "out")["0-60000.jsonl"]) == 8_000
        # The sink read all of window 0; its pages were let go, window 1's stay at most.
        assert resident_kib(lambda _, header: "/spill/rows-" in header) * 1024 <= c.spill.bytes - spilled + 2 * 4096
    finally:
        await c.stop()


async def test_spooled_rows_of_an_ended_shard_are_replayed_after_a_restart_then_deleted(settings, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    await c.open_shard("P", "TRIM_HORIZON")
    await c.open_shard("X", "TRIM_HORIZON")
    c.add_batch("P", items(1, [10_000, 11_000]), position(2), 0)
    c.add_batch("X", items(50, [5_000]), position(50), 100)
    await c.shard_ended("P")
    spool = tmp_path / "state" / "spool" / "P.jsonl"
    assert spool.exists()
    await c.stop()  # a crash: nothing was committed
    assert not output(tmp_path / "out")

    c = await started(settings, tmp_path, clock)
    try:
        await c.open_shard("C", "TRIM_HORIZON")
        c.add_batch("C", items(1000, [12_000, 70_000]), position(1001), 100)
        assert await c.step() == 0
        assert spool.exists()  # P holds window [0, 60 s): its children are unknown
        clock.advance(600_001)  # until the idle timeout
        assert await c.step() == 2
        assert not spool.exists()
        said = [r.getMessage() for r in caplog.records if r.getMessage() in ("window_committed", "spool_deleted")]
        assert said == ["window_committed", "spool_deleted", "window_committed"]  # the cause, then the effect
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 2, 1000], "60000-120000.jsonl": [1001]}
        assert c.ordering.duplicates == 0
    finally:
        await c.stop()


class Flaky(FileSink):
    """The file sink, failing its first ``failures`` commits with ``error``; it notes
    what the coordinator let shard A checkpoint at each failed attempt."""

    def __init__(self, directory, error, failures=2):
        super().__init__(directory)
        self.error, self.failures = error, failures
        self.coordinator = None
        self.safe_while_failing = []

    async def commit(self, window):
        if self.failures:
            self.failures -= 1
            self.safe_while_failing.append(self.coordinator.safe_position("A"))
            raise self.error
        await super().commit(window)


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), SparkError("ZeroDivisionError: boom")],
                         ids=["io", "pipeline"])
async def test_failing_sink_is_retried_and_reported_and_nothing_is_safe_until_it_commits(
    settings, tmp_path, caplog, error
):
    caplog.set_level(logging.INFO, logger="mldserver")
    clock = FakeClock(1_000)
    sink = Flaky(tmp_path / "out", error)
    metrics = Metrics()
    c = Coordinator(settings, sink, clock=clock, metrics=metrics)
    await c.start()
    sink.coordinator = c
    c.committer.backoff = Backoff(first=0.01, cap=0.01)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        c.add_batch("A", items(1, [1_000, 61_000]), position(2), 100)
        assert await c.step() == 1
        assert sink.safe_while_failing == [None, None]
        assert c.safe_position("A") == position(1)
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1]}
        failed = [r.fields for r in caplog.records if r.getMessage() == "sink_commit_failed"]
        assert [f["attempt"] for f in failed] == [1, 2]
        assert all(f["window"] == "0-60000" and type(error).__name__ in f["error"] for f in failed)
        assert metrics.registry.get_sample_value("mldserver_window_commit_failures_total") == 2
        assert metrics.registry.get_sample_value("mldserver_window_commit_duration_seconds_count") == 1
    finally:
        await c.stop()


async def test_a_sink_error_that_is_not_an_io_error_is_retried_and_never_ends_the_committer(settings, tmp_path):
    clock = FakeClock(1_000)
    sink = Flaky(tmp_path / "out", TypeError("a bug in the sink"), failures=1)
    c = await started(settings, tmp_path, clock, sink)
    c.committer.backoff = Backoff(first=0.001, cap=0.001)
    sink.coordinator = c
    await c.open_shard("A", "TRIM_HORIZON")
    c.add_batch("A", items(1, [1_000, 61_000]), position(2), 100)
    await eventually(lambda: c.safe_position("A") is not None, what="the window committed on its second attempt")
    assert sink.failures == 0 and len(output(tmp_path / "out")) == 1 and not any(t.done() for t in c.tasks)
    await c.stop()
    assert c.tasks == []


class Preparing(FileSink):
    """The file sink, noting each ``prepare`` and ``commit`` in the order it is told."""

    def __init__(self, directory):
        super().__init__(directory)
        self.calls = []

    def prepare(self, window):
        self.calls.append(("prepare", window.id))

    async def commit(self, window):
        self.calls.append(("commit", window.id))
        await super().commit(window)


async def test_windows_closed_at_once_commit_in_order_each_prepared_while_the_one_before_commits(
    settings, tmp_path
):
    clock = FakeClock(1_000)
    sink = Preparing(tmp_path / "out")
    c = await started(settings, tmp_path, clock, sink)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        c.add_batch("A", items(1, [1_000, 61_000, 121_000, 181_000]), position(4), 100)
        assert await c.step() == 3
        w0, w1, w2 = "0-60000", "60000-120000", "120000-180000"
        assert sink.calls == [("prepare", w1), ("commit", w0), ("prepare", w2), ("commit", w1), ("commit", w2)]
        assert output(tmp_path / "out") == {f"{w}.jsonl": [n] for n, w in enumerate([w0, w1, w2], 1)}
    finally:
        await c.stop()


class Gated(Preparing):
    """``Preparing``, whose first commit waits until the test opens the gate."""

    def __init__(self, directory):
        super().__init__(directory)
        self.gate = asyncio.Event()

    async def commit(self, window):
        self.calls.append(("commit", window.id))
        if len(self.calls) == 1:
            await self.gate.wait()
        await FileSink.commit(self, window)


async def test_a_window_closed_while_one_commits_is_prepared_behind_it_and_every_shard_waits_for_that_commit(
    settings, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="mldserver")
    clock = FakeClock(1_000)
    sink = Gated(tmp_path / "out")
    c = await started(settings, tmp_path, clock, sink)
    try:
        for s in ("A", "B"):
            await c.open_shard(s, "TRIM_HORIZON")
            c.add_batch(s, items(1, [1_000, 61_000]), position(2), 100)
        await settle()  # the committer's pass: 0-60000 closed, its commit waits at the gate
        assert sink.calls == [("commit", "0-60000")]
        c.add_batch("A", items(3, [121_000]), position(3), 100)
        await asyncio.wait_for(c.admit("A"), 1)  # nothing waits behind the commit yet
        c.add_batch("B", items(3, [121_000]), position(3), 100)  # 60000-120000 closes
        assert sink.calls[-1] == ("prepare", "60000-120000")  # made ready while 0-60000 commits
        held = {s: asyncio.create_task(c.admit(s)) for s in ("A", "B")}
        clock.advance(settings.idle_timeout * 1000 + 1)  # held shards are not idle
        await settle()
        assert not any(t.done() for t in held.values())  # the watermark's shard (A) too
        assert c.watermarks.holder(clock()) == "A"
        sink.gate.set()
        await asyncio.wait_for(asyncio.gather(*held.values()), 2)
        await asyncio.wait_for(c.step(), 2)  # after the committer's pass, which committed both
        assert sink.calls == [("commit", "0-60000"), ("prepare", "60000-120000"), ("commit", "60000-120000")]
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 1], "60000-120000.jsonl": [2, 2]}
        waits = [r.fields for r in caplog.records if r.getMessage() == "backpressure"]
        assert sorted(w["shard_id"] for w in waits) == ["A", "B"]
        assert {w["reason"] for w in waits} == {"sink_behind"} and {w["windows_waiting"] for w in waits} == {1}
    finally:
        await c.stop()


# -- shards gone from here are forgotten ---------------------------------------------------

def known(c, shard_id):
    """Where the coordinator still keeps something for this shard."""
    places = {"coordinator": c.shards, "ledger": c.ledger.shards, "ordering": c.ordering.shards,
              "watermarks": c.watermarks.shards, "lineage": c.lineage.seen, "parents": c.lineage.parents,
              "children": c.lineage.children}
    return sorted(name for name, kept in places.items() if shard_id in kept)


async def test_an_ended_shard_is_forgotten_once_its_rows_commit_and_it_stops_holding(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        await c.open_shard("P", "TRIM_HORIZON")
        c.add_batch("P", items(1, [10_000, 11_000]), position(2), 100)
        await c.shard_ended("P")
        c.shard_closed("P")
        assert await c.step() == 0
        assert known(c, "P") == ["coordinator", "ledger", "lineage", "ordering", "watermarks"]  # holds: no child yet
        await c.open_shard("C", None)  # from the stream's edge, after P ended: P's child
        assert c.lineage.parents_of("C") == ("P",)
        c.add_batch("C", items(100, [70_000]), position(100), 100)  # reported: P stops holding
        assert await c.step() == 1
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 2]}
        assert not (tmp_path / "state" / "spool" / "P.jsonl").exists()
        assert known(c, "P") == [] and c.safe_position("P") is None
        assert known(c, "C") == ["coordinator", "ledger", "lineage", "ordering", "parents", "watermarks"]
        assert c.watermarks.holder(clock()) == "C"  # only shards still here are scanned
    finally:
        await c.stop()


async def test_a_shard_whose_lease_was_lost_is_forgotten_after_its_rows_commit(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        for s in ("A", "B"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000]), position(1), 100)
        c.shard_closed("A")  # its lease lost: the connection ends, not the shard
        c.add_batch("B", items(100, [20_000]), position(100), 100)
        assert await c.step() == 0
        assert "ledger" in known(c, "A")  # its row is not committed, and it still holds
        clock.advance(600_001)  # the idle timeout: A stops holding
        c.add_batch("B", items(101, [700_000]), position(101), 100)
        assert await c.step() == 1
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1, 100]}
        assert known(c, "A") == [] and "ledger" in known(c, "B")
    finally:
        await c.stop()


async def test_a_shard_still_connected_is_never_forgotten(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        await c.open_shard("A", "TRIM_HORIZON")  # a second connection for it, before the first ends
        c.add_batch("A", items(1, [10_000]), position(1), 100)
        c.shard_closed("A")
        clock.advance(600_001)
        assert await c.step() == 1
        assert known(c, "A") == ["coordinator", "ledger", "lineage", "ordering", "watermarks"]
        assert c.safe_position("A") == position(1)
        c.shard_closed("A")
        await c.step()
        assert known(c, "A") == []
    finally:
        await c.stop()


async def test_a_forgotten_shard_that_comes_back_has_what_it_delivered_dropped_as_duplicates(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 11_000]), position(2), 100)
        c.shard_closed("A")
        clock.advance(600_001)
        assert await c.step() == 1
        assert known(c, "A") == []
        await c.open_shard("A", "1")  # the lease back here; the daemon re-delivers from its checkpoint
        c.add_batch("A", items(2, [11_000, 12_000]), position(3), 100)
        assert c.ordering.duplicates == 1 and c.ledger.rows == 1
    finally:
        await c.stop()


async def test_a_redelivered_batch_does_not_move_the_watermark_however_late_its_event_times(settings, tmp_path):
    """A batch at or below the shard's highest position is a replay: dropped whole, its
    event times count for nothing, so a "closing" batch numbered below what the shard
    already sent closes no window (what made the SIGHUP reload test flaky under load)."""
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        c.add_batch("A", items(100, [10_000, 11_000]), position(101), 100)
        c.add_batch("A", items(99, [600 * MINUTE]), position(99), 100)  # below 101: a replay
        assert c.ordering.duplicates == 1 and c.watermarks.value("A") == 11_000
        assert await c.step() == 0 and not output(tmp_path / "out")
        c.add_batch("A", items(102, [600 * MINUTE]), position(102), 100)  # the shard's next one
        assert await c.step() == 1
        assert output(tmp_path / "out") == {"0-60000.jsonl": [100, 101]}
    finally:
        await c.stop()


async def test_a_spool_replayed_at_start_up_is_forgotten_once_committed(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    await c.open_shard("P", "TRIM_HORIZON")
    c.add_batch("P", items(1, [10_000]), position(1), 100)
    await c.shard_ended("P")
    await c.stop()
    c = await started(settings, tmp_path, clock)
    try:
        assert "ledger" in known(c, "P")
        clock.advance(600_001)
        assert await c.step() == 1
        assert known(c, "P") == []
    finally:
        await c.stop()


async def test_a_window_committed_while_an_ended_shards_spool_is_written_still_deletes_it(settings, tmp_path,
                                                                                          monkeypatch):
    # shardEnded spools the shard's uncommitted rows (in a thread); the window holding them
    # commits meanwhile. Its commit found no spool to delete, and no later window holds the
    # shard's rows: the file stayed, to be replayed (and to hold the watermark) at each start
    clock = FakeClock(70_000)
    gate = asyncio.Event()
    c = await started(settings, tmp_path, clock, Held(tmp_path / "out", gate))
    writing, release = threading.Event(), threading.Event()
    write = c.spool.write

    def slow_write(*args):
        writing.set()
        release.wait(30)
        return write(*args)

    monkeypatch.setattr(c.spool, "write", slow_write)
    spool = tmp_path / "state" / "spool" / "A.jsonl"
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        await c.open_shard("B", "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 20_000]), position(2), 0)  # caught up: its watermark follows the clock
        c.add_batch("B", items(100, [66_000]), position(100), 100)
        passing = asyncio.create_task(c.step())  # [0, 60 s) closes with A's rows; its commit waits
        await settle()
        ending = asyncio.create_task(c.shard_ended("A"))  # A's rows on their way to the spool
        while not writing.is_set():
            await asyncio.sleep(0.001)
        gate.set()
        await passing  # (or the committer's pass, which it waits for)
        assert c.ledger.done("A") and output(tmp_path / "out") == {"0-60000.jsonl": [1, 2]}  # while it is written
        release.set()
        await ending
        assert not spool.exists()
    finally:
        release.set()
        await c.stop()


async def test_a_spool_whose_rows_were_all_committed_is_deleted_at_start_up_and_holds_nothing(settings, tmp_path):
    # stopped between a window's commit and its spool's deletion: the commit log has the
    # rows; the spool is read, found committed, and goes (it would otherwise hold the
    # watermark back until the idle timeout at every start, and never be deleted)
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    await c.open_shard("P", "TRIM_HORIZON")
    c.add_batch("P", items(1, [10_000, 11_000]), position(2), 0)
    await c.shard_ended("P")
    await c.stop()
    spool = tmp_path / "state" / "spool" / "P.jsonl"
    assert spool.exists()

    class Logged(FileSink):
        async def start(self):
            return Committed(positions={"P": position(2)}, end=60_000, windows=1)

    c = await started(settings, tmp_path, clock, Logged(tmp_path / "out"))
    try:
        assert not spool.exists() and known(c, "P") == []
        await c.open_shard("C", None)
        c.add_batch("C", items(100, [70_000, 130_000]), position(101), 100)
        assert await c.step() == 1  # [60 s, 120 s) closes: P does not hold the watermark back
    finally:
        await c.stop()


async def test_the_shards_a_commit_log_names_cost_no_state_until_heard_of_and_their_replays_are_dropped(
        settings, tmp_path):
    """A commit log naming every shard a long-lived stream has had (5,000 here): none
    gets an entry, a queue or a watermark at start-up, so a pass costs what the shards
    served cost; one heard of again has its committed rows dropped as duplicates."""
    past = {f"shardId-{i:012d}": position(10) for i in range(5_000)}

    class Logged(FileSink):
        async def start(self):
            return Committed(positions=past, end=60_000, windows=5_000)

    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock, Logged(tmp_path / "out"))
    try:
        assert not c.shards and not c.ordering.shards and not c.watermarks.shards and not c.ledger.shards
        await c.open_shard("shardId-000000000007", "9")  # its lease here now: re-delivered from a checkpoint
        c.add_batch("shardId-000000000007", items(9, [70_000, 71_000, 72_000]), position(11), 100)
        c.add_batch("shardId-000000000042", items(10, [73_000]), position(10), 100)  # (a spool's replay: no open)
        assert c.ordering.duplicates == 3 and c.ledger.rows == 1
        assert known(c, "shardId-000000000001") == [] and len(c.shards) == 2
    finally:
        await c.stop()


async def test_a_shard_forgotten_long_ago_still_has_its_committed_rows_dropped_when_it_comes_back(
        settings, tmp_path, monkeypatch):
    """However many shards were forgotten since (more than ``ordering`` remembers
    positions for), a shard that comes back has its committed rows dropped."""
    monkeypatch.setattr("mldserver.coordinator.ordering.RETIRED", 2)
    clock = FakeClock(1_000)
    c = await started(settings.replace(idle_timeout=1.0), tmp_path, clock)
    try:
        for shard_id in ["A", *(f"other-{i}" for i in range(5))]:
            await c.open_shard(shard_id, None)
            c.add_batch(shard_id, items(1, [clock() + 1, clock() + 2]), position(2), 0)
            c.shard_closed(shard_id)
            clock.advance(120_000)
            await c.step()
        assert known(c, "A") == [] and "A" not in c.ordering.retired
        await c.open_shard("A", "1")
        c.add_batch("A", items(2, [clock() + 1, clock() + 2]), position(3), 100)
        assert c.ordering.duplicates == 1 and c.ledger.rows == 1
    finally:
        await c.stop()


async def test_what_is_kept_per_shard_stays_bounded_over_many_shard_cycles(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings.replace(idle_timeout=1.0), tmp_path, clock)
    try:
        for i in range(300):
            shard_id = f"shardId-{i:012d}"
            await c.open_shard(shard_id, None)
            c.add_batch(shard_id, items(i * 10, [clock() + 1]), position(i * 10), 0)
            await c.shard_ended(shard_id)
            c.shard_closed(shard_id)
            clock.advance(2_000)
            await c.step()
        assert len(c.ledger.shards) <= 2 and len(c.watermarks.shards) <= 2 and len(c.ordering.shards) <= 2
        assert len(c.lineage.seen) <= 2 and len(c.lineage.parents) <= 2 and len(c.lineage.children) <= 2
        assert len(c.lineage._ended) <= 64 and not c.shards
    finally:
        await c.stop()


async def test_a_lost_lease_drops_the_shards_uncommitted_rows_and_lets_go_of_the_watermark(settings, tmp_path):
    clock = FakeClock(1_000)
    c = await started(settings, tmp_path, clock)
    try:
        for s in ("A", "B"):
            await c.open_shard(s, "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 70_000]), position(2), 100)
        c.add_batch("B", items(100, [5_000]), position(100), 100)
        c.add_batch("B", items(101, [65_000]), position(101), 100)
        assert await c.step() == 1  # [0, 60 s) closes: A's row 1, B's row 100
        c.add_batch("B", items(102, [80_000]), position(102), 100)
        c.lease_lost("B")  # B's lease went elsewhere: 101 and 102 are not committed here
        assert c.ledger.rows == 1  # A's row at 70 s only
        assert c.watermarks.value("B") == float("-inf") and not c.watermarks.tracks("B")
        c.add_batch("A", items(3, [130_000]), position(3), 100)
        await c.step()  # B no longer holds [60 s, 120 s) back (the committer may have closed it already)
        assert output(tmp_path / "out") == {"0-60000.jsonl": [100, 1], "60000-120000.jsonl": [2]}

        # B's lease comes back, from its last checkpoint: 101 and 102 are new here again
        await c.open_shard("B", position(100))
        c.add_batch("B", items(101, [65_000, 80_000]), position(102), 100)
        assert c.ordering.duplicates == 0 and c.ledger.rows == 3
        c.add_batch("B", items(100, [5_000]), position(100), 100)  # but a committed one is a duplicate
        assert c.ordering.duplicates == 1
    finally:
        await c.stop()


async def test_a_lease_lost_while_its_rows_commit_is_dropped_after_the_commit(settings, tmp_path):
    clock = FakeClock(1_000)
    gate = asyncio.Event()
    c = await started(settings, tmp_path, clock, Held(tmp_path / "out", gate))
    try:
        await c.open_shard("A", "TRIM_HORIZON")
        c.add_batch("A", items(1, [10_000, 70_000, 130_000]), position(3), 100)
        c.add_batch("A", items(4, [200_000]), position(4), 100)
        passing = asyncio.create_task(c.step())  # windows [0, 60 s) .. [120 s, 180 s) close
        await settle()
        c.lease_lost("A")  # the windows already closed still commit; row 4 goes
        gate.set()
        await passing  # (or the committer's pass, which it waits for)
        assert c.ledger.rows == 0 and c.safe_position("A") == position(3)
        assert output(tmp_path / "out") == {"0-60000.jsonl": [1], "60000-120000.jsonl": [2],
                                            "120000-180000.jsonl": [3]}
    finally:
        await c.stop()


class SharedFileSink(FileSink):
    """A file sink that says what another server committed of each shard."""

    def __init__(self, directory, positions):
        super().__init__(directory)
        self.positions = positions
        self.asked = []

    async def committed_position(self, shard_id):
        self.asked.append(shard_id)
        return self.positions.get(shard_id)


async def test_a_shared_sinks_committed_position_is_read_when_a_shard_opens_and_drops_what_is_below(settings,
                                                                                                   tmp_path):
    clock = FakeClock(1_000)
    sink = SharedFileSink(tmp_path / "out", {"A": position(5)})
    c = await started(settings, tmp_path, clock, sink)
    try:
        await c.open_shard("A", position(2))  # the checkpoint lags what another server committed
        await c.open_shard("B", "TRIM_HORIZON")
        assert sink.asked == ["A", "B"]
        c.add_batch("A", items(3, [10_000, 11_000, 12_000, 13_000]), position(6), 0)
        assert c.ordering.duplicates == 3 and c.ledger.rows == 1  # 3, 4 and 5 were committed there
    finally:
        await c.stop()


def test_the_coordinator_stays_a_facade():
    """Policy and mechanism live in its pieces (pressure, committer, shards, ...): the
    class itself stays within 300 lines and 12 attributes."""
    import ast
    import inspect

    from mldserver.coordinator import coordinator as module

    tree = ast.parse(inspect.getsource(module))
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Coordinator"]
    attributes = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                  and isinstance(n.value, ast.Name) and n.value.id == "self"}
    assert cls.end_lineno - cls.lineno + 1 <= 300 and len(attributes) <= 12, (cls.end_lineno - cls.lineno + 1,
                                                                               sorted(attributes))


# -- late rows: late_policy -------------------------------------------------------------------

async def late_run(settings, tmp_path, policy):
    """A closes [0, 60_000) alone (B idle); then B comes back with a row at 30_000, in
    a closed window, and one at 130_000, and A goes on to close [60_000, 120_000)."""
    clock = FakeClock(1_000)
    c = await started(settings.replace(late_policy=policy, idle_timeout=10.0), tmp_path, clock)
    try:
        await a_closes_alone_then_b_comes_back(c, clock, tmp_path)  # 30_000 is late: its window closed
        return c
    finally:
        await c.stop()


async def a_closes_alone_then_b_comes_back(c, clock, tmp_path, check=lambda: None):
    """A closes [0, 60_000) alone (B idle; then ``check``); then B comes back with rows
    at 30_000 and 130_000, and A goes on to 125_000."""
    for s in ("A", "B"):
        await c.open_shard(s, "TRIM_HORIZON")
    c.add_batch("A", items(1, [10_000]), position(1), 100)
    clock.advance(5_000)
    c.add_batch("A", items(2, [61_000]), position(2), 100)
    clock.advance(5_001)  # B is idle: A alone holds, at 61_000
    await c.step()
    assert output(tmp_path / "out") == {"0-60000.jsonl": [1]}
    check()
    c.add_batch("B", items(100, [30_000, 130_000]), position(101), 100)
    c.add_batch("A", items(3, [125_000]), position(3), 100)
    await c.step()


async def test_a_late_row_goes_with_the_next_window_under_next(settings, tmp_path):
    c = await late_run(settings, tmp_path, "next")
    assert output(tmp_path / "out") == {"0-60000.jsonl": [1], "60000-120000.jsonl": [2],
                                        "60000-120000.late.jsonl": [100]}  # the file sink's side file
    assert c.status().late_rows == 1 and c.committer.last_commit.late == 1 and c.committer.late_dropped == 0
    assert c.safe_position("B") == position(100)


async def test_a_late_row_is_left_out_and_counted_under_drop_and_its_shard_checkpoints_past_it(settings, tmp_path):
    c = await late_run(settings, tmp_path, "drop")
    assert output(tmp_path / "out") == {"0-60000.jsonl": [1], "60000-120000.jsonl": [2]}
    assert c.status().late_rows == 1 and c.committer.late_dropped == 1 and c.committer.last_commit.late == 0
    assert c.safe_position("B") == position(100)
    assert not (tmp_path / "state" / "dead-letters" / "rows.jsonl").exists()


async def test_a_late_row_is_dead_lettered_with_its_data_under_dead_letter(settings, tmp_path):
    c = await late_run(settings, tmp_path, "dead-letter")
    assert output(tmp_path / "out") == {"0-60000.jsonl": [1], "60000-120000.jsonl": [2]}
    [entry] = [orjson.loads(line) for line in (tmp_path / "state" / "dead-letters" / "rows.jsonl").read_text().splitlines()]
    assert entry["reason"] == "late row" and orjson.loads(entry["row"]) == {"seq": 100}
    assert entry["window"] == "60000-120000" and "30000" in entry["error"]
    assert c.committer.late_dropped == 1 and c.safe_position("B") == position(100)


# -- committed intervals: a reading below where an earlier one started ---------------------------

class LoggedSink(FileSink):
    """The file sink's JSON lines and the parquet sink's commit log (``spark/commitlog.py``),
    each entry as the Spark process writes it (``commit_entry`` of the window's frame):
    the parquet sink's commit without Spark."""

    def __init__(self, directory):
        super().__init__(directory)
        self.log = CommitLog(directory)

    async def start(self):
        return self.log.read()

    async def commit(self, window):
        if self.log.has(window.id):
            return
        await super().commit(window)
        self.log.append(commit_entry(window_frame(window), None))


def committed_seqs(directory):
    return sorted(seq for seqs in output(directory).values() for seq in seqs)


async def read(c, clock, shard_id, first, last, checkpoint):
    """One reading of the shard: initialized at ``checkpoint``, records ``first`` to
    ``last`` delivered in batches of 10 (caught up at the end), then every window closed."""
    await c.open_shard(shard_id, checkpoint)
    for seq in range(first, last + 1, 10):
        top = min(seq + 9, last)
        c.add_batch(shard_id, items(seq, [clock() + i for i in range(top - seq + 1)]), position(top),
                    0 if top == last else 100)
    clock.advance(120_001)
    c.add_batch(shard_id, RowBatch.empty(), position(last), 0)  # caught up, later: every window closes
    await c.step()


async def test_a_shard_read_again_from_below_where_a_reading_started_commits_the_rows_no_reading_had(
        settings, tmp_path):
    """A reading after a checkpoint at 99 commits 100..150; after a restart the shard is
    read from a checkpoint at 49 (moved back by hand): 50..99, which no reading had, are
    committed, and 100..150 are not committed twice."""
    clock = FakeClock(1_000_000)
    out = tmp_path / "out"
    c = await started(settings, tmp_path, clock, LoggedSink(out))
    try:
        await read(c, clock, "A", 100, 150, position(99))
    finally:
        await c.stop()
    assert committed_seqs(out) == list(range(100, 151))
    c = await started(settings, tmp_path, clock, LoggedSink(out))  # the commit log says (99, 150]
    try:
        await read(c, clock, "A", 50, 160, position(49))
        assert c.ordering.duplicates == 51
    finally:
        await c.stop()
    assert committed_seqs(out) == list(range(50, 161))
    assert LoggedSink(out).log.read().intervals == {"A": ((after(position(49)), position(160)),)}


async def test_on_one_server_a_reading_from_below_a_latest_start_commits_the_rows_below(settings, tmp_path):
    """A reading begun at LATEST (its first record 100) commits 100..150; the shard's
    connection ends, and it is read again here from a checkpoint at 49: 50..99 are new,
    and the shard checkpoints no further than 49 until they are committed."""
    clock = FakeClock(1_000_000)
    out = tmp_path / "out"
    c = await started(settings, tmp_path, clock, LoggedSink(out))
    try:
        await read(c, clock, "A", 100, 150, "LATEST")
        assert c.safe_position("A") == position(150)
        c.shard_closed("A")
        await c.open_shard("A", position(49))
        c.add_batch("A", items(50, [clock() + i for i in range(111)]), position(160), 100)
        assert c.safe_position("A") == position(49)
        await read(c, clock, "A", 161, 160, position(49))  # (the daemon again, at its checkpoint: all commits)
        assert c.safe_position("A") == position(160)
    finally:
        await c.stop()
    assert committed_seqs(out) == list(range(50, 161))


async def test_a_reading_from_the_checkpoint_another_left_past_its_last_row_continues_its_interval(settings, tmp_path):
    """Records 11..15 make no row: the window that commits the reading's last rows covers
    them (its position is 15), so the reading after a restart from the checkpoint at 15
    continues the one interval rather than leaving a second one above a gap."""
    clock = FakeClock(1_000_000)
    out = tmp_path / "out"
    c = await started(settings, tmp_path, clock, LoggedSink(out))
    try:
        await c.open_shard("A", position(0))
        c.add_batch("A", items(1, [clock() + i for i in range(10)]), position(15), 0)
        clock.advance(120_001)
        c.add_batch("A", RowBatch.empty(), position(15), 0)
        await c.step()
        assert c.safe_position("A") == position(15)
    finally:
        await c.stop()
    c = await started(settings, tmp_path, clock, LoggedSink(out))
    try:
        await read(c, clock, "A", 16, 20, position(15))
    finally:
        await c.stop()
    assert LoggedSink(out).log.read().intervals == {"A": ((after(position(0)), position(20)),)}
    assert committed_seqs(out) == [*range(1, 11), *range(16, 21)]


async def test_a_reading_that_does_not_continue_the_one_whose_rows_are_here_has_them_dropped_first(settings, tmp_path):
    """A reading begun at LATEST delivered 100..150, none committed yet; the daemon starts
    the shard again at TRIM_HORIZON (no checkpoint was made): the rows still here are
    dropped and the new reading's 1..160 are committed once each, its checkpoint never
    past a row not committed."""
    clock = FakeClock(1_000_000)
    out = tmp_path / "out"
    c = await started(settings, tmp_path, clock, LoggedSink(out))
    try:
        await c.open_shard("A", "LATEST")
        c.add_batch("A", items(100, [clock() + i for i in range(51)]), position(150), 100)
        c.shard_closed("A")
        await c.open_shard("A", "TRIM_HORIZON")
        assert c.ledger.rows == 0 and c.safe_position("A") is None
        c.add_batch("A", items(1, [clock() + i for i in range(160)]), position(160), 100)
        assert c.safe_position("A") is None and c.ordering.duplicates == 0
        clock.advance(120_001)
        c.add_batch("A", RowBatch.empty(), position(160), 0)  # caught up, later: every window closes
        await c.step()
        assert c.safe_position("A") == position(160)
    finally:
        await c.stop()
    assert committed_seqs(out) == list(range(1, 161))


async def test_a_commit_log_without_starts_still_says_everything_at_or_below_is_committed(settings, tmp_path):
    """An older commit log (entries without ``starts``): as before, the shard's rows at or
    below its position are duplicates."""
    clock = FakeClock(1_000_000)
    out = tmp_path / "out"
    CommitLog(out).append({"window": "0-60000", "start": 0, "end": 60_000, "rows": 51, "late": 0, "rows_out": None,
                           "positions": {"A": position(150).to_json()}})
    c = await started(settings, tmp_path, clock, LoggedSink(out))
    try:
        await read(c, clock, "A", 50, 160, position(49))
    finally:
        await c.stop()
    assert committed_seqs(out) == list(range(151, 161))


def table_sink(settings, tmp_path, server):
    """The table sink on a SQLite catalog in ``tmp_path/lake``, as server ``server``."""
    from mldserver.sinks.iceberg import IcebergSink

    return IcebergSink(settings.replace(sink=f"iceberg:{tmp_path / 'lake'}", stream="orders", server_id=server),
                       tmp_path / "lake", DeadLetters(tmp_path / "state" / "dead-letters"))


def table_seqs(tmp_path):
    from mldserver.sinks.iceberg import open_catalog

    catalog = open_catalog(Settings(), tmp_path / "lake")
    return sorted(catalog.load_table(("mldserver", "windows")).scan().to_arrow().column("seq").to_pylist())


async def test_through_the_table_a_reading_from_below_where_another_server_started_commits_the_rows_below(
        settings, tmp_path):
    """Server a reads the shard after a checkpoint at 99 and commits 100..150 to the
    table; server b is given the shard at a checkpoint of 49: the table gets 50..99 and
    151..160, and 100..150 once."""
    clock = FakeClock(1_000_000)
    a = await started(settings, tmp_path, clock, table_sink(settings, tmp_path, "server-a"))
    try:
        await read(a, clock, "A", 100, 150, position(99))
    finally:
        await a.stop()
    b = await started(settings, tmp_path, clock, table_sink(settings, tmp_path, "server-b"))
    try:
        await read(b, clock, "A", 50, 160, position(49))
        assert b.ordering.duplicates == 51  # (the table's intervals, read as the shard opened)
    finally:
        await b.stop()
    assert table_seqs(tmp_path) == list(range(50, 161))


@pytest.mark.parametrize("kind", ["log", "table"])
@pytest.mark.parametrize("seed", range(8))
async def test_every_row_read_is_committed_exactly_once_whatever_the_readings_starts_and_ends(
        settings, tmp_path, seed, kind):
    """Readings of one shard of 400 records from random starts (a checkpoint anywhere,
    or LATEST at a random record), each ended by a restart of the server (into the
    table: another server takes the shard), a lost lease (its rows past the last commit
    dropped), its connection closing once all is committed, or the daemon restarting
    with rows still uncommitted here (the next reading then starts at the shard's
    checkpoint, as the daemon does): every row some reading committed is in the output
    once."""
    rng = random.Random(seed)
    clock = FakeClock(1_000_000)
    out = tmp_path / "out"
    servers = iter(range(100))

    def sink():
        return LoggedSink(out) if kind == "log" else table_sink(settings, tmp_path, f"server-{next(servers)}")

    expected: set[int] = set()
    resume = None  # the daemon restarted: the next reading starts at the checkpoint
    delivered = 0  # ... and delivers at least as far as the one before
    steps = []
    c = await started(settings, tmp_path, clock, sink())
    try:
        for _ in range(rng.randint(2, 6)):
            if resume is not None and delivered == 400:  # nothing more to read: the rows still here commit
                await read(c, clock, "A", resume + 1, 400, position(resume))
                expected.update(range(resume + 1, 401))
                resume = None
            low = rng.randint(0, 380) if resume is None else resume
            high = rng.randint(max(low + 1, delivered if resume is not None else 0), 400)
            checkpoint = position(low) if resume is not None or rng.random() < 0.7 else "LATEST"  # (its first: low + 1)
            await read(c, clock, "A", low + 1, high, checkpoint)
            expected.update(range(low + 1, high + 1))
            end, resume, delivered = rng.choice(["restart", "lease_lost", "closed", "daemon_restart"]), None, high
            # the daemon back at its checkpoint, at one moved back by hand, or one moved past what it read
            back = rng.choice(["at", "back", "past"]) if end == "daemon_restart" else None
            steps.append((checkpoint, low + 1, high, end, back))
            if end != "closed" and high < 400:  # more delivered, not committed yet
                delivered = rng.randint(high + 1, 400)
                c.add_batch("A", items(high + 1, [clock() + i for i in range(delivered - high)]), position(delivered),
                            100)
            if back == "past" and delivered >= 399:
                back = "at"  # (nothing to skip)
            if back in ("at", "back"):  # (they commit with the next reading's windows, or are read again)
                expected.update(range(high + 1, delivered + 1))
            if end == "restart":
                await c.stop()
                c = await started(settings, tmp_path, clock, sink())
            elif end == "lease_lost":
                c.lease_lost("A")
            else:
                c.shard_closed("A")
                if back == "past":  # (the rows still here are dropped: skipped)
                    resume, delivered = rng.randint(delivered + 1, 399), 0
                elif back is not None:
                    resume = c.safe_position("A").seq
                    resume = resume if back == "at" else rng.randint(0, resume)
        if resume is not None:  # the daemon back once more: the rows still here commit
            await read(c, clock, "A", resume + 1, delivered, position(resume))
            expected.update(range(resume + 1, delivered + 1))
    finally:
        await c.stop()
    seqs = committed_seqs(out) if kind == "log" else table_seqs(tmp_path)
    assert len(seqs) == len(set(seqs)), ("a row committed twice", steps)
    assert set(seqs) == expected, steps
