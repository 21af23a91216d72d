"""The Spark Connect path: the same pipeline and sink against a Spark Connect server
(``--spark-remote sc://host:port``), which the test starts from pyspark's own jars."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pyspark
import pytest

from .test_sink import PASSTHROUGH, committed_once, config_file

pytestmark = pytest.mark.spark


STARTED = re.compile(rb"Spark Connect server started at: [^\s]*:(\d+)")


@pytest.fixture(scope="module")
def spark_connect(tmp_path_factory):
    """A local Spark Connect server on loopback: ``sc://127.0.0.1:<port>``. The server
    binds a port the system gives it (0) and says which in its log: a port picked here
    and bound later could be taken meanwhile (by Spark's own driver, once)."""
    home = Path(pyspark.__file__).parent
    work = tmp_path_factory.mktemp("spark-connect")
    with open(work / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [str(home / "bin" / "spark-submit"),
             "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--conf", "spark.connect.grpc.binding.port=0",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false",
             "--conf", f"spark.sql.warehouse.dir={work / 'warehouse'}",
             "--name", "mldserver test Spark Connect", "spark-internal"],
            cwd=work,
            env={**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while (started := STARTED.search((work / "server.log").read_bytes())) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Spark Connect server did not start: {(work / 'server.log').read_text()[-4000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{int(started[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_windows_are_committed_once_through_spark_connect(serve, tmp_path, spark_connect):
    out = tmp_path / "out"
    server = serve(
        PASSTHROUGH,
        "--sink", f"parquet:{out}", "--spark-remote", spark_connect,
        "--pipeline", "mldserver.spark.pipeline:identity",
        "--config", config_file(tmp_path),
    )  # fmt: skip
    [started] = [e for e in server.events() if e["event"] == "spark_started"]
    assert started["remote"] == spark_connect and started["master"] is None
    await committed_once(server, out)
