"""What a processor is handed is amazon_kclpy's: a ``Record`` that reads as the one
amazon_kclpy builds from the same JSON, and a ``kcl.Checkpointer`` of one round trip
that raises ``kcl.CheckpointError`` with the daemon's error name."""

from __future__ import annotations

import base64
import json

import orjson
import pytest
from amazon_kclpy import dispatch, kcl, messages

from mldserver.api.kclpy.inputs import Checkpointer, Record, records_of
from mldserver.api.kclpy.thread import ShardThread
from mldserver.api.records import Batch, Record as MldRecord, ShardInfo
from mldserver.base.logs import get_logger
from mldserver.errors import CheckpointError
from mldserver.pool.frames import records_from

RECORDS = [
    {"action": "record", "data": base64.b64encode(b"\x00\xffmeow\n").decode(), "partitionKey": "cat\u2028\u00e9",
     "sequenceNumber": "49590338271490256608559692538361571095921575989136588898", "subSequenceNumber": 0,
     "approximateArrivalTimestamp": 1476889707123},
    {"action": "record", "data": "", "partitionKey": "k", "sequenceNumber": "7", "subSequenceNumber": 3,
     "approximateArrivalTimestamp": 0},
]
FIELDS = ("binary_data", "data", "sequence_number", "sub_sequence_number", "partition_key", "timestamp_millis",
          "approximate_arrival_timestamp")
LINE = orjson.dumps({"action": "processRecords", "records": RECORDS, "millisBehindLatest": 5}) + b"\n"
SHARD = ShardInfo("shardId-1", "TRIM_HORIZON", 0)


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("i", range(len(RECORDS)))
def test_a_record_reads_as_amazon_kclpys_own_made_from_the_same_json(i, lazy):
    raw = RECORDS[i]
    theirs = json.loads(json.dumps(raw), object_hook=dispatch.message_decode)  # as KCLProcess decodes it
    server = records_from(LINE, True)[i] if lazy else MldRecord(dict(raw))  # (a handler process's, or the loop's)
    (ours,) = records_of(Batch([server], 0, SHARD))
    assert type(theirs) is messages.Record and isinstance(ours, messages.Record)
    assert [getattr(ours, f) for f in FIELDS] == [getattr(theirs, f) for f in FIELDS]
    for key in raw:  # v1 processors read records as dicts
        assert ours[key] == theirs[key] and ours.get(key) == theirs.get(key)
    with pytest.raises(KeyError):
        ours["nope"]


def test_a_de_aggregated_records_data_is_its_own():
    (record,) = records_of(Batch([MldRecord({**RECORDS[0], "data": None}, data=b"user record")], 0, SHARD))
    assert record.binary_data == b"user record" and record["data"] == base64.b64encode(b"user record").decode()


class Daemon:
    """The server's checkpointer as the bridge sees it: answers in turn, each call noted."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.calls = []

    async def checkpoint(self, sequence_number=None, sub_sequence_number=None, *, retry=True):
        self.calls.append((sequence_number, sub_sequence_number, retry))
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise CheckpointError(error, sequence_number, sub_sequence_number)


async def test_the_checkpointer_is_synchronous_one_round_trip_and_raises_kclpys_error_with_the_daemons_name():
    thread = ShardThread("shardId-1", get_logger("t"))
    checkpointer = Checkpointer(thread)
    assert isinstance(checkpointer, kcl.Checkpointer)
    daemon = Daemon("ThrottlingException", None, "ShutdownException")

    def retrying():  # the sample's loop, shortened
        errors = []
        for _ in range(3):
            try:
                checkpointer.checkpoint("42", 0)
                return errors
            except kcl.CheckpointError as exc:
                errors.append(exc.value)
        return errors

    checkpointer.bind(daemon)
    assert await thread.run(retrying) == ["ThrottlingException"]
    with pytest.raises(kcl.CheckpointError) as caught:
        await thread.run(checkpointer.checkpoint)
    assert caught.value.value == "ShutdownException" and str(caught.value) == "'ShutdownException'"
    assert daemon.calls == [("42", 0, False), ("42", 0, False), (None, None, False)]  # never retried inside
    checkpointer.bind(None)  # between actions
    with pytest.raises(kcl.CheckpointError) as caught:
        await thread.run(checkpointer.checkpoint)
    assert caught.value.value == "InvalidStateException"
    thread.close()
