"""Spark's JVM warmed before the first window (``spark/warmup.py``), on a real Spark
process with embedded Spark: with nothing asked of it, the Spark process runs all its
warm-up jobs and says so; the first request stops the warm-up before it runs (the job
then running let finish, none after it) and is answered as if there had been none; a
warm-up job that fails ends the warm-up with a warning saying why, and Spark answers as
before; and a server whose warm-up ran commits every record once, as before."""

from __future__ import annotations

import logging

import pytest

from mldserver.api.context import Context
from mldserver.base.config import Settings
from mldserver.base.logs import EventLogger
from mldserver.spark import warmup
from mldserver.spark.process import SparkProcess

from ..harness import eventually
from .test_sink import PASSTHROUGH, committed_once, config_file

pytestmark = [pytest.mark.spark, pytest.mark.asyncio]


class Told(logging.Handler):
    """The Spark process's events, as the server logs them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append({"event": record.msg, "level": record.levelname.lower(), **getattr(record, "fields", {})})

    def warmed(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "spark_warmed_up"]


def spark_process(tmp_path) -> tuple[SparkProcess, Told]:
    told = Told()
    logger = logging.getLogger(f"test.warmup.{tmp_path.name}")
    logger.setLevel(logging.INFO)
    logger.addHandler(told)
    return SparkProcess(Settings(handler="x:y", state_dir=str(tmp_path)), log=EventLogger(logger)), told


async def test_left_alone_the_spark_process_runs_every_warm_up_job_and_leaves_no_file(tmp_path):
    spark, told = spark_process(tmp_path)
    await spark.start()
    try:
        await eventually(told.warmed, timeout=240, interval=0.2, what="the warm-up told")
        [warmed] = told.warmed()
        assert warmed["jobs"] == warmup.JOBS and warmed["cut_short"] is False and warmed["ms"] > 0
        assert not (spark.work_dir / "warm-up").exists()
        # Spark answers as before once it is warm.
        rows = [row async for row in await Context(spark.settings, spark=spark).sql("SELECT :n + 1 AS m", n=1)]
        assert rows == [{"m": 2}]
    finally:
        await spark.stop()


async def test_the_first_request_stops_the_warm_up_before_it_runs(tmp_path):
    spark, told = spark_process(tmp_path)
    await spark.start()
    try:
        # Into its jobs (its input written): the job running is let finish, then the request runs.
        await eventually(lambda: (spark.work_dir / "warm-up" / "in.parquet").exists(), timeout=120, interval=0.05,
                         what="the warm-up's jobs begun")
        rows = await Context(spark.settings, spark=spark).sql("SELECT id FROM range(0, 3)")
        assert [row["id"] async for row in rows] == [0, 1, 2]
        # Told before the request's answer: the warm-up had ended, its files gone, before the request ran.
        [warmed] = told.warmed()
        assert warmed["cut_short"] is True and warmed["jobs"] < warmup.JOBS
        assert not (spark.work_dir / "warm-up").exists()
    finally:
        await spark.stop()


async def test_a_failed_warm_up_job_is_told_as_a_warning_with_its_error_and_spark_still_answers(tmp_path):
    spark, told = spark_process(tmp_path)
    spark.work_dir.mkdir(parents=True)
    (spark.work_dir / "warm-up").write_text("a file where the warm-up's folder goes")  # its input cannot be written
    await spark.start()
    try:
        await eventually(told.warmed, timeout=120, interval=0.1, what="the warm-up told")
        [warmed] = told.warmed()
        assert warmed["level"] == "warning" and warmed["jobs"] == 0 and warmed["cut_short"] is True
        assert warmed["error"].startswith("FileExistsError: ") and "warm-up" in warmed["error"]
        assert "Traceback" in spark.log_path.read_text()  # the whole error, in spark.log
        rows = await Context(spark.settings, spark=spark).sql("SELECT 2 AS n")
        assert [row async for row in rows] == [{"n": 2}]
    finally:
        await spark.stop()


async def test_a_warm_up_cut_short_by_its_stop_is_no_error(tmp_path):
    """A job that fails because the warm-up is being stopped (the session going) is not
    a failure to tell; one that fails on its own is, by its first line."""
    stopping = warmup.WarmUp(lambda path: path, lambda df, folder: None, tmp_path / "w", jobs=3, rows=10)

    def write_then_stop(df, folder):
        stopping._stopping.set()
        raise RuntimeError("the session is going")

    stopping._write = write_then_stop
    assert stopping.run()[::2] == (0, None)

    def fail(df, folder):
        raise RuntimeError("no space left on device\n\tat org.apache.spark ...")

    failing = warmup.WarmUp(lambda path: path, fail, tmp_path / "w", jobs=3, rows=10)
    assert failing.run()[::2] == (0, "RuntimeError: no space left on device")
    assert not (tmp_path / "w").exists()


async def test_a_server_whose_spark_warmed_up_commits_every_record_once(serve, tmp_path):
    out = tmp_path / "out"
    server = serve(PASSTHROUGH, "--sink", f"parquet:{out}", "--config", config_file(tmp_path))

    def warmed() -> list[dict]:
        return [e for e in server.events() if e["event"] == "spark_warmed_up"]

    await eventually(warmed, timeout=240, interval=0.2, what="the warm-up told")
    assert warmed()[0]["cut_short"] is False
    await committed_once(server, out)
