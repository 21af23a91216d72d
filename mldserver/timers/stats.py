"""The timers' statistics, read from the scheduler when ``/metrics`` is scraped (a
collector on the server's registry, beside ``metrics.py``'s), named as in Couchbase
Eventing where it has them::

    mldserver_timer_callback_success_total 9812.0     # timer_callback_success
    mldserver_timer_callback_failure_total 3.0        # timer_callback_failure (attempts)
    mldserver_timer_create_failure_total 1.0          # timer_create_failure
    mldserver_timer_creates_total 10240.0             # timers stored (replacements included)
    mldserver_timer_cancels_total 400.0               # pending timers cancelled
    mldserver_timers_dead_lettered_total 1.0
    mldserver_pending_timers 10412.0                  # in the store (DynamoDB: its item count, approximate)
    mldserver_timers_held 2048.0                      # of them, due soon, in memory
    mldserver_timers_in_flight 250.0                  # being fired
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .scheduler import Scheduler


class TimerCollector(Collector):
    def __init__(self, scheduler: "Scheduler") -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        stats = s.stats
        yield CounterMetricFamily("mldserver_timer_callback_success", "Timer callbacks that returned",
                                  value=stats.success)
        yield CounterMetricFamily("mldserver_timer_callback_failure", "Timer callback attempts that raised, timed "
                                  "out or died with their process", value=stats.failure)
        yield CounterMetricFamily("mldserver_timer_create_failure", "timers.create calls refused (bad arguments) "
                                  "or not stored (the store failed)", value=stats.create_failures)
        yield CounterMetricFamily("mldserver_timer_creates", "Timers stored by create, replacements included",
                                  value=stats.created)
        yield CounterMetricFamily("mldserver_timer_cancels", "Pending timers removed by cancel", value=stats.cancelled)
        yield CounterMetricFamily("mldserver_timers_dead_lettered", "Timers whose callback failed every attempt",
                                  value=stats.dead_lettered)
        pending = s.store.pending
        yield GaugeMetricFamily("mldserver_pending_timers", "Timers in the store, not yet fired (NaN while unknown)",
                                value=math.nan if pending is None else pending)
        yield GaugeMetricFamily("mldserver_timers_held", "Timers due soon, held in memory", value=len(s.due.held))
        yield GaugeMetricFamily("mldserver_timers_in_flight", "Timers being fired", value=len(s.due.in_flight))
