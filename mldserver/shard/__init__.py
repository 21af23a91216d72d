"""The per-shard layer: one ``ShardDriver`` per shard connection (``driver.py``: the
loop and the dispatch) and its policy, one job a module: ``calls`` (the handler),
``batches`` (decoding, KPL in ``kpl``), ``checkpoints`` (the round trip with the
daemon, and the checkpointer a handler is given, ``api/checkpointer.py``; ``progress``,
delivered, stored, the clamp), ``slots`` (the wire and the in-flight slots), ``downstream`` (nothing, the
coordinator, or the coordinator for a redrive), ``status`` (what ``/status`` reads)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["CoordinatorLink", "NoSink", "RedriveLink", "ShardDriver"]

if TYPE_CHECKING:
    from .downstream import CoordinatorLink, NoSink, RedriveLink
    from .driver import ShardDriver


def __getattr__(name: str) -> Any:
    """Imported when asked for: a handler process uses ``shard.calls`` alone."""
    module = {"CoordinatorLink": ".downstream", "NoSink": ".downstream", "RedriveLink": ".downstream",
              "ShardDriver": ".driver"}.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
