"""Sources the server reads itself, beside (or instead of) the daemon's connections:
``mldserver serve --handler app:Orders --source dynamodb:orders --from trim_horizon``
(or ``--source kinesis:clicks``).

Each source is an in-process MultiLangDaemon: its shards are read through aioboto3
and fed to the server over socket pairs, so the handlers, timers, bindings, the
coordinator and every sink work as they do behind the KCL daemon. The modules, one
job each:

- ``spec.py``: ``--source`` and ``--from`` parsed (``SourceSpec``, ``Start``);
- ``service.py``: what a reader asks of a stream service, and the errors it acts on;
- ``dynamodb.py``: the DynamoDB Streams calls;
- ``kinesis.py``: the Kinesis calls (KPL aggregates as user records);
- ``feed.py``: the daemon's side of one shard's conversation (checkpoints checked as the
  KCL checks them, and saved);
- ``positions.py``: a source's saved positions, ``<state-dir>/sources/<source>.json``;
- ``balance.py``: which shard leases a server takes or steals (a pure rule);
- ``shard_leases.py``: with ``--lease-table``, a source's shards spread over the servers
  sharing the table (a DynamoDB lease per shard, which also keeps its position);
- ``cursor.py``: one shard read page after page (iterators, throttling, expiry, trimming);
- ``reader.py``: a source's shards listed, started parents first, their leases kept, stopped;
- ``shard_reading.py``: one shard read into the server: its feed, its pages, how it ends;
- ``stream.py``: the same reading for scripts, ``mldserver.open_stream`` (no server).

The server builds them with ``readers(settings, attach=..., empty_batches=...)``
(``prepare`` at start-up: a ConfigError before anything listens), starts them once
listening and stops them first at shutdown::

    for reader in readers(settings, attach=server.attach, empty_batches=True):
        reader.prepare()
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Awaitable, Callable

from ..base.config import Settings
from ..errors import ConfigError
from .shard_leases import ShardLeases
from .positions import SavedPositions
from .reader import SourceReader
from .spec import parse_sources

__all__ = ["SourceReader", "readers", "reset_positions", "resettable"]


def readers(settings: Settings, *, attach: Callable[[socket.socket], Awaitable[None]],
            empty_batches: bool, lineage: Callable[[str, tuple[str, ...]], None] | None = None,
            restart: Callable[[str], None] | None = None) -> list[SourceReader]:
    """A reader per ``--source`` (none without one); a mistake is a ConfigError.
    ``lineage`` is told each shard's parents before the shard starts; ``restart``, each
    shard id of a stream deleted and created again while read."""
    specs, start = parse_sources(settings.source, settings.source_from)
    return [SourceReader(spec, start, settings, attach=attach, empty_batches=empty_batches, qualify=len(specs) > 1,
                         given_from=settings.source_from is not None, lineage=lineage, restart=restart)
            for spec in specs]


def resettable(settings: Settings) -> None:
    """What ``--reset-positions`` needs before it deletes anything (``serve``, ``run``,
    and ``check``, which deletes nothing): a ``--source``; else a ConfigError."""
    if not settings.source:
        raise ConfigError("--reset-positions: deletes the saved positions of a --source, and none is given: "
                          "add --source dynamodb:TABLE or kinesis:STREAM, or leave --reset-positions out")


def reset_positions(settings: Settings) -> list[str]:
    """``--reset-positions``: delete the saved positions of every ``--source`` (with
    ``--lease-table``, those in the lease table: refused while a live server holds one
    of the source's shard leases); the sources that had some."""
    specs, _ = parse_sources(settings.source, settings.source_from)
    if settings.lease_table:
        return asyncio.run(_reset_leased(settings, [spec.text for spec in specs]))
    return [spec.text for spec in specs if SavedPositions.reset(Path(settings.state_dir), spec.text)]


async def _reset_leased(settings: Settings, sources: list[str]) -> list[str]:
    assert settings.lease_table is not None
    reset = []
    for source in sources:
        try:
            async with ShardLeases(settings.lease_table, source, region=settings.aws_region) as leases:
                if await leases.reset_positions():
                    reset.append(source)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"--reset-positions: cannot open the lease table {settings.lease_table} "
                              f"({type(exc).__name__}: {exc}): check the region, the credentials and the "
                              f"endpoint (AWS_ENDPOINT_URL_DYNAMODB)") from None
    return reset
