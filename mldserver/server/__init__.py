"""The server process.

- ``server.py``: the lifecycle: start, serve, reload, the ordered shutdown.
- ``assembly.py``: its parts, built from the settings in one place.
- ``preflight.py``: start-up checks of the machine (a path the server cannot use, refused),
  also run by ``mldserver check``.
- ``listeners.py``: the TCP port and the unix socket the relays connect to.
- ``admin.py``: the admin endpoint: health, status, pause, resume, reload, redrive.
- ``admin_token.py``: the admin endpoint's bearer token, for the server and its clients
  (``mldserver status``, ``pause``, ``redrive``).
- ``admission.py``: a cap on the admin endpoint's connections and its headers' time-out.
- ``redrive.py``: dead letters sent through the current handler again.
- ``metrics.py``: the Prometheus registry, its instruments and the loop lag.

``from mldserver.server import Server`` keeps working: names are imported when asked
for, so a handler process or the relay importing ``mldserver`` pays for none of this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..faces import lazy_attributes

__all__ = ["Server", "ServerCrashed", "run"]

if TYPE_CHECKING:
    from ..errors import ServerCrashed
    from .server import Server, run


__getattr__ = lazy_attributes(__name__, {"Server": ".server", "run": ".server", "ServerCrashed": "..errors"})
