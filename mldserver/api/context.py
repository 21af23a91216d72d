"""The server context handed to every handler factory (``Attr(context)``).

One per server, shared by all shard connections::

    class Orders(mldserver.Handler):
        def __init__(self, context):
            super().__init__(context)
            self.settings = context.settings   # the server's Settings
            self.log = context.log             # structured logger: self.log.info("event", k=v)

        async def process_records(self, batch, checkpointer):
            rows = await self.context.sql("SELECT name FROM customers WHERE tier = :tier", tier="gold")
            async for row in rows:             # dicts, fetched from Spark as you iterate
                ...

``context.sql`` runs in the server's Spark process (started with ``--pipeline``,
``--sink parquet:DIR``, ``--spark-master`` or ``--spark-remote``). Parameters are
bound by Spark (``:name`` markers, Spark's own ``args``), never pasted into the text.

``context.table(alias)`` is a DynamoDB table binding declared in the config
(``[bindings.ALIAS]``): ``await context.table("customers").get({"id": "c-7"})``; see
``mldserver.api.bindings``.
Nothing runs until the first row is asked for; leaving the loop early stops Spark
from computing the partitions not yet read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator

from ..base.config import Settings
from ..errors import ConfigError
from ..base.logs import EventLogger, handler_logger

if TYPE_CHECKING:
    from .bindings import Bindings, Table
    from ..spark.process import SparkProcess


@dataclass
class Context:
    """What every handler factory is given (``Orders(context)``), shared by the
    shards of a handler process::

        class Orders(mldserver.Handler):
            async def process_records(self, batch, checkpointer):
                self.context.log.info("orders_seen", records=len(batch.records))
                customer = await self.context.table("customers").get({"id": "c-7"})

    ``settings``: the server's ``Settings``; ``log``: the handler's structured logger;
    ``extras``: a dict free for the handler's own use."""

    settings: Settings
    log: EventLogger = field(default_factory=handler_logger)  # the handler's own events
    extras: dict[str, Any] = field(default_factory=dict)
    spark: "SparkProcess | None" = None
    timers: Any = None  # mldserver.timers.Timers of this process: Handler.timers
    bindings: "Bindings | None" = None  # made on first use from settings.bindings

    def table(self, alias: str) -> "Table":
        """The table binding ``alias`` (``[bindings.ALIAS]`` in the config):
        ``get``, ``put``, ``update``, ``delete`` with Python values (``mldserver.api.bindings``)."""
        if self.bindings is None:
            from .bindings import Bindings

            self.bindings = Bindings(self.settings)
        return self.bindings.table(alias)

    async def close(self) -> None:
        """Closes what this process opened for handlers (the bindings' client)."""
        if self.bindings is not None:
            await self.bindings.close()

    @property
    def state_dir(self) -> Path:
        """The server's state directory (``--state-dir``), e.g. for a handler's own files."""
        return Path(self.settings.state_dir)

    async def sql(self, query: str, **params: Any) -> AsyncIterator[dict[str, Any]]:
        """Run ``query`` in the server's Spark process, ``:name`` markers bound to
        ``params`` by Spark; the rows come back as dicts as you iterate::

            rows = await self.context.sql("SELECT name FROM customers WHERE tier = :tier", tier="gold")
            async for row in rows:
                ...

        ``ConfigError`` when the server runs no Spark (start it with ``--pipeline``,
        ``--sink parquet:DIR``, ``--spark-master`` or ``--spark-remote``)."""
        if self.spark is None:
            raise ConfigError(
                "context.sql needs Spark: start the server with --pipeline, --sink parquet:DIR, "
                "--spark-master or --spark-remote"
            )
        return self.spark.sql(query, params)
