"""The pause gate alone: open by default, waits while paused, runs ``meanwhile``
on its interval, lets go on resume or on ``stop``."""

from __future__ import annotations

import asyncio

from mldserver.shard.pausing import Pause

from .harness import eventually


async def test_an_open_gate_returns_at_once_and_pause_twice_changes_nothing():
    gate = Pause()
    await asyncio.wait_for(gate.wait(every=10), 1)
    assert gate.pause() is True and gate.pause() is False and gate.since is not None
    assert gate.resume() is True and gate.resume() is False and gate.since is None


async def test_a_paused_gate_waits_runs_meanwhile_and_lets_go_on_resume():
    gate = Pause()
    gate.pause()
    ran = []

    async def meanwhile():
        ran.append(1)

    waiting = asyncio.ensure_future(gate.wait(every=0.01, meanwhile=meanwhile))
    await eventually(lambda: len(ran) >= 3, what="meanwhile run while paused")
    assert gate.waiting == 1 and not waiting.done()
    gate.resume()
    await asyncio.wait_for(waiting, 1)
    assert gate.waiting == 0


async def test_stop_lets_a_paused_wait_go():
    gate, stop = Pause(), asyncio.Event()
    gate.pause()
    waiting = asyncio.ensure_future(gate.wait(every=10, stop=stop))
    await eventually(lambda: gate.waiting == 1, what="the wait started")
    stop.set()
    await asyncio.wait_for(waiting, 1)
    assert gate.paused  # still paused: only this wait was let go
