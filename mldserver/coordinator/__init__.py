"""The coordinator: per-shard queues merged into one ordered stream, cut into event-time
windows, handed to a sink; the ledger says how far each shard may checkpoint. The
window/sink/commit contract lives in ``handoff`` (``Window``, ``Sink``, ``Committed``)."""

from .coordinator import Coordinator
from ..base.handoff import Window

__all__ = ["Coordinator", "Window"]
