"""Example handlers, shipped with the package so that ``mldserver demo`` and
``mldserver bench`` run from an installed package, and so that a new user can start
from one::

    mldserver serve --handler mldserver.examples.passthrough:Passthrough --sink file:./out --window 60

- ``passthrough.py``: one row per record, with everything the record carries.
- ``quickstart.py``: the quick start's handler, JSON orders on a Kinesis stream
  (``mldserver local --put`` puts such orders).
- ``orders.py``: a DynamoDB stream of an orders table: the handler, its pipeline (orders
  per customer per window) and the demo's data generator.
- ``order_tracker.py``: a DynamoDB orders table: per-customer totals kept in another
  table through a binding, unpaid orders expired by a timer.

The project's ``handlers/`` folder names them too (``handlers.orders:Orders``): write
your own handlers there.
"""
