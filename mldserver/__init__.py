"""mldserver: one asyncio daemon that serves every shard of a KCL MultiLangDaemon.

The handler API (see :mod:`mldserver.handler`)::

    import mldserver

    class Orders(mldserver.Handler):
        async def process_records(self, batch, checkpointer):
            ...

    class Changes(mldserver.ChangeHandler):     # one callback per record (mldserver.changes)
        async def on_update(self, doc, meta): ...
        async def on_delete(self, meta): ...

Names are imported lazily so that ``mldserver connect`` (the relay the daemon starts
once per shard) pays for none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Handler": "mldserver.handler",
    "ChangeHandler": "mldserver.changes",
    "Meta": "mldserver.changes",
    "Record": "mldserver.records",
    "Batch": "mldserver.records",
    "ShardInfo": "mldserver.records",
    "Checkpointer": "mldserver.checkpointer",
    "CheckpointError": "mldserver.errors",
    "ConfigError": "mldserver.errors",
    "MldserverError": "mldserver.errors",
    "Context": "mldserver.context",
    "Settings": "mldserver.config",
    "WindowInfo": "mldserver.spark.pipeline",
    "SparkError": "mldserver.spark.process",
    "TimerError": "mldserver.timers.api",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .changes import ChangeHandler, Meta
    from .checkpointer import Checkpointer
    from .config import Settings
    from .context import Context
    from .errors import CheckpointError, ConfigError, MldserverError
    from .handler import Handler
    from .records import Batch, Record, ShardInfo
    from .spark.pipeline import WindowInfo
    from .spark.process import SparkError
    from .timers.api import TimerError


def __getattr__(name: str) -> Any:
    if name == "timers":  # the module: mldserver.timers.create / .cancel in timer callbacks
        return importlib.import_module("mldserver.timers")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mldserver' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
