"""A bug of ours inside one action never closes the daemon's connection: at each entry
point of the driver an exception is injected once; the action is answered exactly once
(the fake daemon, strict as the Java one, exits on a missing, duplicate or wrong
status), a batch it hit is dead-lettered with its data, and the next actions are
served as usual. Run on uvloop and on the stock loop (tests/conftest.py)."""

from __future__ import annotations

import logging

import pytest

import mldserver
from mldserver.pool.calls import ProcessCalls
from mldserver.shard import calls as shard_calls
from mldserver.shard import downstream, driver
from mldserver.api.testing import SHARD_END, make_records

from ..harness import running
from ..pool.serving import events, pooled
from .serving import dead_letters


class Once:
    """Wraps a callable: the call after the first ``skip`` raises, all others pass through."""

    def __init__(self, target, skip=0):
        self.target = target
        self.skip = skip
        self.raised = 0

    def __get__(self, obj, owner=None):  # as a method, bound like the original
        return self if obj is None else (lambda *a, **k: self(obj, *a, **k))

    def __call__(self, *args, **kwargs):
        if self.skip:
            self.skip -= 1
        elif not self.raised:
            self.raised += 1
            raise RuntimeError("injected: a bug of ours")
        return self.target(*args, **kwargs)


class Handled(mldserver.Handler):
    seen: list = []

    async def process_records(self, batch, checkpointer):
        self.seen.extend(r.sequence_number for r in batch.records)
        await checkpointer.checkpoint(batch.records[-1].sequence_number, 0)


# (what is patched, its attribute, calls of it let through first, the action it hits)
ENTRY_POINTS = [
    (downstream.NoSink, "open", 0, "initialize"),
    (shard_calls.HandlerCalls, "call", 0, "initialize"),
    (driver, "decode_records", 0, "processRecords"),
    (driver, "encode_rows", 0, "processRecords"),
    (downstream.NoSink, "batch", 0, "processRecords"),
    (shard_calls.HandlerCalls, "call", 1, "processRecords"),
    (driver.ShardDriver, "_dead_letter_all", 0, "processRecords"),
    (shard_calls.HandlerCalls, "call", 3, "shutdownRequested"),
    (downstream.NoSink, "shard_ended", 0, "shardEnded"),
    (shard_calls.HandlerCalls, "call", 3, "shardEnded"),
]


@pytest.mark.parametrize(("owner", "name", "skip", "action"), ENTRY_POINTS,
                         ids=[f"{o.__name__.rsplit('.')[-1]}.{n}-{a}" for o, n, _, a in ENTRY_POINTS])
async def test_an_exception_inside_an_action_is_answered_and_the_connection_goes_on(
        owner, name, skip, action, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    injected = Once(getattr(owner, name), skip)
    monkeypatch.setattr(owner, name, injected)
    handler = type("H", (Handled,), {"seen": []})
    async with running(tmp_path, handler, handler_retries=0) as (_, _, daemon):
        shard = await daemon.shard("s")  # initialize
        await shard.process_records(make_records(1, 3))
        await shard.process_records(make_records(4, 3))
        if action == "shutdownRequested":
            await shard.shutdown_requested()
        await shard.shard_ended()
        assert await shard.close() == 0  # the relay saw its connection open to the end
    assert injected.raised == 1
    if owner is downstream.NoSink and name == "shard_ended":  # the rows could not be made safe: not stored
        assert "s" not in daemon.checkpoints or daemon.checkpoints["s"] != SHARD_END
        assert events(caplog, "shard_end_not_stored")
    else:
        assert daemon.checkpoints["s"] == SHARD_END
    failed = events(caplog, "action_failed_internally")
    assert failed and failed[0]["action"] == action and "injected" in failed[0]["error"]
    assert not events(caplog, "driver_crashed")
    if action == "processRecords":
        # The batch it hit is in the dead letters with its data, or was handled (the
        # dead-letter write itself was the one that failed); the next batch is handled.
        lettered = [entry["sequence_number"] for entry in dead_letters(tmp_path, "s") if entry.get("data")]
        assert set(lettered) | set(handler.seen) >= {"1", "2", "3"}
        assert {"4", "5", "6"} <= set(handler.seen)


async def test_an_exception_in_the_process_call_seam_is_one_failed_attempt(tmp_path, monkeypatch, caplog):
    """With handler processes: a bug in the seam (``ProcessCalls``) costs one attempt;
    the retry handles the batch."""
    caplog.set_level(logging.INFO, logger="mldserver")
    injected = Once(ProcessCalls._frame)
    monkeypatch.setattr(ProcessCalls, "_frame", injected)
    async with running(tmp_path, **pooled("Emit", sink=False, handler_retries=1)) as (_, _, daemon):
        shard = await daemon.shard("s")
        await shard.process_records(make_records(1, 3))
        await shard.shard_ended()
        assert await shard.close() == 0
    assert injected.raised == 1
    assert [e["callback"] for e in events(caplog, "action_failed_internally")] == ["initialize"]
    assert not dead_letters(tmp_path, "s")


async def test_a_pipe_that_fails_under_a_write_is_a_dead_process_not_a_closed_connection(
        tmp_path, monkeypatch, caplog):
    """uvloop closes a dead child's stdin transport before the death is noticed, and a
    write to it raises RuntimeError: the boundary makes that ``ProcessDied``, the
    process is killed and replaced, and the call is redone in a live process."""
    caplog.set_level(logging.INFO, logger="mldserver")
    async with running(tmp_path, **pooled("Emit", sink=False)) as (server, _, daemon):
        shard = await daemon.shard("s")
        proc = next(p for p in server.pool.processes if server.pool.shards_of(p))
        stdin = proc.proc.stdin

        def closed(data):
            raise RuntimeError("unable to perform operation on <WriteUnixTransport closed=True>; the handler is closed")

        monkeypatch.setattr(stdin, "write", closed)
        await shard.process_records(make_records(1, 3))
        await shard.shard_ended()
        assert await shard.close() == 0
        assert not proc.alive
    assert events(caplog, "handler_redone")
    assert not events(caplog, "driver_crashed") and not dead_letters(tmp_path, "s")
