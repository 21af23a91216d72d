"""Frames on the pipe between the server and its Spark worker process.

One frame is a request or a reply: an 8-byte header (two big-endian u32: the JSON
part's length, the body's length), a JSON object, then an optional binary body::

    >II | {"op": "commit", "id": 7, "window": {...}} | b""
    >II | {"id": 7, "ok": true, "rows_out": 41, "duration_ms": 212.5} | b""

Every request carries an ``id``; its reply carries the same ``id`` and ``ok``. Window
rows never cross as Python objects: a commit names an Arrow (parquet) file.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, BinaryIO

import orjson

HEADER = struct.Struct(">II")


def encode(message: dict[str, Any], body: bytes = b"") -> bytes:
    data = orjson.dumps(message, default=str)
    return HEADER.pack(len(data), len(body)) + data + body


def read_frame(stream: BinaryIO) -> tuple[dict[str, Any], bytes] | None:
    """Blocking read of one frame; None at end of input."""
    head = _read_exactly(stream, HEADER.size)
    if head is None:
        return None
    size, body_size = HEADER.unpack(head)
    data = _read_exactly(stream, size)
    body = _read_exactly(stream, body_size) if body_size else b""
    if data is None or body is None:
        return None
    return orjson.loads(data), body


async def read_frame_async(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes] | None:
    try:
        size, body_size = HEADER.unpack(await reader.readexactly(HEADER.size))
        data = await reader.readexactly(size)
        body = await reader.readexactly(body_size) if body_size else b""
    except asyncio.IncompleteReadError:
        return None
    return orjson.loads(data), body


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
