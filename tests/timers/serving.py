"""What the timer tests share: a server in the test's loop running
``tests.timer_handlers:Scripted``, the fake daemon, the file the callbacks append to,
and the operations a record carries."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import orjson

from mldserver.config import Settings
from mldserver.server import Server
from mldserver.testing import FakeDaemon, make_records

from ..conftest import relay_command

HANDLER = "tests.timer_handlers:Scripted"


@contextlib.asynccontextmanager
async def running(tmp_path: Path, monkeypatch, **overrides):
    """A started server (``workers`` 2 unless told), its fake daemon and the fired file."""
    fired = tmp_path / "fired.jsonl"
    monkeypatch.setenv("MLDSERVER_TEST_FIRED", str(fired))  # the handler processes inherit it
    settings = Settings(**{"handler": HANDLER, "port": 0, "state_dir": str(tmp_path / "state"), "workers": 2,
                           "handler_backoff": 0.01, **overrides})
    server = Server(settings)
    await server.start()
    try:
        yield server, FakeDaemon(relay_command(server.address[1])), fired
    finally:
        await server.shutdown()


def fired_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def records(first: int, ops: list[list]) -> list[dict]:
    """One record per operation list."""
    return make_records(first, len(ops), data=lambda seq: orjson.dumps(ops[seq - first]))


def dead_letters(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "dead-letters" / "_timers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pid() -> int:
    return os.getpid()
