"""Live orders: ``mldserver/examples/order_tracker.py``, under this folder's name.

    mldserver serve --config tracker.toml      # handler = "handlers.order_tracker:OrderTracker"
"""

from mldserver.examples.order_tracker import EXPIRE_AFTER_S, OrderTracker, expire

__all__ = ["EXPIRE_AFTER_S", "OrderTracker", "expire"]
