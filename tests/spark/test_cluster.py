"""A Spark standalone cluster as the server's engine (``--spark-master spark://...``): a
master and two workers started from pyspark's own ``spark-class``, one worker SIGKILLed
while the server runs. The server logs the executor's loss and ``/status`` shows the
executors left; every record is still committed exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest

from ..harness import eventually
from .test_sink import PASSTHROUGH, committed_once, config_file

pytestmark = pytest.mark.spark
STARTED = re.compile(rb"Starting Spark master at spark://[^\s:]*:(\d+)")


class Cluster:
    """A standalone master and ``workers`` workers (one core, 512 MiB each) on loopback."""

    def __init__(self, work: Path, workers: int = 2) -> None:
        self.home = Path(pyspark.__file__).parent
        self.work = work
        self.port = 0  # the master's, read from its log: it binds one the system gives it
        self.logs: list = []
        self.workers: list = []
        self.env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_WORKER_DIR": str(work / "worker-dirs"), "SPARK_LOG_DIR": str(work)}
        self.master = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                  "--port", "0", "--webui-port", "0")
        try:
            self._wait("master", b"I have been elected leader")
            self.port = int(STARTED.search((work / "master.log").read_bytes())[1])
            self._start_workers(workers)
        except BaseException:
            self.stop()
            raise

    def _start_workers(self, workers: int) -> None:
        self.workers = [self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                    "--webui-port", "0", "--cores", "1", "--memory", "1g", self.url)
                        for i in range(workers)]
        for i in range(workers):
            self._wait(f"worker-{i}", b"Successfully registered with master")

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, cls: str, *args: str) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "wb")
        self.logs.append(log)
        return subprocess.Popen([str(self.home / "bin" / "spark-class"), cls, *args], cwd=self.work, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, name: str, text: bytes, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text not in (self.work / f"{name}.log").read_bytes():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark {name} did not start: {(self.work / f'{name}.log').read_text()[-2000:]}")
            time.sleep(0.25)

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker's executors with it
                proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "cluster").mkdir()
    c = Cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop()


def status(server) -> dict:
    with urllib.request.urlopen(f"{server.admin_url}/status", timeout=10) as reply:
        return json.loads(reply.read())


@pytest.mark.timeout(600)
async def test_a_workers_sigkill_is_logged_and_shown_and_every_record_committed_once(serve, tmp_path, cluster):
    out = tmp_path / "out"
    server = serve(
        PASSTHROUGH,
        "--sink", f"parquet:{out}", "--spark-master", cluster.url,
        "--pipeline", "mldserver.spark.pipeline:identity",
        "--config", config_file(tmp_path),
    )  # fmt: skip

    def executors() -> list[dict]:
        return [e for e in server.events() if e["event"] == "spark_executors"]

    await eventually(lambda: executors() or status(server)["spark"]["executors"], timeout=120,
                     what="the executors told")
    await eventually(lambda: len(status(server)["spark"]["executors"] or []) == 2, timeout=120,
                     what="both workers' executors up")
    os.kill(cluster.workers[0].pid, signal.SIGKILL)  # the worker alone: its executor notices and exits
    await eventually(lambda: [e for e in server.events() if e["event"] == "spark_executor_lost"], timeout=120,
                     what="the executor's loss logged")
    assert len(status(server)["spark"]["executors"]) == 1 and status(server)["spark"]["executors_lost"] == 1

    await committed_once(server, out)
