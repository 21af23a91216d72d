"""Handler processes: users' code out of the server's process (``workers`` setting).

- ``frames.py``: the frames both sides speak, the one module both import.
- ``_b64.c``: a batch's records' data base64-decoded from its line in one native pass,
  in a handler process (``Record.data`` where it was not built).
- ``arena.py``: the shared memory a batch's line crosses in, and its rows come back in.
- ``malloc.py``: large buffers reused while batches flow, given back when they stop.
- ``child.py``: a handler process's main (``python -m mldserver.pool.child``).
- ``heartbeat.py``: ``Heartbeat``, a handler process's loop beat (fast while calls run, slow idle) and its watchdog.
- ``process.py``: the server's side of one handler process: its boundary (spawn, pipes, death).
- ``channel.py``: ``Channel``, the shared memory one process's lines and rows cross in, and its loans.
- ``liveness.py``: ``Liveness``, what is known of one process's life, and whom its death is blamed on.
- ``pool.py``: ``HandlerPool``: assignment, supervision, memory, reload.
- ``calls.py``: ``ProcessCalls``, the ``shard/calls.py`` seam through the pool.
- ``firing.py``: timer callbacks fired in a handler process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..faces import lazy_attributes

__all__ = ["HandlerPool", "ProcessCalls"]

if TYPE_CHECKING:
    from .calls import ProcessCalls
    from .pool import HandlerPool


# Imported when asked for: a handler process (``python -m mldserver.pool.child``) loads
# this package, and none of the server's side.
__getattr__ = lazy_attributes(__name__, {"HandlerPool": ".pool", "ProcessCalls": ".calls"})
