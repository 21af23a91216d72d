"""Handler processes: users' code out of the server's process (``workers`` setting).

- ``frames.py``: the frames both sides speak, the one module both import.
- ``_b64.c``: a batch's records' data base64-decoded from its line in one native pass,
  in a handler process (``Record.data`` where it was not built).
- ``arena.py``: the shared memory a batch's line crosses in, and its rows come back in.
- ``child.py``: a handler process's main (``python -m mldserver.pool.child``).
- ``process.py``: the server's side of one handler process.
- ``pool.py``: ``HandlerPool``: assignment, supervision, memory, reload.
- ``calls.py``: ``ProcessCalls``, the ``shard/calls.py`` seam through the pool.
- ``firing.py``: timer callbacks fired in a handler process.
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
