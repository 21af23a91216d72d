"""A shard's progress on one connection: what was delivered, what is stored, and so
where a checkpoint may go. Pure: no I/O, no clock.

Every position is a :class:`~mldserver.base.positions.Position`::

    progress = ShardProgress()
    progress.initialized(Position.parse("7", 0))    # the lease's checkpoint (None: TRIM_HORIZON...)
    progress.batch(records)                         # 8/0, 9/0, 9/1, 9/2 delivered
    progress.default_sub("9")                       # 2: checkpoint("9") means all of 9
    progress.clamp(None, safe=Position(9, 1, "9"))  # Position(9, 1, "9"): no further than safe
    progress.clamp(Position(8, 0, "8"), safe=Position(9, 1, "9"))   # Position(8, 0, "8")
    progress.checkpointed(Position(9, 1, "9"))      # the daemon stored it
    progress.clamp(None, safe=Position(9, 1, "9"))  # None: nothing new to store
    progress.batch_done()                           # an idle shard keeps no batch

``clamp`` is the rule for a shard whose rows go to a sink (invariant 3): a checkpoint
goes no further than what the sink committed (``safe``), nor than this connection
delivered, nor than the handler asked; and none is sent that is not past the stored one.
"""

from __future__ import annotations

from typing import Sequence

from ..base.positions import Position
from ..api.records import Record


class ShardProgress:
    __slots__ = ("delivered", "stored", "latest")

    def __init__(self) -> None:
        self.delivered: Position | None = None  # the last record delivered on this connection
        self.stored: Position | None = None  # the lease's checkpoint, as far as we know
        self.latest: Sequence[Record] = ()  # the batch being processed, for default sub-sequences

    def initialized(self, checkpoint: Position | None) -> None:
        self.stored = checkpoint

    def batch(self, records: Sequence[Record]) -> None:
        """A batch is being processed; its last record's position is parsed (the
        decoder made sure it has one)."""
        self.latest = records
        if records:
            self.delivered = records[-1].position

    def batch_done(self) -> None:
        self.latest = ()

    def checkpointed(self, position: Position) -> None:
        self.stored = position

    def default_sub(self, sequence_number: str) -> int:
        """The sub-sequence for ``checkpoint(seq)``: the last one delivered under
        ``seq`` in the latest batch (records come in order: the last is the highest)."""
        for record in reversed(self.latest):
            if record.sequence_number == sequence_number:
                return record.sub_sequence_number or 0
        return 0

    def clamp(self, wanted: Position | None, safe: Position | None) -> Position | None:
        """The checkpoint to send instead of ``wanted`` (None: everything): no further
        than ``safe`` nor than delivered; None if that is not past the stored one."""
        if safe is None or self.delivered is None:
            return None
        if self.delivered < safe:
            safe = self.delivered
        if wanted is not None and wanted < safe:
            safe = wanted
        if self.stored is not None and safe <= self.stored:
            return None
        return safe
