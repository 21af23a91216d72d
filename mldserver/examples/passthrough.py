"""Passthrough: one row per record, with everything the record carries.

    mldserver serve --handler mldserver.examples.passthrough:Passthrough --sink file:./out --window 60

Each row (the record's data stays base64, exactly as the daemon sent it)::

    {"shard_id":"shardId-000000000001","sequence_number":"4959...","sub_sequence_number":0,
     "partition_key":"cust-7","approximate_arrival_timestamp":1763719200123,
     "data":"bWVvdw=="}

Its event time is the record's arrival time. Checkpoints are the server's: a shard
checkpoints what the sink has committed.
"""

from __future__ import annotations

import binascii

import mldserver


class Passthrough(mldserver.Handler):
    async def initialize(self, shard):
        self.shard_id = shard.shard_id

    async def process_records(self, batch, checkpointer):
        shard_id = self.shard_id
        emit = batch.emit
        for record in batch.records:
            data = record.raw_data
            if data is None:  # a user record de-aggregated from a KPL aggregate
                data = binascii.b2a_base64(record.data, newline=False).decode("ascii")
            emit(
                record,
                {
                    "shard_id": shard_id,
                    "sequence_number": record.sequence_number,
                    "sub_sequence_number": record.sub_sequence_number,
                    "partition_key": record.partition_key,
                    "approximate_arrival_timestamp": record.approximate_arrival_timestamp,
                    "data": data,
                },
            )
