"""What tests share besides the harness (``harness.py``: servers and ``eventually``).

``FakeClock`` is the coordinator's clock (epoch milliseconds) moved by hand; with
``Coordinator.step()`` a test decides exactly when windows close::

    clock = FakeClock(1_000)
    coordinator = Coordinator(settings, sink, clock=clock)
    clock.advance(600_001)
    await coordinator.step()

``small_tmpfs`` is a disk that really fills up. ``counted_parses(monkeypatch)`` counts
each pysimdjson parse of a line from then on (``protocol/lazy.py``). ``docs_reference()`` is
docs/reference.py, the reference pages' generator and the reader of the code's log calls
(``emitted()``), as a module. ``resident_kib(where)`` is this process's memory in the
mappings ``where`` picks, as the kernel counts it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest


class FakeClock:
    """Epoch milliseconds that move only when a test says so."""

    def __init__(self, now: float = 0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms


def small_tmpfs(path: Path, size: str) -> contextlib.AbstractContextManager[Path]:
    """A real tmpfs of ``size`` at ``path``: a disk that really fills up. Needs root
    (or CAP_SYS_ADMIN); where the mount is refused the test fails and says why."""
    return mounted(path, "tmpfs", f"size={size}")


@contextlib.contextmanager
def mounted(path: Path, kind: str, options: str = "defaults") -> Iterator[Path]:
    """A real file system of ``kind`` mounted at ``path`` (``ramfs``: one that refuses
    O_DIRECT). Needs root (or CAP_SYS_ADMIN); where the mount is refused the test
    fails and says why."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", kind, "-o", options, kind, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a {kind} here ({done.stderr.strip()}): these tests need root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def port_taken_first(monkeypatch: pytest.MonkeyPatch, module: object) -> Iterator[int]:
    """A port a listener of this process holds, handed out by ``module.free_port``'s
    first call (later calls give free ports): what a process started on it meets when
    another took its port first."""
    import socket

    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    ports = iter([port])
    real = module.free_port  # type: ignore[attr-defined]
    monkeypatch.setattr(module, "free_port", lambda: next(ports, None) or real())
    try:
        yield port
    finally:
        holder.close()


def docs_reference():
    """docs/reference.py loaded as a module (it is a script of the checkout, not of the package)."""
    path = Path(__file__).resolve().parent.parent / "docs" / "reference.py"
    spec = importlib.util.spec_from_file_location("docs_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def counted_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each pysimdjson parse ``protocol/lazy.py`` makes from
    now on (its parsers are made afresh, each counting)."""
    import threading

    import simdjson

    from mldserver.protocol import lazy

    parses: list[int] = []

    class Counting(simdjson.Parser):
        def parse(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            parses.append(1)
            return super().parse(*args, **kwargs)

    monkeypatch.setattr(lazy.simdjson, "Parser", Counting)
    monkeypatch.setattr(lazy, "_local", threading.local())
    return parses


def resident_kib(where: Callable[[range, str], bool]) -> int:
    """This process's memory, in KiB, in the mappings ``where`` picks by their address
    range and their header line (``Rss`` in ``/proc/self/smaps``)::

        resident_kib(lambda span, _: address in span)         # the mapping holding address
        resident_kib(lambda _, header: "/spill/rows-" in header)   # every spill segment's
    """
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                low, high = (int(x, 16) for x in fields[0].split("-"))
                inside = where(range(low, high), line)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total
