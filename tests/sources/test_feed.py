"""The daemon's side of a shard, as a source speaks it: the KCL's checkpoint rules
(pure), and a feed driving a real server's shard over a socket pair (``Server.attach``),
its checkpoints stored before each reply."""

from __future__ import annotations

import asyncio
import socket

import pytest

from mldserver.api.testing import make_records
from mldserver.base.positions import Position
from mldserver.sources.feed import LINE_LIMIT, CheckpointRefused, Feed, FeedClosed, check_checkpoint
from mldserver.sources.positions import SHARD_END

from ..handlers import CheckpointLast, CheckpointLastNoting, Noop
from ..harness import running

P = Position.parse


@pytest.mark.parametrize("phase, seq, sub, delivered, stored, expected", [
    ("initialize", None, None, None, None, ("InvalidStateException", None)),
    ("processRecords", "5", 0, P("5", 0), None, (None, P("5", 0))),
    ("processRecords", None, None, P("7", 0), None, (None, P("7", 0))),          # everything delivered
    ("processRecords", None, None, None, None, (None, None)),                    # nothing yet: nothing stored
    ("processRecords", "8", 0, P("7", 0), None, ("IllegalArgumentException", None)),   # past what was delivered
    ("processRecords", "4", 0, P("7", 0), P("5", 0), ("IllegalArgumentException", None)),  # behind what is stored
    ("processRecords", "x7", 0, P("7", 0), None, ("IllegalArgumentException", None)),
    ("processRecords", "7", None, P("7", 2), None, (None, P("7", 0))),           # no sub-sequence: 0
    ("shutdownRequested", "6", 0, P("7", 0), None, (None, P("6", 0))),
    ("shardEnded", None, None, P("7", 0), P("7", 0), (None, SHARD_END)),
    ("shardEnded", "7", 0, P("7", 0), None, (None, P("7", 0))),                  # not SHARD_END: the shard is stuck
    ("leaseLost", None, None, P("7", 0), None, ("ShutdownException", None)),
])  # fmt: skip
def test_checkpoints_are_checked_as_the_kcl_checks_them(phase, seq, sub, delivered, stored, expected):
    assert check_checkpoint(phase, seq, sub, delivered, stored) == expected


async def attached(server, shard_id: str, stored=None) -> tuple[Feed, list]:
    ours, theirs = socket.socketpair()
    await server.attach(theirs)
    reader, writer = await asyncio.open_unix_connection(sock=ours, limit=LINE_LIMIT)
    kept: list = []

    async def store(position):
        await asyncio.sleep(0)  # a write that takes its time: the reply waits for it
        kept.append(position)

    return Feed(reader, writer, shard_id, store=store, stored=stored), kept


async def test_a_feed_drives_a_shard_of_the_server_and_stores_its_checkpoints(tmp_path):
    async with running(tmp_path, CheckpointLast, workers=0) as (server, _, _):
        feed, kept = await attached(server, "shardId-1")
        await feed.initialize("TRIM_HORIZON")
        await feed.process_records(make_records(1, 3), 0)
        await feed.process_records(make_records(4, 2), 0)
        assert kept == [P("3", 0), P("5", 0)] and feed.stored == P("5", 0)
        assert [d.conn.shard_id for d in server.drivers.values()] == ["shardId-1"]
        assert await feed.shard_ended() is True  # the Handler's default: checkpoint SHARD_END
        assert kept[-1] == SHARD_END
        await feed.close()
        await asyncio.wait_for(_until(lambda: not server.drivers), 5)


async def test_a_restarted_feed_starts_from_the_stored_position(tmp_path):
    async with running(tmp_path, CheckpointLast, workers=0) as (server, _, _):
        feed, kept = await attached(server, "shardId-1", stored=P("5", 0))
        await feed.initialize("5", 0)
        await feed.process_records(make_records(6, 1), 0)
        assert kept == [P("6", 0)]
        await feed.shutdown_requested()
        await feed.close()


async def test_a_refused_store_answers_the_checkpoint_with_its_error_and_lease_lost_reaches_the_handler(tmp_path):
    CheckpointLastNoting.noted.clear()
    async with running(tmp_path, CheckpointLastNoting, workers=0) as (server, _, _):
        ours, theirs = socket.socketpair()
        await server.attach(theirs)
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=LINE_LIMIT)

        async def refused(position):
            raise CheckpointRefused("ShutdownException")  # the source's lease went to another server

        feed = Feed(reader, writer, "shardId-1", store=refused, stored=P("2", 0))
        await feed.initialize("2", 0)
        await feed.process_records(make_records(3, 2), 0)
        assert CheckpointLastNoting.noted == ["ShutdownException"] and feed.stored == P("2", 0)
        await feed.lease_lost()
        assert CheckpointLastNoting.noted == ["ShutdownException", "lease_lost"]
        await feed.close()
        await asyncio.wait_for(_until(lambda: not server.drivers), 5)


async def test_an_action_the_server_closes_on_raises_feed_closed(tmp_path):
    async with running(tmp_path, Noop, workers=0) as (server, _, _):
        feed, _ = await attached(server, "shardId-1")
        await feed.initialize("TRIM_HORIZON")
        server.listeners.close()
        for driver in server.drivers.values():
            driver.stop()  # idle: closes at once
        await asyncio.wait_for(_until(lambda: not server.drivers), 5)
        with pytest.raises(FeedClosed):
            await feed.process_records(make_records(1, 1), 0)
        await feed.close()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)
