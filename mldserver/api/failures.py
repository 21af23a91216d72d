"""Per-record failures: what ``batch.fail(record, error)`` (and a ``ChangeHandler``
whose callback keeps raising for one record) leads to, on both sides of the
handler-call seam.

A failed record is dead-lettered by the server with its data and the error, before
the batch's status, and the batch goes on; the shard then counts it as done. Until
the server has written that dead letter, no checkpoint may pass it: the checkpointer
a ``process_records`` call is given is wrapped in a ``FailureGuard``, which holds a
checkpoint short of the batch's first failed record::

    records 100, 101, 102, 103; batch.fail(record 102, ...)
    await checkpointer.checkpoint()              -> stores 101/0 (not 103)
    await checkpointer.checkpoint("103", 0)      -> stores 101/0
    await checkpointer.checkpoint("100", 0)      -> stores 100/0 (before the failure)
    batch.fail(record 100, ...): checkpoint()    -> nothing is sent

Across the process boundary only indexes travel: the child's ``done`` frame carries
``"failed": [[index, error, attempts], ...]`` (``Batch.settle_failures``), the index
into the batch's records as the server sent them, and the server, which holds those
records, writes their dead letters (``DeadLetters.failed_records``). With
``--workers 0`` the same list comes back in the call's ``Outcome``.
"""

from __future__ import annotations

from typing import Any

from ..base.positions import Position
from .records import Batch



class FailureGuard:
    """A ``process_records`` call's checkpointer: the real one (the server's, or a
    handler process's proxy), held short of ``batch``'s first failed record."""

    __slots__ = ("_checkpointer", "_batch")

    def __init__(self, checkpointer: Any, batch: Batch) -> None:
        self._checkpointer = checkpointer
        self._batch = batch

    async def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int | None = None, *,
                         retry: bool = True) -> None:
        if self._batch.failed:
            held = held_at(self._batch, sequence_number, sub_sequence_number)
            if held is None:
                return  # nothing before the first failed record is new in this batch
            sequence_number, sub_sequence_number = held
        await self._checkpointer.checkpoint(sequence_number, sub_sequence_number, retry=retry)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._checkpointer, name)


def held_at(batch: Batch, sequence_number: Any, sub_sequence_number: Any) -> tuple[Any, Any] | None:
    """The checkpoint to send instead of ``(sequence_number, sub_sequence_number)``
    while ``batch`` has failed records: unchanged if it is before the first failed
    record, else the record before that one (None: there is none in the batch)."""
    assert batch.failed
    first = min(batch.failed)
    records = batch.records
    before = records[first - 1] if first > 0 else None
    wanted = None
    if sequence_number is not None and isinstance(sequence_number, (str, int)):
        wanted = Position.parse(str(sequence_number), sub_sequence_number or 0)
    if wanted is not None:
        limit = _position(records[first])
        if limit is not None:  # strictly before the failed record (all of a sequence number, without a sub)
            if sub_sequence_number is None and wanted.seq < limit.seq:
                return sequence_number, sub_sequence_number
            if sub_sequence_number is not None and (wanted.seq, wanted.sub) < (limit.seq, limit.sub):
                return sequence_number, sub_sequence_number
        else:  # no position to compare with: at most the record before it
            last = _position(before) if before is not None else None
            if last is not None and sub_sequence_number is not None and (wanted.seq, wanted.sub) <= last[:2]:
                return sequence_number, sub_sequence_number
    if before is None:
        return None
    return before.sequence_number, before.sub_sequence_number or 0


def _position(record: Any) -> Position | None:
    try:
        return record.position
    except ValueError:  # a record without a valid sequence number
        return None
