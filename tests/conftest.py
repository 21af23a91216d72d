"""Shared fixtures: paths, a server running in a subprocess (the real CLI), and the
relay command the fake daemon launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncio

import pytest
import uvloop

from mldserver import testing

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"  # conformance scenarios and KPL vectors, copied as they are
BIN = Path(sys.executable).parent
MLDSERVER = str(BIN / "mldserver")


# Tests run what ships: the CLI serves on uvloop (``uvloop.run``), so does every test's
# loop. The pool's, the worker's and the fault tests run on the stock loop as well: a
# failure of a pipe or a socket is raised by one loop and logged and dropped by the other.
BOTH_LOOPS = ("tests/pool/", "tests/shard/", "tests/faults/")


def pytest_asyncio_loop_factories(config, item):
    path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
    if path.startswith(BOTH_LOOPS):
        return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
    return {"uvloop": uvloop.new_event_loop}


def relay_command(port: int) -> str:
    """executableName as a user would write it, for a server on loopback."""
    return testing.relay_command("127.0.0.1", port)


class ServerProcess:
    """``mldserver serve`` in a subprocess; ``port`` read from its ``listening`` event."""

    def __init__(self, handler: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        name = f"server-{handler.replace(':', '_')}"
        runs = 1
        while (tmp_path / f"{name}.log").exists():  # a restart gets a log of its own
            runs += 1
            name = f"server-{handler.replace(':', '_')}-{runs}"
        self.log_path = tmp_path / f"{name}.log"
        self.state_dir = tmp_path / "state"
        self.stderr_path = tmp_path / f"{name}.stderr"
        stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [MLDSERVER, "serve", "--handler", handler, *([] if "--unix" in extra else ["--port", "0"]),
             "--state-dir", str(self.state_dir), "--log-file", str(self.log_path),
             *([] if "--admin" in extra else ["--admin", "127.0.0.1:0"]), *extra],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        stderr.close()
        self.port = self._wait_listening()

    def _wait_listening(self, timeout: float = 180.0) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if event["event"] == "listening":
                    return event.get("port")
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.stderr_path.read_text()}")
            time.sleep(0.05)
        raise TimeoutError("server did not log 'listening'")

    @property
    def admin_url(self) -> str | None:
        """The admin endpoint's URL, from its ``admin_listening`` event."""
        for event in self.events():
            if event["event"] == "admin_listening":
                return event["url"].rstrip("/")
        return None

    def events(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def serve(tmp_path):
    servers: list[ServerProcess] = []

    def start(handler: str, *extra: str, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(handler, tmp_path, *extra, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# -- DynamoDB Local, for the tests that need it (one per test module) ---------------------

@pytest.fixture(scope="module")
def dynamodb(tmp_path_factory):
    """A DynamoDB Local of this test module's own (``integration/components.py``)."""
    from .integration.components import DynamoDBLocal

    local = DynamoDBLocal(tmp_path_factory.mktemp("dynamodb-local"))
    try:
        yield local
    finally:
        local.terminate()


@pytest.fixture
def aws(dynamodb, monkeypatch):
    """The usual AWS configuration, pointed at DynamoDB Local (handler processes inherit it)."""
    from .integration.components import AWS

    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_REGION", AWS["region_name"])
    return dynamodb
