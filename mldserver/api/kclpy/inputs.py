"""What an amazon_kclpy processor is handed, in amazon_kclpy's own types: its
``messages`` inputs (``InitializeInput``, ``ProcessRecordsInput``, ...), records that
are ``messages.Record``s, and a checkpointer that is a ``kcl.Checkpointer``::

    records = records_of(batch)                 # [amazon_kclpy.messages.Record, ...]
    records[0].binary_data == b"meow"; records[0].data == "bWVvdw=="
    records[0].sequence_number == "4959...8898"; records[0].sub_sequence_number == 0
    records[0].approximate_arrival_timestamp    # datetime.fromtimestamp(ms / 1000.0), as amazon_kclpy
    records[0]["partitionKey"] == records[0].get("partitionKey") == "cat"   # v1's dict-style reads

    checkpointer = Checkpointer(thread)         # one per shard, as KCLProcess has one per process
    checkpointer.bind(action_checkpointer)      # the action under way's (None between actions)
    checkpointer.checkpoint("4959...8898", 0)   # synchronous, one round trip with the daemon;
                                                # kcl.CheckpointError("ThrottlingException") as amazon_kclpy

A record reads its fields from the daemon's JSON object when asked (amazon_kclpy's
``Record.__init__`` reads them all and builds the datetime at once): the same values,
built only for the fields the processor reads. In a handler process the batch's line
is parsed (orjson) in the shard's thread when its turn comes, never in the loop, and
the server's record objects are made only if the processor emits. ``binary_data`` is
decoded with SIMD (``records.decode_data``): the bytes ``base64.b64decode`` gives.

The checkpointer asks the daemon once per call, as amazon_kclpy's does: a
``ThrottlingException`` is raised to the processor (whose own loop sleeps and tries
again), not retried inside. Its sequence number is checked by the server's
checkpointer: clamped to what a sink committed, refused past what was delivered.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from amazon_kclpy import kcl, messages

from ...errors import CheckpointError
from ..records import Batch, Record as MldRecord, decode_data

if TYPE_CHECKING:
    from .thread import ShardThread


class Record(messages.Record):
    """amazon_kclpy's ``messages.Record`` over the daemon's JSON object for it (amazon_kclpy's
    own ``_json_dict``, whose ``get`` and ``[]`` it keeps), each field read when asked."""

    def __init__(self, json_dict: dict[str, Any]) -> None:  # noqa: super().__init__ reads every field: not here
        self._json_dict = json_dict

    @property
    def binary_data(self) -> bytes:
        return decode_data(self._json_dict["data"])

    @property
    def data(self) -> str:
        return self._json_dict["data"]

    @property
    def sequence_number(self) -> str:
        return self._json_dict["sequenceNumber"]

    @property
    def sub_sequence_number(self) -> int:
        return self._json_dict["subSequenceNumber"]

    @property
    def partition_key(self) -> str:
        return self._json_dict["partitionKey"]

    @property
    def timestamp_millis(self) -> int:
        return int(self._json_dict["approximateArrivalTimestamp"])

    @property
    def approximate_arrival_timestamp(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_millis / 1000.0)

    def __repr__(self) -> str:
        d = self._json_dict
        return (f"Record(sequence_number={d.get('sequenceNumber')!r}, sub_sequence_number="
                f"{d.get('subSequenceNumber')!r}, partition_key={d.get('partitionKey')!r})")


def records_of(batch: Batch) -> list[Record]:
    """The batch's records as amazon_kclpy's. A batch handed over as its line alone
    (``batch.line`` and no ``records``: a handler process, ``KclpyHandler.parses_line``)
    is parsed here, in the shard's thread; its ``records`` are made only if the
    processor emits (``emitting.py``)."""
    if not batch.records and batch.line is not None:
        try:
            dicts = orjson.loads(batch.line)["records"]
        except orjson.JSONDecodeError:  # not UTF-8: read tolerantly, as the protocol core reads it
            dicts = orjson.loads(bytes(batch.line).decode("utf-8", "replace"))["records"]
        return list(map(Record, dicts))
    return [Record(_json(r)) for r in batch.records]


def _json(record: MldRecord) -> dict[str, Any]:
    """The record's JSON object as a dict, with its data (a de-aggregated record's own, base64)."""
    raw = record.raw
    if type(raw) is dict and raw.get("data") is not None:
        return raw
    return record.to_json()


class Checkpointer(kcl.Checkpointer):
    """amazon_kclpy's checkpointer, bridged to the action under way's (asynchronous)
    checkpointer in the handler process's loop. One per shard: kept by a processor and
    used in a later action, it checkpoints in that action, as under KCLProcess; used
    between actions, it raises ``CheckpointError("InvalidStateException")``."""

    def __init__(self, thread: "ShardThread") -> None:  # noqa: no io_handler: the daemon is not on stdin here
        self._thread = thread
        self._current: Any = None

    def bind(self, checkpointer: Any) -> None:
        self._current = checkpointer

    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int | None = None) -> None:
        current = self._current
        if current is None:
            raise kcl.CheckpointError("InvalidStateException")
        try:
            self._thread.call_soon(current.checkpoint(sequence_number, sub_sequence_number, retry=False))
        except CheckpointError as exc:
            raise kcl.CheckpointError(exc.error) from None
