"""Fixtures for the fault tests: settings files, a small real filesystem, and the
server's error events appended to a failing assertion (so a failure says why)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from .peer import events


@pytest.fixture
def config_file(tmp_path):
    """Write a TOML settings file: ``config_file(handler_retries=0)`` -> its path."""
    count = [0]

    def write(text: str = "", **values) -> str:
        count[0] += 1
        path = tmp_path / f"settings-{count[0]}.toml"
        lines = [text] + [f"{k} = {_toml(v)}" for k, v in values.items()]
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    return write


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and value != value:
        return "nan"
    return repr(value)


class SmallFs:
    """A real tmpfs of ``size`` bytes: ``fill()`` takes all its space but ``keep``
    bytes, ``free()`` gives it back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self, keep: int = 0) -> None:
        reserve = self.path / "reserve"
        if keep:
            reserve.write_bytes(b"r" * keep)
        with open(self.filler, "ab") as f:
            chunk = b"f" * 4096
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError:
                pass
        if keep:
            reserve.unlink()

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (a disk that really fills up). Needs root (or CAP_SYS_ADMIN)."""
    path = tmp_path / "small"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs here ({done.stderr.strip()}): these tests need root")
    try:
        yield SmallFs(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _errors(log_path: Path) -> str:
    out = []
    for e in events(log_path):
        if e.get("level") in ("error", "warning"):
            tb = e.get("traceback", "").strip().splitlines()
            out.append(f"  {e.get('event')} {e.get('error', '')} {tb[-1] if tb else ''}".rstrip())
    return "\n".join(out[-8:]) or "  (none)"


@contextlib.contextmanager
def explained(server):
    """Append the server's latest warnings and errors to a failing assertion."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserver log, warnings and errors:\n{_errors(server.log_path)}") from None


def signal_server(server, sig) -> None:
    os.kill(server.proc.pid, sig)
