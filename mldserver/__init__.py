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

import importlib
import importlib.machinery
import sys
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name == "timers":  # the module: mldserver.timers.create / .cancel in timer callbacks
        return importlib.import_module("mldserver.timers")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mldserver' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


# Modules that moved into the folders keep their old names (``mldserver.records``,
# ``mldserver.testing``, ...): importing one gives the module itself, not a copy.
_MOVED = {
    "mldserver.records": "mldserver.api.records",
    "mldserver.testing": "mldserver.api.testing",
    "mldserver.dynamodb_json": "mldserver.api.dynamodb_json",
    "mldserver.handler": "mldserver.api.handler",
    "mldserver.changes": "mldserver.api.changes",
    "mldserver.context": "mldserver.api.context",
    "mldserver.checkpointer": "mldserver.api.checkpointer",
    "mldserver.config": "mldserver.base.config",
    "mldserver.bindings": "mldserver.api.bindings",
}


class _MovedModules:
    """``import mldserver.records`` finds ``mldserver.api.records``: the loader puts
    the real module in ``sys.modules`` under the old name, which the import returns."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        sys.modules[module.__name__] = importlib.import_module(_MOVED[module.__name__])


sys.meta_path.append(_MovedModules())
