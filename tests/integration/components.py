"""The real components (from PyPI, npm and Debian: scripts/setup --test), started on loopback for a test: kinesis-local,
DynamoDB Local, and ``mldserver run``, which starts the KCL 3.x MultiLangDaemon (Java)
as its child. All are installed by ``scripts/setup --test`` under .deps/ and .venv/;
nothing here is a mock."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import boto3

from ..harness import MLDSERVER, ROOT, eventually

DEPS = ROOT / ".deps"
AWS = dict(region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class Process:
    def __init__(self, argv: list[str], log: Path, *, cwd: Path | None = None, env: dict | None = None) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class KinesisLocal(Process):
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        pkg = DEPS / "node_modules" / "kinesis-local"
        super().__init__(
            ["node", str(pkg / "main.js")],
            tmp / "kinesis-local.log",
            env={
                "KINESIS_MOCK_CERT_PATH": str(pkg / "server.json"),
                "KINESIS_MOCK_PLAIN_PORT": str(self.port),
                "KINESIS_MOCK_TLS_PORT": str(free_port()),
                "CREATE_STREAM_DURATION": "0ms",
                "DELETE_STREAM_DURATION": "0ms",
                "SPLIT_SHARD_DURATION": "0ms",
                "MERGE_SHARDS_DURATION": "0ms",
                "UPDATE_SHARD_COUNT_DURATION": "0ms",
                "LOG_LEVEL": "WARN",
            },
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: urllib.request.urlopen(self.endpoint + "/healthcheck", timeout=2).status == 200,
                 60, "kinesis-local")
        self.client = boto3.client("kinesis", endpoint_url=self.endpoint, **AWS)

    def create_stream(self, name: str, shards: int) -> None:
        self.client.create_stream(StreamName=name, ShardCount=shards)
        wait_for(lambda: self.client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
                 ["StreamStatus"] == "ACTIVE", 30, f"stream {name}")

    def shards(self, name: str) -> dict[str, dict]:
        return {s["ShardId"]: s for s in self.client.list_shards(StreamName=name)["Shards"]}

    def terminate(self, timeout: float = 60) -> int:
        """Its HTTP server waits up to 30 s after SIGTERM for open connections to close:
        the client's (kept alive) is closed first, then it exits at once."""
        self.client.close()
        return super().terminate(timeout)


class DynamoDBLocal(Process):
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        home = DEPS / "dynamodb-local"
        super().__init__(
            ["java", "-Djava.library.path=./DynamoDBLocal_lib", "-jar", "DynamoDBLocal.jar", "-inMemory",
             "-sharedDb", "-disableTelemetry", "-port", str(self.port)],
            tmp / "dynamodb-local.log",
            cwd=home,
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.client = boto3.client("dynamodb", endpoint_url=self.endpoint, **AWS)
        wait_for(lambda: "TableNames" in self.client.list_tables(), 60, "DynamoDB Local")

    def leases(self, table: str) -> dict[str, tuple[str, int]]:
        items = self.client.scan(TableName=table, ConsistentRead=True)["Items"]
        return {
            i["leaseKey"]["S"]: (i.get("checkpoint", {}).get("S"), int(i.get("checkpointSubSequenceNumber", {}).get("N", 0)))
            for i in items
        }


def write_properties(tmp: Path, name: str, *, stream: str, app: str, kinesis: KinesisLocal, dynamodb: DynamoDBLocal,
                     extra: dict[str, str] | None = None) -> Path:
    """The daemon's properties file for these endpoints (the ones seen to work). Its
    executableName is a stale one: ``mldserver run`` sets its own relay."""
    props = {
        "executableName": "mldserver connect 127.0.0.1:1",
        "streamName": stream,
        "applicationName": app,
        "AWSCredentialsProvider": "DefaultCredentialsProvider",
        "regionName": "us-east-1",
        "kinesisEndpoint": kinesis.endpoint,
        "dynamoDBEndpoint": dynamodb.endpoint,
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
    path = tmp / f"{name}.properties"
    path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    return path


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

