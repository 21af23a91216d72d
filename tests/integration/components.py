"""The real components of REAL-MLD.md, started on loopback for a test: kinesis-local,
DynamoDB Local and the KCL 3.x MultiLangDaemon (Java). All are installed by
``scripts/setup --test`` under .deps/ and .venv/; nothing here is a mock."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import boto3

from ..conftest import ROOT
from ..helpers import eventually

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


def kcl_classpath() -> str:
    spec = importlib.util.find_spec("amazon_kclpy")
    assert spec and spec.submodule_search_locations, "kclpy-ext is not installed: run scripts/setup --test"
    jars = Path(list(spec.submodule_search_locations)[0]) / "jars"
    return f"{jars}/*:/usr/share/java/jaxb-api.jar"


class MultiLangDaemon(Process):
    """The real KCL 3.x MultiLangDaemon with a properties file written for the test."""

    def __init__(self, tmp: Path, *, executable: str, stream: str, app: str, kinesis: KinesisLocal,
                 dynamodb: DynamoDBLocal, run: int = 1, extra: dict[str, str] | None = None) -> None:
        props = {
            "executableName": executable,
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
        path = tmp / f"{app}-{run}.properties"
        path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
        super().__init__(
            ["java", "-cp", f"{kcl_classpath()}:{tmp}", "software.amazon.kinesis.multilang.MultiLangDaemon",
             "--properties-file", str(path)],
            tmp / f"daemon-{run}.log",
            env={"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1"},
        )
