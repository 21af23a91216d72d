"""The coordinator layer: every shard's rows into one ordered stream, windows, and
safe checkpoints. ``ordering``, ``watermarks`` and ``ledger`` are pure; ``spool`` and
``lineage`` do the I/O; ``coordinator`` ties them to the event loop; ``handoff`` is the
contract with the sinks (``Window``, ``Sink``, ``Committed``).

Names are imported on first use, so that a sink (or the Spark process) importing
``handoff`` does not load the coordinator itself."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {"Coordinator": ".coordinator", "Window": ".handoff"}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .handoff import Window


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
