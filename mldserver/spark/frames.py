"""Frames on the pipe between the server and the Spark process (``child.py``).

One frame is a request or a reply: an 8-byte header (two big-endian u32: the JSON
part's length, the body's length), a JSON object, then an optional binary body::

    >II | {"op": "commit", "id": 7, "window": {...}} | b""
    >II | {"id": 7, "ok": true, "rows_out": 41, "duration_ms": 212.5} | b""

Every request carries an ``id``; its reply carries the same ``id`` and ``ok``. Window
rows never cross as Python objects: a commit names an Arrow (parquet) file. The
requests both sides build or read are typed below (``StartRequest``,
``CommitRequest``, ``WriteRequest``), and so is the commit-log entry the Spark process writes
(``CommitEntry``): one spelling of each shape, shared by both ends.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, BinaryIO, Literal, Mapping, TypedDict

import orjson

HEADER = struct.Struct(">II")


class StartRequest(TypedDict):
    """The first frame: how the Spark process builds its session and its sink."""

    op: Literal["start"]
    id: int
    master: str | None  # None: local[*]
    remote: str | None  # sc://host:port (Spark Connect)
    conf: dict[str, Any]
    work_dir: str
    sink_dir: str | None  # None: no sink, SQL only
    format: str  # what the sink writes: parquet, json, orc, csv
    pipeline: str | None  # MODULE:ATTR; None: the identity pipeline
    sys_path: list[str]


class WindowFrame(TypedDict):
    """A closed window, as a commit names it (its rows are in the request's file)."""

    id: str  # "<start>-<end>"
    start: int
    end: int
    rows: int
    late: int  # the first ``late`` rows are late rows
    positions: dict[str, tuple[str, int]]  # shard -> the highest (sequence number, sub-sequence number)


class CommitRequest(TypedDict):
    op: Literal["commit"]
    path: str  # the window's rows, an Arrow (parquet) file
    window: WindowFrame


class WriteRequest(TypedDict):
    """The ``iceberg:`` sink's: run the pipeline, write its output as parquet to ``out``
    (answered with ``files``, ``file://`` URIs, and ``rows_out``); the server commits them."""

    op: Literal["write"]
    path: str  # the window's rows, an Arrow (parquet) file
    out: str  # a folder that does not exist yet, where the table keeps its data
    window: WindowFrame


class CommitEntry(TypedDict):
    """One entry of the commit log (``sinks/commitlog.py``), appended after the output."""

    window: str
    start: int
    end: int
    rows: int
    late: int
    rows_out: int | None  # None: the format has no row count, or the pipeline wrote its own output
    positions: dict[str, tuple[str, int]]


def commit_entry(window: WindowFrame, rows_out: int | None) -> CommitEntry:
    return {
        "window": window["id"],
        "start": window["start"],
        "end": window["end"],
        "rows": window["rows"],
        "late": window["late"],
        "rows_out": rows_out,
        "positions": window["positions"],
    }


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
