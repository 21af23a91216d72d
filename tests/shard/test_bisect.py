"""Bisect: a batch that fails whole is split until only the records that fail alone are
left; every other record is handled once more and its rows kept, in order."""

from __future__ import annotations

import math
import random
import time

import pytest

from mldserver.shard.bisect import bisect
from mldserver.shard.calls import FAILED, OK, Outcome


def handler(bad, fail_in_place=()):
    """A handler that raises on a batch holding any ``bad`` record, and gives up on the
    ``fail_in_place`` ones itself (``batch.fail``); its rows are the records it handled."""
    calls = []

    async def call(part):
        calls.append(list(part))
        if any(r in bad for r in part):
            return Outcome(FAILED, f"ValueError: record {next(r for r in part if r in bad)}")
        failed = [(i, "gave up", 1) for i, r in enumerate(part) if r in fail_in_place]
        return Outcome(OK, rows=[r for r in part if r not in fail_in_place], failed=failed or None)

    return call, calls


@pytest.mark.parametrize("seed", range(20))
async def test_only_the_records_that_fail_alone_are_failed_and_every_other_one_is_handled_in_order(seed):
    rng = random.Random(seed)
    records = list(range(rng.randint(1, 300)))
    bad = set(rng.sample(records, rng.randint(1, min(4, len(records)))))
    in_place = set(rng.sample(records, 1)) - bad
    call, calls = handler(bad, in_place)
    dead = []

    async def on_failed(failed):
        dead.extend(failed)

    done = await bisect(call, records, "ValueError: whole", attempts=3, deadline=time.monotonic() + 60,
                        on_failed=on_failed)
    assert sorted(i for i, _, _ in done.failed) == sorted(bad | in_place) and dead == done.failed
    assert [r for rows in done.rows for r in rows] == [r for r in records if r not in bad | in_place]
    assert all(attempts > 3 for i, _, attempts in done.failed if i in bad)  # each bad one was called alone
    assert done.calls == len(calls) <= 2 * len(bad) * math.ceil(math.log2(len(records) + 1)) + 2


async def test_one_bad_record_in_200_costs_it_alone_in_16_calls():
    call, calls = handler({137})

    async def on_failed(failed):
        pass

    done = await bisect(call, list(range(200)), "e", attempts=3, deadline=time.monotonic() + 60, on_failed=on_failed)
    assert done.failed == [(137, "ValueError: record 137", 10)] and done.calls == 14


async def test_past_the_deadline_a_failing_half_is_dead_lettered_whole():
    call, calls = handler({0, 1, 2, 3})

    async def on_failed(failed):
        pass

    done = await bisect(call, list(range(8)), "e", attempts=1, deadline=time.monotonic() - 1, on_failed=on_failed)
    assert [i for i, _, _ in done.failed] == list(range(8)) and done.calls == 0


async def test_a_half_that_timed_out_is_dead_lettered_whole_however_much_time_is_left():
    # its call ran past execution_timeout, the whole budget: an event loop's clock may
    # fire that time-out before time.monotonic reaches the deadline, so it is not asked
    calls = []

    async def call(part):
        calls.append(list(part))
        if 5 in part:
            return Outcome(FAILED, "timed out after 0.3 s (execution_timeout)", timed_out=True)
        return Outcome(OK, rows=list(part))

    async def on_failed(failed):
        pass

    done = await bisect(call, list(range(8)), "e", attempts=2, deadline=time.monotonic() + 60, on_failed=on_failed)
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7]] and done.rows == [[0, 1, 2, 3]]
    assert [i for i, _, _ in done.failed] == [4, 5, 6, 7]
