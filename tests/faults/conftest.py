"""Fixtures for the fault tests: settings files, a small real filesystem, and the
server's error events appended to a failing assertion (so a failure says why)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from ..harness import ServerProcess, log_events
from ..helpers import small_tmpfs
from .peer import Peer


@pytest.fixture(autouse=True)
async def close_peers(serve):
    """Every Peer a test opened is closed when it ends (failed or not), before its
    servers stop (``serve``): a server stopped with a peer still connected would wait
    its shutdown_timeout for the peer to hang up."""
    yield
    peers, Peer.opened[:] = list(Peer.opened), []
    for peer in peers:
        peer.close()
    for peer in peers:
        try:
            await peer.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


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
        fd = os.open(self.filler, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            chunk = b"f" * 4096
            while True:
                os.write(fd, chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
        if keep:
            reserve.unlink()

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (a disk that really fills up). Needs root (or CAP_SYS_ADMIN)."""
    with small_tmpfs(tmp_path / "small", "1m") as path:
        yield SmallFs(path)


def _errors(log_path: Path) -> str:
    out = []
    for e in log_events(log_path):
        if e.get("level") in ("error", "warning"):
            tb = e.get("traceback", "").strip().splitlines()
            line = f"  {e.get('event')} {e.get('error', '')} {tb[-1] if tb else ''}".rstrip()
            out.append(line if len(line) < 300 else line[:200] + " ... " + line[-60:])
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


def launch(tmp_path: Path, *args: str, timeout: float = 60.0, cwd=None, env=None) -> ServerProcess:
    """Run ``mldserver serve ARGS`` until it exits (``code``) or listens (then stop it:
    ``code`` is None). Its logs go to stderr, as on a user's terminal (unless ARGS name a
    --log-file): what a refused start-up prints there is all the user sees."""
    server = ServerProcess(None, tmp_path, *args, timeout=timeout, cwd=cwd, env=env)
    server.stop()
    return server


def assert_refused(result: ServerProcess, *names: str) -> None:
    """The server refused to start: exit 2, one clear line naming each of ``names``,
    no traceback."""
    assert result.code is not None, f"the server started and listened: {result}"
    assert result.code == 2, f"expected exit 2 with a clear message: {result}"
    assert "Traceback" not in result.stderr, f"a traceback instead of a one-line message: {result}"
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr: {result}"
    for name in names:
        assert name in lines[0], f"the message does not name {name!r}: {result}"
