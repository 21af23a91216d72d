"""Handler processes: users' code out of the server's process (``workers`` setting).

``frames`` (what both sides speak), ``child`` (the handler process), ``process`` (the
server's side of one), ``pool`` (``HandlerPool``: assignment, supervision, memory,
reload) and ``calls`` (``ProcessCalls``: the shard/calls.py seam through the pool).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["HandlerPool", "ProcessCalls"]

if TYPE_CHECKING:
    from .calls import ProcessCalls
    from .pool import HandlerPool


def __getattr__(name: str) -> Any:
    """Imported when asked for: a handler process (``python -m mldserver.pool.child``)
    loads this package, and none of the server's side."""
    module = {"HandlerPool": ".pool", "ProcessCalls": ".calls"}.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
