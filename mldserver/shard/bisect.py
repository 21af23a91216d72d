"""Bisect: one bad record costs one record, not its batch.

A batch whose handler still fails after its retries (``handler_retries``) is split in
halves and each half handed to the handler again (once each, no retries: a record that
fails alone is found in about 2 log2(n) calls), and a half that fails is split again,
until only records that fail alone are left. Those are dead-lettered with their data
(``on_failed``, at once, before any later record is handled: a handler's own checkpoint
never passes a record not yet in the dead letters); every other record is handled and
its rows kept, in the batch's order. Past ``deadline`` (monotonic seconds) a failing
half is not split further: its records are dead-lettered whole, so a handler that times
out on every call does not hold its shard for n log n time-outs. A half whose call ran
past ``execution_timeout`` (``Outcome.timed_out``) has spent that budget by itself and is
dead-lettered whole at once, whatever the clocks say (an event loop's timers and
``time.monotonic`` may disagree by a loop iteration). A handler may see a
record more than once when its batch is bisected, as it may on any retry.

One bad record in a batch of 200 (handlers that raise on it)::

    done = await bisect(call, records, "ValueError: not JSON", attempts=3,
                        deadline=time.monotonic() + 60, on_failed=dead_letter)
    done.rows       # the rows of the halves that succeeded, in order: 199 records' rows
    done.failed     # [(137, "ValueError: not JSON", 10)]: its index, error, calls it was in
    done.calls      # 14

``call(records)`` hands some of the batch's records to the handler once and returns
its ``Outcome`` (``calls.Outcome``); records a half gave up on itself (``batch.fail``)
come back in its outcome and join ``failed`` with their index in the whole batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from .calls import Outcome

Failed = tuple[int, str, int]  # (index in the batch, error, attempts)


@dataclass
class Bisected:
    rows: list[Any] = field(default_factory=list)  # each successful part's emitted rows, in order
    failed: list[Failed] = field(default_factory=list)
    calls: int = 0


async def bisect(call: Callable[[Sequence[Any]], Awaitable[Outcome]], records: Sequence[Any], error: str, *,
                 attempts: int, deadline: float, on_failed: Callable[[list[Failed]], Awaitable[None]]) -> Bisected:
    """The batch ``records`` failed whole (``error``, after ``attempts`` calls): the
    records that fail alone, and the rows of all the others (see the module)."""
    done = Bisected()

    async def failing(lo: int, hi: int, error: str, calls: int, spent: bool = False) -> None:
        if hi - lo == 1 or spent or time.monotonic() >= deadline:
            failed = [(i, error, calls) for i in range(lo, hi)]
            done.failed.extend(failed)
            await on_failed(failed)
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            outcome = await call(records[a:b])
            done.calls += 1
            if outcome.ok:
                done.rows.append(outcome.rows)
                if outcome.failed:
                    failed = [(a + i, e, n) for i, e, n in outcome.failed]
                    done.failed.extend(failed)
                    await on_failed(failed)
            else:
                await failing(a, b, outcome.error or error, calls + 1, outcome.timed_out)

    await failing(0, len(records), error, attempts)
    return done
