"""The quick start's handler (docs/quickstart.md): one row per order on a Kinesis stream
of JSON orders, its event time the record's arrival time::

    mldserver run --properties local.properties --handler mldserver.examples.quickstart:Orders \
        --sink file:./windows --window 10

    {"order_id": "o-17", "customer": "c-3", "amount": 27.0}  ->  {"customer": "c-3", "amount": 27.0}

``mldserver local --put N`` puts such orders on its stream (``order``).
"""

from __future__ import annotations

import orjson

import mldserver


def order(i: int) -> bytes:
    """The ``i``-th example order: seven customers, amounts 10 to 59."""
    return orjson.dumps({"order_id": f"o-{i}", "customer": f"c-{i % 7}", "amount": float(10 + i % 50)})


class Orders(mldserver.Handler):
    async def initialize(self, shard):              # shard.shard_id, .sequence_number
        self.shard_id = shard.shard_id

    async def process_records(self, batch, checkpointer):
        for record in batch.records:                 # record.data (bytes), .partition_key,
            order = orjson.loads(record.data)        # .sequence_number, .sub_sequence_number
            batch.emit(record, {"customer": order["customer"], "amount": order["amount"]})
