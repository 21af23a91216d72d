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
import contextlib
import subprocess
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

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


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path``: a disk that really fills up. Needs root
    (or CAP_SYS_ADMIN); where the mount is refused the test fails and says why."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs here ({done.stderr.strip()}): these tests need root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
