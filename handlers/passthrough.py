"""Passthrough, one row per record: ``mldserver/examples/passthrough.py``, under this folder's name.

    mldserver serve --handler handlers.passthrough:Passthrough --sink file:./out --window 60

The example ships inside the package (``mldserver bench`` runs it from an installed
package); this module only gives it its name among the project's handlers.
"""

from mldserver.examples.passthrough import Passthrough

__all__ = ["Passthrough"]
