"""mldserver: one asyncio daemon that serves every shard of a KCL MultiLangDaemon.

The handler API (see :mod:`mldserver.api.handler`)::

    import mldserver

    class Orders(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            ...

    class Changes(mldserver.ChangeHandler):     # one callback per record (mldserver.api.changes)
        async def on_update(self, doc, meta): ...
        async def on_delete(self, meta): ...

A stream read from a script, with no server (:mod:`mldserver.sources.stream`)::

    async with mldserver.open_stream("dynamodb:orders", start="trim_horizon") as stream:
        async for change in stream:
            ...
        saved = stream.token

Names are imported lazily so that ``mldserver connect`` (the relay the daemon starts
once per shard) pays for none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .faces import lazy_attributes

__version__ = "0.1.0"

_EXPORTS = {
    "Handler": "mldserver.api.handler",
    "ChangeHandler": "mldserver.api.changes",
    "Meta": "mldserver.api.changes",
    "Record": "mldserver.api.records",
    "Batch": "mldserver.api.records",
    "ShardInfo": "mldserver.api.records",
    "Checkpointer": "mldserver.api.checkpointer",
    "CheckpointError": "mldserver.errors",
    "ConfigError": "mldserver.errors",
    "MldserverError": "mldserver.errors",
    "Context": "mldserver.api.context",
    "Settings": "mldserver.base.config",
    "WindowInfo": "mldserver.spark.pipeline",
    "SparkError": "mldserver.spark.process",
    "TimerError": "mldserver.timers.api",
    "open_stream": "mldserver.sources.stream",
    "Change": "mldserver.sources.stream",
    "StreamRecord": "mldserver.sources.stream",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .api.changes import ChangeHandler, Meta
    from .api.checkpointer import Checkpointer
    from .base.config import Settings
    from .api.context import Context
    from .errors import CheckpointError, ConfigError, MldserverError
    from .api.handler import Handler
    from .api.records import Batch, Record, ShardInfo
    from .spark.pipeline import WindowInfo
    from .spark.process import SparkError
    from .timers.api import TimerError
    from .sources.stream import Change, StreamRecord, open_stream


# ``mldserver.timers``, the module: ``mldserver.timers.create`` / ``.cancel`` in timer callbacks
__getattr__ = lazy_attributes(__name__, _EXPORTS, submodules=("timers",))
