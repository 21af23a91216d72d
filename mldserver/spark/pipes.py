"""Frames on the server's pipes to its child processes (the Spark process, the
handler processes): an 8-byte header (two big-endian u32: the JSON part's length,
the body's length), a JSON object, then an optional binary body::

    >II | {"op": "commit", "id": 7, "window": {...}} | b""

    data = encode({"op": "commit", "id": 7}, body=b"...")
    message, body = read_frame(io.BytesIO(data))          # ({"op": "commit", "id": 7}, b"...")
    message, body = await read_frame_async(stream_reader)  # the same, from an asyncio stream

What each side's frames mean is its own module's: ``spark/frames.py`` and
``pool/frames.py``. A frame cut short by the end of input reads as None.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, BinaryIO, Mapping

import orjson

HEADER = struct.Struct(">II")


def encode(message: Mapping[str, Any], body: bytes = b"") -> bytes:
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
