"""Sinks: where closed windows go. Each implements the ``Sink`` protocol of
``coordinator/handoff.py`` (``start() -> Committed``, ``commit(window)``):

- ``file:DIR``     JSON lines per window (``file.py``), at least once, no Spark
- ``parquet:DIR``  the user's pipeline in Spark, exactly once (``spark/sink.py``)
- ``iceberg:DIR``  one Iceberg table shared by any number of servers, exactly once
                   across lease moves (``iceberg.py``); Spark only with a pipeline
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.config import SinkSpec

if TYPE_CHECKING:
    from ..base.config import Settings
    from ..base.handoff import Sink
    from ..base.deadletters import DeadLetters
    from ..spark.process import SparkProcess


def open_sink(settings: "Settings", *, spark: "SparkProcess | None", dead_letters: "DeadLetters") -> "Sink":
    assert settings.sink
    kind, where = SinkSpec.parse(settings.sink)
    if kind == "file":
        from .file import FileSink

        return FileSink(where)
    if kind == "iceberg":
        from .iceberg import IcebergSink

        return IcebergSink(settings, where, dead_letters, spark=spark)
    from .parquet import SparkSink

    assert spark is not None
    return SparkSink(settings, spark, where, dead_letters)
