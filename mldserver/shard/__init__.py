"""The per-shard layer: one ``Worker`` per shard connection (``worker.py``, the driver)
and its policy, one job a module: ``calls`` (the handler), ``batches`` (decoding,
KPL in ``kpl``), ``progress`` (delivered, stored, the clamp), ``downstream`` (nothing,
or the coordinator)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["CoordinatorLink", "NoSink", "Worker"]

if TYPE_CHECKING:
    from .downstream import CoordinatorLink, NoSink
    from .worker import Worker


def __getattr__(name: str) -> Any:
    """Imported when asked for: a handler process uses ``shard.calls`` alone."""
    module = {"CoordinatorLink": ".downstream", "NoSink": ".downstream", "Worker": ".worker"}.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
