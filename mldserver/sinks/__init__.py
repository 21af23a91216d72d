"""Sinks: where closed windows go. Each implements the ``Sink`` protocol of
``base/handoff.py`` (``start() -> Committed``, ``commit(window)``); ``open_sink`` opens
the one ``--sink`` names (``file:DIR``, ``parquet:DIR``, ``iceberg:DIR``).

- ``file.py``: ``file:DIR``, JSON lines per window, at least once, no Spark.
- ``parquet.py``: ``parquet:DIR``, the user's pipeline in the Spark process, exactly once.
- ``iceberg.py``: ``iceberg:DIR``, one Iceberg table shared by any number of servers,
  exactly once across lease moves (Spark only with a pipeline).
- ``maintenance.py``: the Iceberg table's old snapshots expired, orphan files removed.
- ``schema.py``: a window's rows into one Arrow table, the schema declared or inferred.
- ``ahead.py``: those tables made a batch at a time as the rows arrive (the Spark and
  Iceberg sinks, ``ArrivingSink``), put in merged order when the window closes.
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
