"""Jittered exponential backoff, shared by checkpoint and handler retries, and the
policy every handler call follows.

``Backoff(first=0.1, cap=2.0)`` gives delays around 0.1, 0.2, 0.4, ... 2.0, 2.0 s,
each scaled by a random factor in [0.5, 1.0) so that many shards retrying the same
lease table do not retry in step. The random source is injectable for tests.

``CallPolicy`` is how a handler is called, read once from the settings: a shard's
handler calls (``shard.calls``, ``pool.calls``), a ``ChangeHandler``'s per-record
callbacks and the timers' callbacks all retry the same way::

    policy = CallPolicy.from_settings(settings)   # handler_retries=2, execution_timeout=60, handler_backoff=0.1
    policy.retries, policy.timeout                # 2, 60.0: three attempts of at most 60 s each
    policy.backoff                                # Backoff(first=0.1, cap=5.0) between them
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    from .config import Settings


@dataclass(frozen=True)
class Backoff:
    first: float = 0.1
    cap: float = 2.0
    factor: float = 2.0
    rng: Callable[[], float] = field(default=random.random, compare=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        base = min(self.cap, self.first * self.factor**attempt)
        return base * (0.5 + 0.5 * self.rng())


class CallPolicy(NamedTuple):
    retries: int  # attempts after the first that failed
    timeout: float  # seconds an attempt may run (execution_timeout)
    backoff: Backoff  # between attempts

    @classmethod
    def from_settings(cls, settings: Settings) -> CallPolicy:
        """``handler_retries``, ``execution_timeout``, and ``handler_backoff`` growing to
        5 s at most (or ``handler_backoff`` itself, if longer)."""
        first = settings.handler_backoff
        return cls(settings.handler_retries, settings.execution_timeout, Backoff(first=first, cap=max(first, 5.0)))
