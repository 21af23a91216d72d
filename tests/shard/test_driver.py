"""The driver: shard end, bad lines, out-of-order actions, isolation between shards,
an ordered shutdown, bounded batches in flight; driven by the fake daemon through the
real relay against a server running in the test's event loop."""

from __future__ import annotations

import asyncio
import json

import pytest

import mldserver
from mldserver.base.config import Settings
from mldserver.server.server import Server
from mldserver.api.testing import SHARD_END, Child, DaemonExit, FakeDaemon, errors_in_order, make_records

from ..handlers import Noop
from ..harness import eventually, relay_command, running
from .serving import dead_letters, recorder


@pytest.mark.parametrize("variant", ["does_nothing", "explicit_sequence", "raises"])
async def test_shard_end_stores_shard_end_whatever_the_handler_did(tmp_path, variant):
    class H(Noop):
        async def shard_ended(self, checkpointer):
            if variant == "explicit_sequence":
                await checkpointer.checkpoint("2", 0)
            elif variant == "raises":
                raise RuntimeError("cleanup failed")

    async with running(tmp_path, H, handler_retries=0) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 2))
        await shard.shard_ended()
        await shard.close()
    assert daemon.checkpoints["s"] == SHARD_END
    assert shard.checkpoint_requests[-1] == (None, None)
    assert not daemon.stuck


async def test_shard_end_retries_throttling_until_stored(tmp_path):
    async with running(tmp_path, Noop) as (_, _, plain):
        daemon = FakeDaemon(plain.command, errors=errors_in_order(["ThrottlingException"] * 8))
        shard = await daemon.shard("s")
        await shard.shard_ended()
        await shard.close()
    assert len(shard.checkpoint_requests) == 9
    assert daemon.checkpoints["s"] == SHARD_END


async def test_shard_end_gives_up_on_shutdown_exception_and_still_answers(tmp_path):
    async with running(tmp_path, Noop) as (server, _, plain):
        daemon = FakeDaemon(plain.command, errors=lambda shard, seq, sub: "ShutdownException")
        shard = await daemon.shard("s")
        await shard.shard_ended()
        await shard.close()
    assert shard.checkpoint_requests == [(None, None)]
    assert daemon.stuck == {"s"}


async def test_bad_lines_are_logged_dead_lettered_and_the_conversation_goes_on(tmp_path, caplog):
    Rec, calls = recorder()
    async with running(tmp_path, Rec) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.child.write(b'{"action":"processRecords","records":[{"data":"eA=="} cut short\n')
        reply = await shard.child.read_message()  # not JSON, but its first bytes name its action
        assert reply == {"action": "status", "responseFor": "processRecords"}
        await shard.child.write(b'{"action":"processRecords","records":{"not":"a list"}}\n')
        reply = await shard.child.read_message()
        assert reply == {"action": "status", "responseFor": "processRecords"}
        await shard.child.write(b'{"action":"processRecords","records":[{"data":"eA=="}]}\n')
        assert (await shard.child.read_message())["responseFor"] == "processRecords"
        await shard.process_records(make_records(5, 1))
        await shard.lease_lost()
        await shard.close()
    letters = dead_letters(tmp_path, "s")
    assert letters[0]["line"] == '{"action":"processRecords","records":[{"data":"eA=="} cut short'
    assert '"not":"a list"' in letters[1]["line"]
    assert letters[2]["reason"] == "malformed records" and letters[2]["data"] == "eA=="
    assert [c[0] for c in calls] == ["initialize", "process_records", "lease_lost"]


@pytest.mark.parametrize("line", [b"this is not json", b"[1,2]", b'{"records":[]}', b'{"action":5}', b"null",
                                  b'\x00\xff{"data":"eA==","action":"record"}'])
async def test_a_line_that_names_no_action_is_dead_lettered_unanswered_and_the_conversation_goes_on(
        tmp_path, caplog, line):
    """No status is owed to a line that names no action (invariant 1: every action read
    gets exactly one status, and no unowed one): it is logged and dead-lettered, and the
    next action on the same connection is answered as ever."""
    Rec, calls = recorder()
    async with running(tmp_path, Rec) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 2))
        await shard.child.write(line + b"\n")
        await shard.process_records(make_records(3, 2))  # its status is the next line: none came for the junk
        await shard.lease_lost()
        assert await shard.close() == 0
    unanswerable = [r for r in caplog.records if r.getMessage() == "bad_line_unanswerable"]
    assert [r.fields["shard_id"] for r in unanswerable] == ["s"]
    assert "no action" in unanswerable[0].fields["what_to_do"]
    assert [c[0] for c in calls] == ["initialize", "process_records", "process_records", "lease_lost"]
    assert dead_letters(tmp_path, "s")[-1]["line"] == line.decode("utf-8", "replace")


