"""The per-shard layer: one ``Worker`` per shard connection (``worker.py``, the driver)
and its policy, one job a module: ``calls`` (the handler), ``batches`` (decoding,
KPL in ``kpl``), ``progress`` (delivered, stored, the clamp), ``downstream`` (nothing,
or the coordinator)."""

from .downstream import CoordinatorLink, NoSink
from .worker import Worker

__all__ = ["CoordinatorLink", "NoSink", "Worker"]
