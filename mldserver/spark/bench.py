"""The bare Spark hand-off that ``mldserver bench --part spark`` measures the pipeline
against, here because only ``mldserver/spark/`` imports pyspark::

    table, _ = rows_to_table(JsonLines.of(rows), None)       # sinks/schema.py
    rows_per_s, file_ms, job_ms = bare_handoff(Path("/tmp/bare"), table, windows=8)

A window's rows, already an Arrow table, are written to a parquet file, read by Spark
with an explicit schema and written out as parquet (the identity pipeline's work),
one window after another, in an embedded Spark session of the calling process. The
median time of each step a window (its file, Spark's job) is part of the floor the
benchmark prints for a window's close-to-commit latency.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from typing import Any


def bare_handoff(work: Path, table: Any, windows: int) -> tuple[float, float, float]:
    """rows/s for pyarrow table -> parquet file -> Spark read -> parquet output, and the
    median milliseconds a window spends on its file and on Spark's job."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    from . import session
    from .warmup import WarmUp

    work.mkdir(parents=True, exist_ok=True)
    spark = session.build({"work_dir": str(work)})
    try:
        spark_schema = from_arrow_schema(table.schema)
        # Spark's JVM warmed as the Spark process warms it (not timed)
        WarmUp(lambda p: spark.read.schema(from_arrow_schema(pq.read_schema(p))).parquet(p),
               lambda df, f: df.write.mode("overwrite").parquet(f), work / "warm-up").run()
        files, jobs = [], []
        started = time.perf_counter()
        for w in range(windows):
            path = work / f"in-{w}.parquet"
            begun = time.perf_counter()
            pq.write_table(table, path, compression="none", use_dictionary=False)  # as the sink writes it
            written = time.perf_counter()
            spark.read.schema(spark_schema).parquet(str(path)).write.parquet(str(work / f"out-{w}"))
            files.append(written - begun)
            jobs.append(time.perf_counter() - written)
        rows_per_s = windows * table.num_rows / (time.perf_counter() - started)
        return rows_per_s, statistics.median(files) * 1000, statistics.median(jobs) * 1000
    finally:
        spark.stop()
