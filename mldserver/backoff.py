"""Jittered exponential backoff, shared by checkpoint and handler retries.

``Backoff(first=0.1, cap=2.0)`` gives delays around 0.1, 0.2, 0.4, ... 2.0, 2.0 s,
each scaled by a random factor in [0.5, 1.0) so that many shards retrying the same
lease table do not retry in step. The random source is injectable for tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable


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
