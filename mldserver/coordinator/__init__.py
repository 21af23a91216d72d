"""The coordinator layer: every shard's rows into one ordered stream, windows, and
safe checkpoints. ``ordering``, ``watermarks``, ``ledger`` and ``windows`` are pure;
``spool`` and ``lineage`` do the I/O; ``coordinator`` ties them to the event loop."""

from .coordinator import Coordinator
from .windows import Window

__all__ = ["Coordinator", "Window"]
