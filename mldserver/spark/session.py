"""The SparkSession of the Spark process, with defaults fit for a daemon.

``build(options)`` where ``options`` come from the server's settings::

    {"master": "local[*]", "remote": None, "conf": {"spark.driver.memory": "2g"},
     "work_dir": "/srv/mldserver-state/spark"}

- ``remote`` (``sc://host:port``) wins: a Spark Connect session. Otherwise ``master``
  (default ``local[*]``, embedded; ``local-cluster[2,1,1024]``, ``spark://...``).
- Loopback only (``SPARK_LOCAL_IP=127.0.0.1``), executors run this interpreter
  (``PYSPARK_PYTHON``), no web UI, scratch and warehouse under ``work_dir`` (the
  process runs there too, so no ``metastore_db`` or ``derby.log`` lands where the
  server was started), and Spark's own logging at WARN to the Spark process's log file
  (``work_dir/spark.log``), not to the server's console.
- ``conf`` (the ``spark_conf`` setting) overrides any of these.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def defaults(work_dir: Path) -> dict[str, str]:
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -Dderby.system.home={work_dir / 'derby'}"
    return {
        "spark.app.name": "mldserver",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.local.dir": str(work_dir / "local"),
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # Windows are small next to batch jobs: few shuffle partitions, adaptive on top.
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.session.timeZone": "UTC",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    }


def build(options: dict[str, Any]):
    from pyspark.sql import SparkSession

    work_dir = Path(options["work_dir"])
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {k: str(v) for k, v in (options.get("conf") or {}).items()}
    if options.get("remote"):
        builder = SparkSession.builder.remote(options["remote"])
        for key, value in conf.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    builder = SparkSession.builder.master(options.get("master") or "local[*]")
    for key, value in {**defaults(work_dir), **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def is_classic(spark) -> bool:
    """A classic session (py4j, a SparkContext here) rather than Spark Connect."""
    from pyspark.sql import SparkSession

    return isinstance(spark, SparkSession) and hasattr(spark, "_jsparkSession")
