"""The per-shard layer: one ``ShardDriver`` per shard connection and its policy, one job a
module.

- ``driver.py``: the driver, the loop and the dispatch.
- ``calls.py``: calling the handler: time-out, retries with backoff, the outcome.
- ``bisect.py``: a batch that keeps failing split in halves, so one bad record costs one.
- ``batches.py``: the daemon's records decoded, what the handler emitted encoded.
- ``kpl.py``: KPL aggregates decoded as the KCL decodes them.
- ``checkpoints.py``: the checkpoint round trip with the daemon, and the checkpointers
  handed to a handler (``api/checkpointer.py``).
- ``progress.py``: what was delivered, what is stored, so where a checkpoint may go.
- ``slots.py``: the wire of one connection and the in-flight slots all shards share.
- ``pieces.py``: a stream reader that hands out the transport's pieces, not copies (the
  shard connections', and the handler processes' pipes).
- ``pausing.py``: the pause gate every driver passes (``POST /pause``, ``/resume``).
- ``downstream.py``: what follows a batch: nothing, the coordinator, or a redrive.
- ``status.py``: what ``/status`` and the metrics read of a shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..faces import lazy_attributes

__all__ = ["CoordinatorLink", "NoSink", "RedriveLink", "ShardDriver"]

if TYPE_CHECKING:
    from .downstream import CoordinatorLink, NoSink, RedriveLink
    from .driver import ShardDriver


# Imported when asked for: a handler process uses ``shard.calls`` alone.
__getattr__ = lazy_attributes(__name__, {"CoordinatorLink": ".downstream", "NoSink": ".downstream", "RedriveLink": ".downstream",
                              "ShardDriver": ".driver"})
