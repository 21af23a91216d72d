"""How a test starts a server and waits for what it does: ``running`` (a ``Server`` in the
test's own event loop), ``ServerProcess`` (``mldserver serve`` in a subprocess, the real
CLI) and ``eventually`` (the one way to wait for what another task or process does)::

    async with running(tmp_path, "tests.pool_handlers:Emit", handler_retries=0) as (server, _, daemon):
        shard = await daemon.shard("shardId-1")
        await shard.process_records(make_records(1, 5))
        await eventually(lambda: daemon.checkpoints.get("shardId-1"), what="the checkpoint")

    server = ServerProcess("tests.handlers:Noop", tmp_path, "--workers", "2")
    daemon = FakeDaemon(relay_command(server.port))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, NamedTuple, TypeVar

from mldserver.api import testing
from mldserver.base.config import Settings
from mldserver.server.server import Server
from mldserver.api.testing import FakeDaemon

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MLDSERVER = str(BIN / "mldserver")


def bench(*args: str, timeout: float) -> str:
    """``mldserver bench ARGS``'s output, once it has exited 0 (else the test fails with
    what it printed)."""
    out = subprocess.run([MLDSERVER, "bench", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def relay_command(port: int) -> str:
    """executableName as a user would write it, for a server on loopback."""
    return testing.relay_command("127.0.0.1", port)


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


# -- a server in the test's loop ------------------------------------------------------------

class Running(NamedTuple):
    """What ``running`` yields: ``(server, sink, daemon)``."""

    server: Server
    sink: Any  # the sink object the test gave (None for none, or for a ``sink`` setting)
    daemon: FakeDaemon  # the fake daemon, its relay pointed at the server (``daemon.command``)


@contextlib.asynccontextmanager
async def running(tmp_path: Path, handler: str | Callable[..., Any], *, sink: Any = None,
                  clock: Callable[[], float] | None = None, **overrides: Any) -> AsyncIterator[Running]:
    """A started ``Server`` on a free loopback port with its state in ``TMP/state``, shut
    down when the block ends (failed or not).

    ``handler`` is ``module:attr`` (imported by the handler processes, or in this loop
    with ``workers=0``), or a handler class or factory run in this loop. ``sink`` is a
    ``sink`` setting (``file:DIR``) or an object the server commits its windows to;
    ``clock`` is the coordinator's (a ``FakeClock``). ``overrides`` are settings; the
    retry backoffs are 0.01 s unless given."""
    factory = None
    if not isinstance(handler, str):
        factory, handler = handler, "test"  # the name is not imported: the factory is the handler
    if isinstance(sink, str):
        overrides["sink"], sink = sink, None
    settings = Settings(**{"handler": handler, "port": 0, "state_dir": str(tmp_path / "state"),
                           "handler_backoff": 0.01, "checkpoint_backoff": 0.01, **overrides})
    server = Server(settings, factory, clock=clock, sink=sink)
    await server.start()
    daemon = FakeDaemon(relay_command(server.address[1]))
    try:
        yield Running(server, sink, daemon)
    finally:
        try:
            await server.shutdown()
        finally:
            await daemon.close()  # its relays, exiting as the server closed them, waited for


# -- a server in a subprocess -----------------------------------------------------------------

def _named(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``args`` (as argparse reads them)."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.partition("=")[2]
    return found


def log_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines in ``path`` (a line not yet whole, or not JSON, is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _limit_files(n: int) -> Callable[[], None]:
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return limit


class ServerProcess:
    """``mldserver serve`` in a subprocess, waited for until it logs ``listening``
    (``port``) or exits (``code``).

    With a handler, it serves on a free port (unless ``--unix``) with its state in
    ``TMP/state`` (both unless ``extra`` says otherwise: argparse takes the last), logs to
    a file of its own (``log_path``; a restart in the same folder gets another), and an
    exit before it listens raises::

        server = ServerProcess("tests.handlers:Noop", tmp_path, "--workers", "2")

    With ``handler`` None, ``extra`` is the whole command line: the server's logs go to
    stderr as on a user's terminal (unless it names a ``--log-file``), and an exit is what
    the test looks at (``code``, ``stderr``). Either way the admin endpoint is on a free
    port unless ``extra`` names one (never the default port, which another test may hold).
    ``open_files`` is the server's limit on open files, soft and hard (as a unit's
    ``LimitNOFILE=``)."""

    started: list[ServerProcess] = []  # this test's servers, for its failure report (conftest.py)

    def __init__(self, handler: str | None, tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                 cwd: Path | None = None, timeout: float = 180.0, open_files: int | None = None) -> None:
        ServerProcess.started.append(self)
        args = list(extra)
        if handler is not None:
            name = stem = f"server-{handler.replace(':', '_')}"
            runs = 1
            while (tmp_path / f"{name}.log").exists():  # a restart gets a log of its own
                runs += 1
                name = f"{stem}-{runs}"
            self.stderr_path = tmp_path / f"{name}.stderr"
            self.log_path = tmp_path / f"{name}.log"
            args = ["--handler", handler, *([] if "--unix" in extra else ["--port", "0"]),
                    "--state-dir", str(tmp_path / "state"), "--log-file", str(self.log_path), *extra]
        else:
            self.stderr_path = tmp_path / f"launch-{len(list(tmp_path.glob('launch-*.stderr'))) + 1}.stderr"
            log_file = _named(args, "--log-file")
            self.log_path = Path(log_file) if log_file else self.stderr_path
        if _named(args, "--admin") is None:
            args += ["--admin", "127.0.0.1:0"]
        state_dir = _named(args, "--state-dir")
        self.state_dir = Path(state_dir) if state_dir else None
        self.args = args
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen([MLDSERVER, "serve", *args], cwd=cwd or ROOT,
                                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                                         stdout=subprocess.DEVNULL, stderr=stderr,
                                         preexec_fn=None if open_files is None else _limit_files(open_files))
        self.port: int | None = None
        self.code: int | None = None  # the exit code if it exited before it listened
        listening = self._wait(timeout)
        if listening is None:
            self.code = self.proc.returncode
            if handler is not None:
                raise RuntimeError(f"server exited {self.code}: {self.stderr}")
        else:
            self.port = listening.get("port")

    def _wait(self, timeout: float) -> dict | None:
        """The ``listening`` event, or None once the process has exited."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events():
                if event.get("event") == "listening":
                    return event
            if self.proc.poll() is not None:
                return None
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"mldserver serve {' '.join(self.args)}: neither exited nor listened in {timeout} s")
            time.sleep(0.05)

    def __repr__(self) -> str:
        if self.code is None:
            return "ServerProcess(the server started and listened)"
        return f"ServerProcess(exit {self.code}, stderr={self.stderr[-600:]!r})"

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        """The last ``lines`` of its log (and of its stderr, if the log is elsewhere): what a
        failing test's report shows of it."""
        code = self.proc.poll()
        out = [f"--- mldserver serve {'running' if code is None else f'exited {code}'}"]
        for path in dict.fromkeys((self.log_path, self.stderr_path)):
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"--- {path} (last {min(lines, len(text))} of {len(text)} lines)")
            out.extend(text[-lines:])
        return "\n".join(out)

    @property
    def admin_url(self) -> str | None:
        """The admin endpoint's URL, from its ``admin_listening`` event."""
        for event in self.events():
            if event.get("event") == "admin_listening":
                return event["url"].rstrip("/")
        return None

    def events(self) -> list[dict[str, Any]]:
        return log_events(self.log_path)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
