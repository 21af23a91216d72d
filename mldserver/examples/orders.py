"""Orders per customer per window, from a DynamoDB stream of an orders table: the
worked example ``mldserver demo`` runs, shipped with the package::

    mldserver serve --handler mldserver.examples.orders:Orders \
        --pipeline mldserver.examples.orders:per_customer --window 60

The handler turns each change record (the DynamoDB Streams record the KCL adapter
delivers, with a NEW_IMAGE or NEW_AND_OLD_IMAGES view; the adapter writes
``ApproximateCreationDateTime`` in epoch milliseconds, the Streams API and Lambda in
seconds: both are read) into one row::

    {"eventName": "INSERT", "eventSource": "aws:dynamodb", "dynamodb": {"ApproximateCreationDateTime": 1763719200500,
     "NewImage": {"order_id": {"S": "o-17"}, "customer": {"S": "c-7"}, "amount": {"N": "12.50"}}}}
    -> {"order_id": "o-17", "customer": "c-7", "amount": 12.5}     event time 1763719200500

It decodes DynamoDB JSON by hand; ``mldserver.ChangeHandler`` does that for you, one
``on_update(doc, meta)`` per record (see ``mldserver.api.changes``).

Deletes (no new image) and records that are not such JSON emit nothing: the record
counts as done, and the log says why. The pipeline runs in Spark on every closed
window and writes one row per customer::

    customer  orders  amount  window_start   window_end
    c-7       3       41.0    1763719200000  1763719260000
"""

from __future__ import annotations

import orjson

import mldserver


class Orders(mldserver.Handler):
    async def initialize(self, shard):
        self.shard_id = shard.shard_id
        self.skipped = 0

    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            try:
                change = orjson.loads(record.data)
                image = change["dynamodb"].get("NewImage")
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                self.skipped += 1
                continue
            if not image:
                continue  # a delete
            created = change["dynamodb"].get("ApproximateCreationDateTime")
            batch.emit(
                record,
                {
                    "order_id": image["order_id"]["S"],
                    "customer": image["customer"]["S"],
                    "amount": float(image["amount"]["N"]),
                },
                event_time_ms=None if created is None else int(created if created >= 1e11 else created * 1000),
            )
        if self.skipped:
            self.context.log.warning("records_skipped", shard_id=self.shard_id, records=self.skipped, reason="not a change record")
            self.skipped = 0


def per_customer(df, window):
    """One row per customer: in Spark SQL, bound by Spark (no pyspark import needed)."""
    return df.sparkSession.sql(
        "SELECT customer, count(*) AS orders, round(sum(amount), 2) AS amount,"
        " :start AS window_start, :end AS window_end FROM {rows} GROUP BY customer",
        args={"start": window.start, "end": window.end},
        rows=df,
    )


def change_record(order_id: int, customer: int, amount: float, created_ms: int) -> bytes:
    """A DynamoDB Streams INSERT record, as the KCL adapter delivers it: the demo's data."""
    return orjson.dumps(
        {
            "eventName": "INSERT",
            "eventSource": "aws:dynamodb",
            "dynamodb": {
                "ApproximateCreationDateTime": created_ms,
                "NewImage": {
                    "order_id": {"S": f"o-{order_id}"},
                    "customer": {"S": f"c-{customer}"},
                    "amount": {"N": f"{amount:.2f}"},
                },
                "StreamViewType": "NEW_IMAGE",
            },
        }
    )
