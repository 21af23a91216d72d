"""The coordinator: per-shard queues merged into one ordered stream, cut into event-time
windows, handed to a sink; the ledger says how far each shard may checkpoint. The
window/sink/commit contract lives in ``base/handoff.py`` (``Window``, ``Sink``,
``Committed``).

- ``coordinator.py``: the facade the shard drivers call (a pass, ``step()``, ``status()``).
- ``ordering.py``: every shard's rows into one plausible total order, cut into windows (pure).
- ``windows.py``: which tumbling window a time falls in, and what a closed one holds.
- ``panes.py``: hopping windows made of the tumbling panes ``ordering`` closes.
- ``sessions.py``: per-key session windows made of those panes.
- ``amends.py``: windows kept open to late rows for ``allowed_lateness`` after they close.
- ``watermarks.py``: how far in event time each shard has certainly got, and their minimum.
- ``merge.py``: a closed window's rows put in the merge key's order, as the sink gets them.
- ``_gather.c``: those rows copied into merged order in one native pass (pyarrow's take
  where it was not built).
- ``ledger.py``: which of a shard's rows are committed, so how far it may checkpoint.
- ``pressure.py``: which shard waits before its status, and why (pure).
- ``shards.py``: what the coordinator itself keeps of each shard it serves.
- ``committer.py``: the sealed windows committed to the sink one at a time, retried.
- ``spill.py``: rows past ``max_buffered_bytes`` kept in files rather than memory.
- ``spool.py``: an ended shard's uncommitted rows, kept on disk until they commit.
- ``lineage.py``: which shards are a shard's parents, after a split or a merge.
"""

from .coordinator import Coordinator
from ..base.handoff import Window

__all__ = ["Coordinator", "Window"]
