"""``pool.heartbeat``: a handler process's loop beats fast while work is in flight (and
for a second after), once a second while none is; work's arrival brings the fast beat
back at once."""

from __future__ import annotations

import asyncio
import time

from mldserver.pool.frames import IDLE_INTERVAL, WATCH_INTERVAL
from mldserver.pool.heartbeat import Heartbeat

from ..harness import eventually


async def test_the_beat_is_slow_while_nothing_is_in_flight_and_fast_from_the_moment_work_arrives():
    beats: list[tuple[float, float]] = []  # (period, when): each beat as the state file is given it
    periods = lambda: [p for p, _ in beats]  # noqa: E731
    in_flight: dict[int, dict[str, str]] = {}
    beat = Heartbeat(lambda period: beats.append((period, time.monotonic())), in_flight)
    task = asyncio.ensure_future(beat.run())
    try:
        await eventually(lambda: periods() == [IDLE_INTERVAL], timeout=5, what="the first beat, idle")
        in_flight[7] = {"shard_id": "shardId-000000000001", "action": "process_records"}
        beat.woken()
        assert periods() == [IDLE_INTERVAL, WATCH_INTERVAL] and beat.period == WATCH_INTERVAL  # now, not in 1 s
        await eventually(lambda: len(beats) >= 5, timeout=5, what="three fast beats")
        assert set(periods()[1:]) == {WATCH_INTERVAL}
        beat.woken()  # more work while busy: nothing to change
        del in_flight[7]
        done = time.monotonic()
        await eventually(lambda: periods()[-1] == IDLE_INTERVAL, timeout=5, what="the slow beat again")
        # short for a second after the work (the next batch may come a millisecond later), then slow
        last_busy = max(at for _, at in beats if at <= done)  # the last beat that saw work in flight
        after = [(p, at) for p, at in beats if at > done]
        assert all(p == WATCH_INTERVAL for p, at in after[:-1]) and after[-1][1] - last_busy >= IDLE_INTERVAL
        slow = len(beats)
        await asyncio.sleep(WATCH_INTERVAL * 4)  # four fast periods: no beat while idle
        assert len(beats) == slow
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
