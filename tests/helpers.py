"""What tests share to wait on conditions instead of time.

``FakeClock`` is the coordinator's clock (epoch milliseconds) moved by hand; with
``Coordinator.step()`` a test decides exactly when windows close::

    clock = FakeClock(1_000)
    coordinator = Coordinator(settings, sink, clock=clock)
    clock.advance(600_001)
    await coordinator.step()

``eventually`` is the one way to wait for something another process or task does::

    await eventually(lambda: spool.exists(), timeout=5, what="the spool written")
"""

from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

T = TypeVar("T")


class FakeClock:
    """Epoch milliseconds that move only when a test says so."""

    def __init__(self, now: float = 0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms


async def eventually(condition: Callable[[], T], timeout: float = 5.0, *, what: str = "the condition",
                     interval: float = 0.01) -> T:
    """Poll ``condition`` until it returns something true (returned), or fail after
    ``timeout`` seconds with an AssertionError naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if result:
            return result
        if loop.time() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(interval)
