"""Sinks: where closed windows go. A sink has two methods::

    class Sink:
        async def start(self) -> Committed: ...      # what its commit log says is done
        async def commit(self, window: "Window") -> None: ...

``window.rows`` are the window's rows in merged order, each one JSON object (bytes);
the first ``window.late`` of them are late rows. ``commit`` is called one window at a
time, in window order, and must be durable when it returns (the coordinator then
marks the rows committed and lets shards checkpoint past them). An exception means
"not committed": the same window is offered again after a backoff. ``start`` runs
once, before any commit: the positions it returns are filtered out of replays.

- ``file:DIR``     JSON lines per window (``file.py``), at least once, no Spark
- ``parquet:DIR``  the user's pipeline in Spark, exactly once (``spark/sink.py``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..config import SinkSpec
from .commitlog import Committed

if TYPE_CHECKING:
    from ..coordinator.windows import Window
    from ..config import Settings
    from ..deadletter import DeadLetters
    from ..spark.process import SparkProcess


class Sink(Protocol):
    async def start(self) -> Committed: ...

    async def commit(self, window: "Window") -> None: ...


def open_sink(settings: "Settings", *, spark: "SparkProcess | None", dead_letters: "DeadLetters") -> Sink:
    assert settings.sink
    kind, where = SinkSpec.parse(settings.sink)
    if kind == "file":
        from .file import FileSink

        return FileSink(where)
    from ..spark.sink import SparkSink

    assert spark is not None
    return SparkSink(settings, spark, where, dead_letters)
