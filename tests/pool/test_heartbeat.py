"""``pool.heartbeat``: a handler process's loop beats fast while work is in flight and
once a second while none is; work's arrival brings the fast beat back at once."""

from __future__ import annotations

import asyncio

from mldserver.pool.frames import IDLE_INTERVAL, WATCH_INTERVAL
from mldserver.pool.heartbeat import Heartbeat

from ..harness import eventually


async def test_the_beat_is_slow_while_nothing_is_in_flight_and_fast_from_the_moment_work_arrives():
    written: list[float] = []  # each beat's period, as the state file is given it
    in_flight: dict[int, dict[str, str]] = {}
    beat = Heartbeat(written.append, in_flight)
    task = asyncio.ensure_future(beat.run())
    try:
        await eventually(lambda: written == [IDLE_INTERVAL], timeout=5, what="the first beat, idle")
        in_flight[7] = {"shard_id": "shardId-000000000001", "action": "process_records"}
        beat.woken()
        assert written == [IDLE_INTERVAL, WATCH_INTERVAL] and beat.period == WATCH_INTERVAL  # now, not in 1 s
        await eventually(lambda: len(written) >= 5, timeout=IDLE_INTERVAL * 2, what="three fast beats")
        assert set(written[1:]) == {WATCH_INTERVAL}
        beat.woken()  # more work while busy: nothing to change
        del in_flight[7]
        await eventually(lambda: written[-1] == IDLE_INTERVAL, timeout=5, what="the slow beat again")
        slow = len(written)
        await asyncio.sleep(WATCH_INTERVAL * 4)  # four fast periods: no beat while idle
        assert len(written) == slow
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
