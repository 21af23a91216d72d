"""Orders per customer per window: ``mldserver/examples/orders.py``, under this folder's name.

    mldserver serve --handler handlers.orders:Orders --pipeline handlers.orders:per_customer --window 60

The example ships inside the package (``mldserver demo`` runs it from an installed
package); this module only gives it its name among the project's handlers.
"""

from mldserver.examples.orders import Orders, change_record, per_customer

__all__ = ["Orders", "change_record", "per_customer"]
