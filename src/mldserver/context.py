"""The server context handed to every handler factory (``Attr(context)``).

One per server, shared by all shard connections::

    class Orders(mldserver.Handler):
        def __init__(self, context):
            super().__init__(context)
            self.settings = context.settings   # the server's Settings
            self.log = context.log             # structured logger: self.log.info("event", k=v)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Settings
from .logs import EventLogger, get_logger


@dataclass
class Context:
    settings: Settings
    log: EventLogger = field(default_factory=lambda: get_logger("mldserver.handler"))
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.state_dir)
