"""Firing through real handler processes (PoolFiring) and in the server's loop
(LoopFiring): what each result says, the execution time-out against a callback that
awaits and one that blocks, and a process that dies under a batch."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from mldserver.base.config import Settings
from mldserver.base.logs import get_logger
from mldserver.pool import HandlerPool
from mldserver.pool.firing import PoolFiring
from mldserver.timers.firing import LoopFiring
from mldserver.timers.store import Timer

from ..harness import eventually
from .. import timer_handlers
from .serving import HANDLER, fired_lines

LOG = get_logger("mldserver.timers")


def timer(ref: str, callback: str = "fired", **context) -> Timer:
    import orjson

    return Timer(f"tests.timer_handlers:{callback}", ref, 0, orjson.dumps({"ref": ref, **context}))


@pytest.fixture
async def pool(tmp_path, monkeypatch):
    monkeypatch.setenv("MLDSERVER_TEST_FIRED", str(tmp_path / "fired.jsonl"))
    pools = []

    async def start(**settings):
        p = HandlerPool(Settings(handler=HANDLER, state_dir=str(tmp_path / "state"), **{"workers": 2, **settings}))
        await p.start()
        pools.append(p)
        return p

    yield start
    for p in pools:
        await p.stop()


async def test_callbacks_run_in_a_handler_process_with_their_context(tmp_path, pool):
    p = await pool()
    results = await PoolFiring(p, 5.0, LOG).fire([timer("a", order=7), timer("b", "failing"), timer("c")])
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error == "ValueError: no such order: b" and "timer_handlers.py" in results[1].traceback
    lines = fired_lines(tmp_path / "fired.jsonl")
    assert sorted(line["ref"] for line in lines) == ["a", "b", "c"]
    assert {line["pid"] for line in lines} <= {proc.pid for proc in p.processes} and os.getpid() not in {
        line["pid"] for line in lines}
    assert next(line for line in lines if line["ref"] == "a")["order"] == 7


async def test_a_callback_that_is_gone_fails_with_the_importers_message(pool):
    p = await pool()
    [result] = await PoolFiring(p, 5.0, LOG).fire([Timer("tests.timer_handlers:renamed", "a", 0, b"{}")])
    assert not result.ok and result.counted
    assert 'Attribute "renamed" not found in module "tests.timer_handlers"' in result.error


async def test_a_callback_awaiting_past_the_execution_timeout_is_cancelled(pool):
    p = await pool(execution_timeout=0.3)
    results = await PoolFiring(p, 0.3, LOG).fire([timer("a", "slow", sleep=30), timer("b")])
    assert results[0].error == "timed out after 0.3 s (execution_timeout)" and results[0].counted
    assert results[1].ok
    assert p.deaths == 0  # cancelled in the process: nothing to kill


async def test_a_callback_blocking_its_process_is_killed_and_only_it_fails(tmp_path, pool, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    p = await pool(execution_timeout=0.5)
    results = await PoolFiring(p, 0.5, LOG).fire([timer("a"), timer("b", "blocking"), timer("c")])
    assert not results[1].ok and results[1].counted and "execution_timeout" in results[1].error
    assert "killed" in results[1].error
    # a ran before b blocked, but its end was never reported: redone, not counted; c never ran
    assert [(r.ok, r.counted) for r in (results[0], results[2])] == [(False, False), (False, False)]
    [timed_out] = [r for r in caplog.records if r.getMessage() == "handler_timed_out"]
    assert timed_out.fields["callback"] == "tests.timer_handlers:blocking" and "in blocking" in timed_out.fields["stack"]
    await eventually(lambda: p.deaths == 1 and len(p.serving()) == 2, 30, what="the killed process replaced")


async def test_a_process_killed_under_an_awaiting_batch_redoes_it_uncounted(tmp_path, pool):
    p = await pool()
    firing = PoolFiring(p, 30.0, LOG)
    fire = asyncio.ensure_future(firing.fire([timer("a", "slow", sleep=30), timer("b", "slow", sleep=30)]))
    await eventually(lambda: any(proc.life.in_flight for proc in p.processes), what="the batch sent")
    [proc] = [proc for proc in p.processes if proc.life.in_flight]
    os.kill(proc.pid, signal.SIGKILL)
    results = await fire
    assert [(r.ok, r.counted) for r in results] == [(False, False), (False, False)]
    assert "SIGKILL" in results[0].error


async def test_in_the_servers_loop_callbacks_get_the_same_results(tmp_path, monkeypatch):
    monkeypatch.setenv("MLDSERVER_TEST_FIRED", str(tmp_path / "fired.jsonl"))

    class Timers:  # what timers.create inside a callback reaches, and writes the callback's timers
        async def write(self, ops):
            return [False for op in ops if not isinstance(op, Timer)]

    firing = LoopFiring(Timers(), 0.2, LOG)
    results = await firing.fire([timer("a"), timer("b", "failing"), timer("c", "slow", sleep=30)])
    assert [r.ok for r in results] == [True, False, False]
    assert results[1].error == "ValueError: no such order: b"
    assert results[2].error == "timed out after 0.2 s (execution_timeout)"
    assert [line["pid"] for line in fired_lines(tmp_path / "fired.jsonl")] == [os.getpid(), os.getpid()]
    assert timer_handlers.fired  # imported in this process: the loop's own
