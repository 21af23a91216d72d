"""``mldserver local``: started as a user would (a subprocess), it runs kinesis-local and
DynamoDB Local, makes the stream with its shards (and the table with its stream on),
writes the daemon's properties file and prints the commands to run next; ``--put``
puts orders through that file; the file works for ``mldserver run`` with the real KCL
daemon (records put are handled); SIGTERM stops both emulators, no process left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import boto3
import pytest

from mldserver.ops.properties import read

from ..harness import MLDSERVER, ROOT
from .components import AWS, Run, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Local:
    """``mldserver local`` in its own session, its stdout in a file, ready when it says so."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.props = tmp / "local.properties"
        self.out = tmp / "local.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen([MLDSERVER, "local", "--properties-out", str(self.props), "--dir",
                                          str(tmp / "emulators"), *args], cwd=tmp, env=ENV, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: "ready:" in self.text() or self._exited(), 180, "mldserver local ready")
        self.settings = read(self.props)

    def _exited(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"mldserver local exited {self.proc.returncode}: {self.text()}")

    def text(self) -> str:
        return self.out.read_text()

    def value(self, key: str) -> str:
        return self.settings.value(key)

    def put(self, n: int, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([MLDSERVER, "local", "--put", str(n), "--properties-out", str(self.props), *args],
                              env=ENV, capture_output=True, text=True, timeout=120)

    def descendants(self) -> set[int]:
        """Every process below it (its emulators, and theirs), from /proc."""
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        found, frontier = set(), {self.proc.pid}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
            found |= frontier
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_local_makes_the_stream_and_table_writes_the_properties_puts_orders_and_stops_leaving_no_process(tmp_path):
    local = Local(tmp_path, "--stream", "clicks", "--shards", "3", "--table", "things")
    try:
        text = local.text()
        props = os.path.relpath(local.props, tmp_path)
        assert f"mldserver run --properties {props} --handler mldserver.examples.quickstart:Orders" in text
        assert "mldserver local --put 100 --table things" in text  # its default file, in its folder
        assert f"AWS_ENDPOINT_URL_KINESIS={local.value('kinesisEndpoint')} mldserver serve --source kinesis:clicks" \
            in text
        assert "export AWS_ACCESS_KEY_ID=local" in text
        assert local.value("streamName") == "clicks" and local.value("metricsLevel") == "NONE"
        assert local.value("retrievalMode") == "POLLING" and local.value("failoverTimeMillis") == "10000"

        kinesis = boto3.client("kinesis", endpoint_url=local.value("kinesisEndpoint"), **AWS)
        shards = kinesis.list_shards(StreamName="clicks")["Shards"]
        assert len(shards) == 3
        dynamodb = boto3.client("dynamodb", endpoint_url=local.value("dynamoDBEndpoint"), **AWS)
        table = dynamodb.describe_table(TableName="things")["Table"]
        assert table["StreamSpecification"]["StreamEnabled"] and table["LatestStreamArn"]

        done = local.put(20, "--table", "things")
        assert done.returncode == 0, done.stderr
        assert "put 20 orders on stream clicks" in done.stdout and "put 20 items in table things" in done.stdout

        def records() -> int:
            count = 0
            for shard in shards:
                it = kinesis.get_shard_iterator(StreamName="clicks", ShardId=shard["ShardId"],
                                                ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                count += len(kinesis.get_records(ShardIterator=it)["Records"])
            return count

        assert records() == 20
        assert dynamodb.scan(TableName="things", Select="COUNT")["Count"] == 20
        kinesis.close()
        dynamodb.close()

        below = local.descendants()
        assert len(below) >= 2  # node (kinesis-local) and java (DynamoDB Local)
    finally:
        code = local.stop()
    assert code == 0, local.text()
    assert local.text().rstrip().endswith("mldserver local: stopped")
    wait_for(lambda: not any(alive(pid) for pid in below), 30, "no emulator left")


def test_the_printed_serve_source_command_reads_the_orders_put_into_windows(tmp_path):
    """The no-daemon command it prints (the endpoint from the environment), as printed."""
    local = Local(tmp_path, "--stream", "orders", "--shards", "2")
    windows = tmp_path / "windows"
    serve = None
    try:
        line = next(line.strip() for line in local.text().splitlines() if "--source kinesis:orders" in line)
        env, _, command = line.partition(" ")
        assert env == f"AWS_ENDPOINT_URL_KINESIS={local.value('kinesisEndpoint')}"
        assert local.put(20).returncode == 0
        words = command.split()
        assert words[:2] == ["mldserver", "serve"] and "file:./windows" in words
        serve = subprocess.Popen([MLDSERVER, *words[1:], "--port", "0", "--admin", "off", "--log-file",
                                  str(tmp_path / "serve.log")], cwd=tmp_path, start_new_session=True,
                                 env={**ENV, env.split("=", 1)[0]: env.split("=", 1)[1], "AWS_ACCESS_KEY_ID": "local",
                                      "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1"})

        def rows() -> int:
            if serve.poll() is not None:
                raise AssertionError(f"serve exited {serve.returncode}")
            return sum(len(f.read_text().splitlines()) for f in windows.glob("[!_]*.jsonl"))

        wait_for(lambda: rows() >= 20, 240, "20 orders in committed windows")
        assert rows() == 20
    finally:
        if serve is not None and serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(120)
        assert local.stop() == 0


def test_with_no_emulators_installed_and_no_npm_it_says_what_to_install_in_one_line(tmp_path):
    (tmp_path / "bin").mkdir()
    done = subprocess.run([MLDSERVER, "local"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**ENV, "MLDSERVER_DEPS": str(tmp_path / "none"), "XDG_CACHE_HOME": str(tmp_path),
                               "PATH": str(tmp_path / "bin")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["mldserver: kinesis-local needs Node.js and npm on PATH, to install and to run: install them "
                         "(Debian and Ubuntu: apt-get install nodejs npm), then run this again"]
    assert not (tmp_path / "local.properties").exists()


def test_put_without_a_running_local_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([MLDSERVER, "local", "--put", "5", "--properties-out", str(tmp_path / "none.properties")],
                          env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "start `mldserver local` first" in done.stderr


@pytest.mark.realdaemon
def test_the_properties_it_writes_serve_the_orders_put_through_mldserver_run_into_windows(tmp_path):
    """The commands it prints, as the docs walk through them: ``mldserver run`` with the
    quick start's handler and a file sink, ``--put``: every order in a committed window."""
    local = Local(tmp_path, "--shards", "2")
    windows = tmp_path / "windows"
    run = None
    try:
        assert local.put(50).returncode == 0
        started = time.time()
        run = Run(tmp_path, "mldserver.examples.quickstart:Orders", local.props, "--sink", f"file:{windows}",
                  "--window", "5")

        def rows() -> list[dict]:
            return [json.loads(line) for f in sorted(windows.glob("[!_]*.jsonl"))
                    for line in f.read_text().splitlines()]

        got = wait_for(lambda: len(rows()) >= 50 and rows(), 300, "50 orders in committed windows")
        assert sorted(got, key=lambda r: (r["customer"], r["amount"])) == sorted(
            ({"customer": f"c-{i % 7}", "amount": float(10 + i % 50)} for i in range(50)),
            key=lambda r: (r["customer"], r["amount"]))
        first = min(datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
                    for e in run.events() if e["event"] == "initialize")
        print(f"\nmldserver run start to first initialize: {first - started:.1f} s")
        assert not [e for e in run.events() if e["event"] == "daemon_error"]
    finally:
        if run is not None:
            assert run.terminate() == 0
        assert local.stop() == 0
