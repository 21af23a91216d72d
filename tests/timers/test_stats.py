"""The timers' statistics as /metrics shows them, read from a scheduler's counters
and its store when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mldserver.base.backoff import Backoff
from mldserver.timers.firing import OK, Result
from mldserver.timers.scheduler import Scheduler
from mldserver.timers.sqlite import SqliteStore
from mldserver.timers.stats import TimerCollector
from mldserver.timers.store import Timer

from ..helpers import FakeClock


class Answers:
    async def fire(self, timers):
        return [Result(False, "ValueError: boom") if t.reference == "bad" else OK for t in timers]


def scraped(registry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_the_counts_and_what_is_pending(tmp_path):
    clock = FakeClock(1_000)
    s = Scheduler(SqliteStore(tmp_path / "t.db"), Answers(), attempts=2, backoff=Backoff(first=10.0, cap=10.0),
                  context_size=1024, clock=clock)
    await s.open()
    registry = CollectorRegistry()
    registry.register(TimerCollector(s))
    for ref in ("a", "b", "bad", "later"):
        await s.create(Timer("m:f", ref, 1_000 if ref != "later" else 10**9, b"{}"))
    await s.cancel("m:f", "b")
    s.refused("timer 'x': context is not JSON")
    await s.step()
    await s.drain()
    m = scraped(registry)
    assert m["mldserver_timer_callback_success_total"] == 1
    assert m["mldserver_timer_callback_failure_total"] == 1
    assert m["mldserver_timer_create_failure_total"] == 1
    assert m["mldserver_timer_creates_total"] == 4 and m["mldserver_timer_cancels_total"] == 1
    assert m["mldserver_pending_timers"] == 2  # "bad" (to be retried) and "later"
    assert m["mldserver_timers_held"] == 0 and m["mldserver_timers_in_flight"] == 0
    await s.stop()