async def test_out_of_order_actions_are_answered_so_the_daemon_survives(tmp_path):
    Rec, calls = recorder()
    async with running(tmp_path, Rec) as (_, _, daemon):
        child = await Child.spawn(daemon.command)
        await child.send({"action": "processRecords", "records": make_records(1, 1), "millisBehindLatest": 0})
        assert await child.read_message() == {"action": "status", "responseFor": "processRecords"}
        shard = await daemon.shard("s")
        await shard.shutdown_requested()
        await shard.child.send({"action": "processRecords", "records": make_records(2, 1), "millisBehindLatest": 0})
        assert await shard.child.read_message() == {"action": "status", "responseFor": "processRecords"}
        await shard.lease_lost()
        await shard.close()
        await child.close_stdin()
        assert await child.wait_exit() == 0
    assert [c[0] for c in calls] == ["initialize", "lease_lost"]
    assert [d["line"][:40] for d in dead_letters(tmp_path, "s")] == [
        '{"action":"processRecords","records":[{"'
    ]


async def test_one_broken_connection_does_not_affect_another(tmp_path):
    class Fragile(mldserver.Handler):
        async def initialize(self, shard):
            self.shard_id = shard.shard_id

        async def process_records(self, batch, checkpointer):
            if self.shard_id == "bad":
                raise RuntimeError("boom")
            await checkpointer.checkpoint()

    async with running(tmp_path, Fragile, handler_retries=0) as (server, _, daemon):
        good, bad = await daemon.shard("good"), await daemon.shard("bad")
        for i in range(5):
            await asyncio.gather(good.process_records(make_records(10 * i + 1, 3)),
                                 bad.process_records(make_records(10 * i + 1, 3)))
            await bad.child.write(b'{"action":"processRecords"\x00\xff garbage\n')
            assert (await bad.child.read_message())["responseFor"] == "processRecords"
        await bad.child.kill()  # the bad child dies mid-conversation
        await good.process_records(make_records(100, 1))
        await good.shard_ended()
        assert await good.close() == 0
    assert daemon.checkpoints["good"] == SHARD_END
    assert len(dead_letters(tmp_path, "bad")) == 5 * 3 + 5


async def test_shutdown_lets_a_busy_action_finish_and_send_its_status(tmp_path):
    started = asyncio.Event()

    class Slow(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            started.set()
            await asyncio.sleep(0.5)
            await checkpointer.checkpoint()

    settings_dir = tmp_path
    settings = Settings(handler="t", port=0, state_dir=str(settings_dir / "state"))
    server = Server(settings, Slow)
    await server.start()
    cmd = relay_command(server.address[1])
    daemon = FakeDaemon(cmd)
    busy, idle = await daemon.shard("busy"), await daemon.shard("idle")
    batch = asyncio.ensure_future(busy.process_records(make_records(1, 1)))
    await started.wait()
    await server.shutdown()
    await batch  # the status arrived: the daemon did not see EOF before it
    assert daemon.checkpoints["busy"] == ("1", 0)
    assert await busy.child.read_line(5) is None and await idle.child.read_line(5) is None
    assert await busy.close() == 0 and await idle.close() == 0


async def test_batches_in_flight_are_bounded_across_shards(tmp_path):
    running_now, most = 0, 0

    class Busy(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            nonlocal running_now, most
            running_now += 1
            most = max(most, running_now)
            await asyncio.sleep(0.05)
            await checkpointer.checkpoint()
            running_now -= 1

    async with running(tmp_path, Busy, max_batches_in_flight=2) as (_, _, daemon):
        shards = [await daemon.shard(f"s{i}") for i in range(5)]
        for rnd in range(3):
            await asyncio.gather(*(s.process_records(make_records(100 * rnd + 1, 50)) for s in shards))
        await asyncio.gather(*(s.lease_lost() for s in shards))
        for s in shards:
            await s.close()
    assert most == 2
    assert all(daemon.checkpoints[f"s{i}"] == ("250", 0) for i in range(5))
