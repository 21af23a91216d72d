"""The coordinator: per-shard queues merged into one ordered stream, cut into event-time
windows, handed to a sink; the ledger says how far each shard may checkpoint.
``coordinator.py`` is the facade the shard drivers call; ``pressure`` decides who waits,
``committer`` commits, ``ordering``/``watermarks``/``windows`` decide what closes. The
window/sink/commit contract lives in ``base.handoff`` (``Window``, ``Sink``, ``Committed``)."""

from .coordinator import Coordinator
from ..base.handoff import Window

__all__ = ["Coordinator", "Window"]
