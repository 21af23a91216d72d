"""The committer alone, with the real file sink: sealed windows committed in order, the
``committing`` state it states, a retriable failure retried, a bug raised."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mldserver.base.backoff import Backoff
from mldserver.base.logs import get_logger
from mldserver.base.positions import Position
from mldserver.coordinator.committer import Committer
from mldserver.coordinator.ordering import WindowRows
from mldserver.rows.batch import Item, RowBatch
from mldserver.sinks.file import FileSink


def window_rows(start, seqs):
    rows = RowBatch.of(Item(start + i, Position(s, 0, str(s)), b'{"seq":%d}' % s) for i, s in enumerate(seqs))
    return WindowRows(start, start + 60_000, {"s": [rows]})


class Flaky(FileSink):
    """A file sink whose first ``failures`` commits raise ``error``; it records the
    committer's state at each commit."""

    def __init__(self, directory, failures=0, error=OSError("disk hiccup")):
        super().__init__(directory)
        self.failures, self.error = failures, error
        self.seen: list[tuple[str, bool]] = []
        self.committer: Committer | None = None

    async def commit(self, window):
        self.seen.append((window.id, self.committer.committing))
        if self.failures:
            self.failures -= 1
            raise self.error
        await super().commit(window)


async def made(sink):
    committed = []

    async def on_commit(window, commits):
        committed.append((window.id, {s: sum(map(len, rows)) for s, rows in commits.items()}))

    committer = Committer(sink, log=get_logger("test.committer"), on_commit=on_commit)
    committer.backoff = Backoff(first=0.001, cap=0.001)
    sink.committer = committer
    await sink.start()
    return committer, committed


async def test_sealed_windows_commit_in_order_while_committing_is_stated(tmp_path):
    sink = Flaky(tmp_path / "out")
    committer, committed = await made(sink)
    committer.seal([window_rows(0, [1, 2]), window_rows(60_000, [3])], watermark=120_000)
    assert len(committer.sealed) == 2 and not committer.committing
    async with committer.turn:
        assert await committer.commit_sealed() == 2
    assert sink.seen == [("0-60000", True), ("60000-120000", True)]
    assert committed == [("0-60000", {"s": 2}), ("60000-120000", {"s": 1})]
    assert not committer.committing and not committer.sealed
    assert (committer.windows_committed, committer.rows_committed, committer.last_commit.window) == (
        2, 3, "60000-120000")


async def test_a_retriable_failure_is_retried_and_committed_once(tmp_path, caplog):
    sink = Flaky(tmp_path / "out", failures=2)
    committer, committed = await made(sink)
    committer.seal([window_rows(0, [1])], watermark=60_000)
    with caplog.at_level(logging.ERROR):
        assert await committer.commit_sealed() == 1
    assert [w for w, _ in sink.seen] == ["0-60000"] * 3 and committed == [("0-60000", {"s": 1})]
    assert sum("sink_commit_failed" in r.getMessage() for r in caplog.records) == 2


async def test_a_bug_in_the_sink_is_retried_like_any_failure_and_stated_until_it_commits(tmp_path):
    sink = Flaky(tmp_path / "out", failures=2, error=TypeError("a bug"))
    committer, committed = await made(sink)
    states = []
    log_failed = committer._failed

    def failed(window, exc, attempt, delay):
        states.append(committer.failing)
        log_failed(window, exc, attempt, delay)

    committer._failed = failed
    committer.seal([window_rows(0, [1])], watermark=60_000)
    async with committer.turn:
        assert await committer.commit_sealed() == 1
    assert [(f.window, f.error, f.attempts) for f in states] == [("0-60000", "TypeError: a bug", 1),
                                                                 ("0-60000", "TypeError: a bug", 2)]
    assert committer.failing is None and committed == [("0-60000", {"s": 1})] and committer.windows_committed == 1


async def test_a_window_sealed_during_a_commit_commits_in_the_same_pass(tmp_path):
    gate = asyncio.Event()

    class Held(Flaky):
        async def commit(self, window):
            await gate.wait()
            await super().commit(window)

    sink = Held(tmp_path / "out")
    committer, committed = await made(sink)
    committer.seal([window_rows(0, [1])], watermark=60_000)
    task = asyncio.create_task(committer.commit_sealed())
    while not committer.committing:
        await asyncio.sleep(0)
    committer.seal([window_rows(60_000, [2])], watermark=120_000)  # a batch closed it meanwhile
    gate.set()
    assert await task == 2 and [w for w, _ in committed] == ["0-60000", "60000-120000"]
