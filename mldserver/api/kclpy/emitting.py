"""``emit`` for an amazon_kclpy processor: the two-line change that gives it windows.

A processor has no API to pass rows downstream; this is it. Inside ``process_records``
(in the shard's thread), ``emit`` hands a row to the batch under way, attributed to the
record it came from, exactly as ``batch.emit`` does for an mldserver handler::

    from mldserver.api.kclpy import emit                     # 1

    class RecordProcessor(processor.RecordProcessorBase):
        def process_records(self, process_records_input):
            for record in process_records_input.records:
                emit(record, {"key": record.partition_key, "size": len(record.binary_data)})   # 2

With ``--sink`` (and ``--window``) the rows are merged across shards into windows and
the shard checkpoints only what the sink committed; without one they are dropped, said
at start-up. Called anywhere else (another thread, outside ``process_records``) it
raises ``RuntimeError``; a record not of the batch under way raises ``ValueError``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

from ..records import Batch, Record

_local = threading.local()  # .current: (batch, its records as the processor sees them, id -> index)


@contextlib.contextmanager
def batch(batch: Batch, records: Sequence[Any]) -> Iterator[None]:
    """Rows emitted in the block go to ``batch``; ``records`` are its records as handed out."""
    _local.current = [batch, records, None]
    try:
        yield
    finally:
        _local.current = None


def emit(record: Any, row: dict[str, Any], event_time_ms: int | None = None) -> None:
    """Pass ``row`` downstream, attributed to ``record`` (one of the records of the batch
    under way); its event time ``event_time_ms``, else the record's arrival time."""
    current = getattr(_local, "current", None)
    if current is None:
        raise RuntimeError("emit(record, row) is for an amazon_kclpy processor's process_records, in the thread "
                           "mldserver calls it in; a mldserver.Handler uses batch.emit")
    batch, records, index = current
    if index is None:
        index = current[2] = {id(r): i for i, r in enumerate(records)}
        if not batch.records:  # read from the line: the server's records for the rows, made now
            batch.records = [Record(r._json_dict) for r in records]
    i = index.get(id(record))
    if i is None:
        raise ValueError(f"emit({record!r:.200}, ...): not a record of the batch under way; pass one of "
                         f"process_records_input.records")
    batch.emit(batch.records[i], row, event_time_ms)
