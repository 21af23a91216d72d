"""The saved positions of one source: where each of its shards resumes, one file in
the state dir, ``<state-dir>/sources/<source>.json`` (the name made by
``safe_filename``), written whole and atomically (``atomic_write``) each time a
shard's checkpoint is stored::

    {"source": "dynamodb:orders",
     "stream": "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-30T10:00:00.000",
     "shards": {"shardId-00000001769731200000-6a3f0c2d": ["000000000000000000017", 0],
                "shardId-00000001769716800000-0b8e4a71": "SHARD_END"}}

A Kinesis stream's document also has ``"created"``, the stream's creation time (epoch
ms): a stream deleted and created again keeps its ARN and its shard ids, and only that
time says the positions are the old stream's (``reader`` then drops them: ``restart``).

    saved = SavedPositions.open(Path("state"), "dynamodb:orders")   # read now (ConfigError if corrupt)
    saved.get("shardId-...-6a3f0c2d")        # Position("000000000000000000017", 0), SHARD_END or None
    await saved.store("shardId-...-6a3f0c2d", Position.parse("000000000000000000018", 0))
    saved.reset()                            # --reset-positions: the file goes
    await saved.set_stream(arn, created)     # the stream they belong to (written if new)
    await saved.restart(arn, created)        # the stream was created again: every position goes

With ``--lease-table`` the positions are not here: each shard's lives in its own lease
item (``shard_leases``, which answers ``get``, ``ended`` and ``store`` as this does).
``decode`` and ``write`` read and write the document elsewhere than the file::

    saved = SavedPositions.decode("dynamodb:orders", data, write=put_somewhere)

A position is what the server checkpointed: with a sink, what the sink has committed;
without one, what the handler checkpointed. A restart resumes after it. ``SHARD_END``
marks a shard read to its end: its children may start, once it is written (``ended``
answers for what is on disk, so a crash can never find a child read and its parent
not ended). Stores from many shards at
once are written together (the last state wins, nothing is written twice over), and
a failing disk is waited out (``until_written``): the checkpoint's reply waits, as the
daemon's does on a busy lease table.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Union

from ..base.durable import atomic_write, safe_filename, until_written
from ..base.logs import get_logger
from ..base.positions import Position
from ..errors import ConfigError

SHARD_END = "SHARD_END"
Saved = Union[Position, Literal["SHARD_END"]]

log = get_logger("mldserver.sources")


def positions_path(state_dir: Path, source: str) -> Path:
    return Path(state_dir) / "sources" / f"{safe_filename(source)}.json"


class SavedPositions:
    def __init__(self, path: Path | None, source: str, shards: dict[str, Saved] | None = None,
                 stream: str | None = None, created: int | None = None,
                 write: Callable[[bytes], Awaitable[None]] | None = None) -> None:
        """``write``: where the document goes (the lease item's); else the file at ``path``."""
        self.path = path
        self.write = write
        self.source = source
        self.stream = stream  # the stream the positions belong to (a table's stream may be replaced)
        self.created = created  # its creation time, epoch ms, where the ARN does not say it (Kinesis)
        self._shards: dict[str, Saved] = dict(shards or {})
        self._ended = _ended(self._shards)  # as written
        self._version = 0  # of _shards
        self._written = 0  # the version on disk
        self._lock = asyncio.Lock()

    @classmethod
    def open(cls, state_dir: Path, source: str) -> "SavedPositions":
        """The source's saved positions (none if it has no file yet)."""
        path = positions_path(state_dir, source)
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls(path, source)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--source {source}: cannot read its saved positions {path} ({exc}): repair or move "
                              f"the file, or pass --reset-positions to start again from --from") from None
        try:
            return cls(path, source, *_parse(raw))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ConfigError(f"--source {source}: its saved positions {path} are not as this server writes "
                              f"them ({exc}): repair or move the file, or pass --reset-positions") from None

    @classmethod
    def decode(cls, source: str, data: bytes | None, *,
               write: Callable[[bytes], Awaitable[None]]) -> "SavedPositions":
        """The positions a lease item holds (``data``: None, none yet), written back by
        ``write``; a document this server cannot read is a ValueError."""
        if data is None:
            return cls(None, source, write=write)
        try:
            return cls(None, source, *_parse(json.loads(data)), write=write)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"the positions of {source} in its lease item are not as this server writes them "
                             f"({exc})") from None

    @staticmethod
    def reset(state_dir: Path, source: str) -> bool:
        """Delete the source's saved positions (``--reset-positions``): True if there were some."""
        path = positions_path(state_dir, source)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._shards)

    def get(self, shard_id: str) -> Saved | None:
        return self._shards.get(shard_id)

    def ended(self, shard_id: str) -> bool:
        """Is the shard's ``SHARD_END`` written (not only stored and on its way)?"""
        return shard_id in self._ended

    def shard_ids(self) -> list[str]:
        return list(self._shards)

    async def store(self, shard_id: str, saved: Saved) -> None:
        """Keep ``saved`` as the shard's position, on disk when this returns."""
        self._shards[shard_id] = saved
        await self._write()

    async def forget(self, shard_ids: list[str]) -> None:
        """Drop shards gone from the stream (trimmed away: nothing waits on them)."""
        if [s for s in shard_ids if self._shards.pop(s, None) is not None]:  # (every one: not any())
            await self._write()

    async def set_stream(self, stream: str, created: int | None = None) -> None:
        if (stream, created) != (self.stream, self.created):
            self.stream, self.created = stream, created
            await self._write()

    async def restart(self, stream: str, created: int | None) -> None:
        """The stream was created again under its ARN: no saved position is its."""
        self._shards.clear()
        self.stream, self.created = stream, created
        await self._write()

    async def _write(self) -> None:
        self._version += 1
        wanted = self._version
        async with self._lock:
            if self._written >= wanted:  # written with a later store while we waited
                return
            version, data, ended = self._version, self._encode(), _ended(self._shards)
            if self.write is not None:
                await self.write(data)  # (LeaseNotHeld: the lease went to another server)
            else:
                assert self.path is not None
                await until_written(lambda: self._put(data), self.path, log, what="source positions",
                                    source=self.source)
            self._written, self._ended = version, ended

    def _put(self, data: bytes) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, data)

    def _encode(self) -> bytes:
        shards: dict[str, Any] = {k: v if v == SHARD_END else v.to_json() for k, v in self._shards.items()}
        doc: dict[str, Any] = {"source": self.source, "stream": self.stream, "shards": shards}
        if self.created is not None:
            doc["created"] = self.created
        return json.dumps(doc, indent=1).encode()


def _ended(shards: dict[str, Saved]) -> frozenset[str]:
    return frozenset(k for k, v in shards.items() if v == SHARD_END)


def _parse(raw: Any) -> tuple[dict[str, Saved], str | None, int | None]:
    """(shards, stream, created) of a positions document as written (``_encode``)."""
    shards = {str(k): v if v == SHARD_END else Position.from_json(v) for k, v in raw["shards"].items()}
    created = raw.get("created")
    if created is not None and type(created) is not int:
        raise ValueError(f"created {created!r} is not epoch milliseconds")
    return shards, raw.get("stream"), created
