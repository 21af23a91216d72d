"""The embedded store: what a put, a delete and a finish leave on disk, read back
through a connection of another process's kind (a fresh sqlite3 connection), the
due index in order, and the grouped commits."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from mldserver.timers.sqlite import SqliteStore
from mldserver.timers.store import Timer


def t(ref: str, due: int, version: int = 1, context: bytes = b"{}") -> Timer:
    return Timer("mod:cb", ref, due, context, version)


def on_disk(path) -> dict[str, tuple]:
    """What another connection sees: committed rows only."""
    with sqlite3.connect(path) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT reference, due_ms, context, version, attempts FROM timers")}


@pytest.fixture
async def store(tmp_path):
    s = SqliteStore(tmp_path / "timers" / "timers.db")
    await s.open()
    yield s
    await s.close()


async def test_no_database_until_the_first_timer(tmp_path, store):
    assert not (tmp_path / "timers").exists()
    assert await store.due(10**12, 10) == []
    assert await store.delete("mod:cb", "nothing") is False
    assert store.pending == 0
    await store.put([t("a", 5)])
    assert on_disk(store.path) == {"a": (5, b"{}", 1, 0)}


async def test_put_is_committed_when_it_returns_and_replaces_by_key(store):
    await store.put([t("a", 5, version=1, context=b'{"v":1}')])
    await store.put([t("a", 7, version=2, context=b'{"v":2}')])
    await store.put([t("b", 6)])
    assert on_disk(store.path) == {"a": (7, b'{"v":2}', 2, 0), "b": (6, b"{}", 1, 0)}
    assert store.pending == 2
    assert await store.delete("mod:cb", "a") is True
    assert await store.delete("mod:cb", "a") is False
    assert store.pending == 1


async def test_due_reads_in_firing_order_from_a_key_or_a_time(store):
    for ref, due in [("c", 30), ("a", 10), ("b", 10), ("d", 40), ("e", 50)]:
        await store.put([t(ref, due)])
    assert [x.reference for x in await store.due(40, 10)] == ["a", "b", "c", "d"]
    assert [x.reference for x in await store.due(40, 2)] == ["a", "b"]
    assert [x.reference for x in await store.due(40, 10, after=(10, "mod:cb", "a"))] == ["b", "c", "d"]
    assert [x.reference for x in await store.due(50, 10, after=30)] == ["d", "e"]


async def test_finish_deletes_and_reschedules_only_the_version_fired(store):
    await store.put([t("done", 1, version=1)])
    await store.put([t("replaced", 1, version=2)])
    await store.put([t("retried", 1, version=1)])
    await store.finish(done=[t("done", 1, version=1), t("replaced", 1, version=1)],
                       retry=[t("retried", 1, version=1)._replace(due_ms=99, attempts=1)], release=[])
    assert on_disk(store.path) == {"replaced": (1, b"{}", 2, 0), "retried": (99, b"{}", 1, 1)}
    assert store.pending == 2


async def test_pending_is_counted_again_when_opened(tmp_path, store):
    for i in range(5):
        await store.put([t(f"r{i}", i)])
    again = SqliteStore(store.path)
    await again.open()
    try:
        assert again.pending == 5
    finally:
        await again.close()


async def test_concurrent_writes_share_commits(store):
    commits = 0
    real = store.group._commit

    def counting(ops):
        nonlocal commits
        commits += 1
        return real(ops)

    store.group._commit = counting
    await asyncio.gather(*(store.put([t(f"r{i}", i)]) for i in range(500)))
    assert store.pending == 500 and len(on_disk(store.path)) == 500
    assert commits < 100  # grouped: 500 puts, far fewer fsyncs


async def test_a_failing_commit_fails_every_write_in_it(store):
    await store.put([t("a", 1)])
    blocker = sqlite3.connect(store.path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database: the commit cannot happen
    store._conn.execute("PRAGMA busy_timeout = 50")
    try:
        results = await asyncio.gather(store.put([t("b", 2)]), store.put([t("c", 3)]), return_exceptions=True)
    finally:
        blocker.rollback()
        blocker.close()
    assert all(isinstance(r, sqlite3.OperationalError) for r in results)
    await store.put([t("d", 4)])
    assert sorted(on_disk(store.path)) == ["a", "d"]


async def test_one_put_of_many_is_one_commit_and_the_last_of_a_key_wins(store):
    await store.put([t("a", 1, version=1), t("b", 2), t("a", 3, version=2)])
    assert on_disk(store.path) == {"a": (3, b"{}", 2, 0), "b": (2, b"{}", 1, 0)}
    assert store.pending == 2


async def test_a_write_runs_creates_and_cancels_in_order_in_one_commit(store):
    await store.put([t("old", 1), t("kept", 2)])
    commits = store.group.commits
    found = await store.write([t("a", 5), ("mod:cb", "a"),             # created and cancelled: nothing left
                               ("mod:cb", "old"), t("old", 9, version=2),  # cancelled, then created again
                               ("mod:cb", "never"), t("b", 6)])
    assert found == [True, True, False]
    assert store.group.commits == commits + 1
    assert on_disk(store.path) == {"old": (9, b"{}", 2, 0), "kept": (2, b"{}", 1, 0), "b": (6, b"{}", 1, 0)}
    assert store.pending == 3
