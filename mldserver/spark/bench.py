"""The bare Spark hand-off that ``mldserver bench --part spark`` measures the pipeline
against, here because only ``mldserver/spark/`` imports pyspark::

    table, _ = rows_to_table(JsonLines.of(rows), None)       # sinks/schema.py
    rows_per_s = bare_handoff(Path("/tmp/bare"), table, windows=8)

A window's rows, already an Arrow table, are written to a parquet file, read by Spark
with an explicit schema and written out as parquet (the identity pipeline's work),
one window after another, in an embedded Spark session of the calling process.
"""

from __future__ import annotations

import time
from pathlib import Path

from typing import Any


def bare_handoff(work: Path, table: Any, windows: int) -> float:
    """rows/s for pyarrow table -> parquet file -> Spark read -> parquet output."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    from . import session

    work.mkdir(parents=True, exist_ok=True)
    spark = session.build({"work_dir": str(work)})
    try:
        spark_schema = from_arrow_schema(table.schema)
        spark.range(1).write.mode("overwrite").parquet(str(work / "warm"))  # JVM warm-up, not timed
        started = time.perf_counter()
        for w in range(windows):
            path = work / f"in-{w}.parquet"
            pq.write_table(table, path, compression="none", use_dictionary=False)  # as the sink writes it
            spark.read.schema(spark_schema).parquet(str(path)).write.parquet(str(work / f"out-{w}"))
        return windows * table.num_rows / (time.perf_counter() - started)
    finally:
        spark.stop()
