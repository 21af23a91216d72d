"""Handler processes: users' code out of the server's process (``workers`` setting).

``frames`` (what both sides speak), ``child`` (the handler process), ``process`` (the
server's side of one), ``pool`` (``HandlerPool``: assignment, supervision, memory,
reload) and ``calls`` (``ProcessCalls``: the shard/calls.py seam through the pool).
"""

from .calls import ProcessCalls
from .pool import HandlerPool

__all__ = ["HandlerPool", "ProcessCalls"]
