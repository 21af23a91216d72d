"""What the timer tests share: the handler (``tests.timer_handlers:Scripted``), the
file its callbacks (and ``Scripted``'s calls) append to, and the operations a record
carries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson

from mldserver.api.testing import make_records

HANDLER = "tests.timer_handlers:Scripted"


def fired_file(tmp_path: Path, monkeypatch) -> Path:
    """The file the handler's timer callbacks append to (``MLDSERVER_TEST_FIRED``, set
    before the server starts: its handler processes inherit it)."""
    fired = tmp_path / "fired.jsonl"
    monkeypatch.setenv("MLDSERVER_TEST_FIRED", str(fired))
    return fired


def fired_lines(path: Path) -> list[dict]:
    """The callbacks' lines, in the order they were written."""
    return [line for line in _lines(path) if "fired_at" in line]


def call_lines(path: Path) -> list[dict]:
    """``Scripted``'s lines about its creates and cancels (asked, then returned), in order."""
    return [line for line in _lines(path) if "call" in line]


def _lines(path: Path) -> list[dict]:
    """The file's whole lines: handler processes append them (one write each) while the
    test reads, so a read can end inside the line being written; it is left for the next."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return [orjson.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]


def records(first: int, ops: list[list]) -> list[dict]:
    """One record per operation list."""
    return make_records(first, len(ops), data=lambda seq: orjson.dumps(ops[seq - first]))


def dead_letters(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "dead-letters" / "_timers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pid() -> int:
    return os.getpid()
