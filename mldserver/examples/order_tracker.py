"""Live orders on a DynamoDB orders table (Couchbase Eventing's kind of function): a
per-customer document kept up to date in another table through a binding, and orders
left unpaid for ``EXPIRE_AFTER_S`` (30 minutes) marked expired by a timer, which is
cancelled when the order is paid::

    # tracker.toml
    handler = "handlers.order_tracker:OrderTracker"
    stream = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/..."

    [bindings.customers]
    table = "customers"          # key: customer (S)
    access = "read_write"

    [bindings.orders]
    table = "orders"             # key: order_id (S); the stream's own table
    access = "read_write"
    allow_recursion = true       # the expiry writes status = "expired": a change this handler ignores

An order is ``{"order_id": "o-1", "customer": "c-7", "amount": Decimal("12.50"),
"status": "new"}``; the stream's view is ``NEW_AND_OLD_IMAGES`` (a change to
``"paid"`` is told from the old image). Per customer, ``customers`` holds::

    {"customer": "c-7", "orders": 3, "total": Decimal("41.50"), "paid": 2,
     "paid_total": Decimal("29.00"), "expired": 1, "last_order": "o-3"}

- INSERT: ``orders`` + 1, ``total`` + amount, ``last_order``; unless already paid, a
  timer ``expire`` at creation + ``EXPIRE_AFTER_S``, named by the order id;
- a change to ``"paid"``: ``paid`` + 1, ``paid_total`` + amount, the timer cancelled;
- a change to ``"expired"`` (the timer's own write): ``expired`` + 1.

Counts are ADDs: a record retried after its write (at-least-once delivery) counts
twice. The expiry reads the order first and leaves a paid one alone.
"""

from __future__ import annotations

import time

import mldserver
from mldserver import timers
from mldserver.api import bindings

EXPIRE_AFTER_S = 30 * 60


async def expire(context):
    """The timer: the order unpaid after ``EXPIRE_AFTER_S`` is marked expired."""
    orders = bindings.table("orders")
    order = await orders.get({"order_id": context["order_id"]}, consistent=True)
    if order is not None and order.get("status") not in ("paid", "expired"):
        await orders.update({"order_id": context["order_id"]}, set={"status": "expired"})


class OrderTracker(mldserver.ChangeHandler):
    expire_after_s = EXPIRE_AFTER_S

    async def on_update(self, doc, meta):
        if doc is None:
            return  # a stream without new images
        customers = self.context.table("customers")
        key = {"customer": doc["customer"]}
        status, was = doc.get("status"), (meta.old or {}).get("status")
        if meta.event_name == "INSERT":
            await customers.update(key, add={"orders": 1, "total": doc["amount"]}, set={"last_order": doc["order_id"]})
            if status not in ("paid", "expired"):
                at = (meta.creation_time_ms or time.time() * 1000) / 1000 + self.expire_after_s
                await self.timers.create(expire, at, doc["order_id"], {"order_id": doc["order_id"]})
        if status == "paid" and was != "paid":
            await customers.update(key, add={"paid": 1, "paid_total": doc["amount"]})
            if meta.event_name != "INSERT":
                await self.timers.cancel(expire, doc["order_id"])
        elif status == "expired" and was != "expired":
            await customers.update(key, add={"expired": 1})

    async def on_delete(self, meta):
        pass  # a deleted order stays counted
