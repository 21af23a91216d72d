"""Frames on the pipe between the server and the Spark process (``child.py``).

One frame is a request or a reply, framed as every pipe of the server is
(``spark/pipes.py``): a JSON object, then an optional binary body::

    >II | {"op": "commit", "id": 7, "window": {...}} | b""
    >II | {"id": 7, "ok": true, "rows_out": 41, "duration_ms": 212.5} | b""

Every request carries an ``id``; its reply carries the same ``id`` and ``ok``. Window
rows never cross as Python objects: a commit names an Arrow (parquet) file. The
requests both sides build or read are typed below (``StartRequest``,
``CommitRequest``, ``WriteRequest``), and so is the commit-log entry the Spark process writes
(``CommitEntry``): one spelling of each shape, shared by both ends.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from ..base.handoff import Window
from .pipes import encode, read_frame, read_frame_async

__all__ = ["StartRequest", "WindowFrame", "CommitRequest", "WriteRequest", "CommitEntry", "commit_entry",
           "window_frame", "encode", "read_frame", "read_frame_async"]


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
    kind: str  # "tumbling", "hopping" or "session"
    rows: int
    late: int  # the first ``late`` rows are late rows
    positions: dict[str, tuple[str, int]]  # shard -> the highest (sequence number, sub-sequence number)
    starts: NotRequired[dict[str, tuple[str, int]]]  # shard -> where the rows read of it start (``Window.starts``)
    output: NotRequired[dict[str, tuple[str, int]]]  # sessions: shard -> the highest row handed over
    version: NotRequired[int]  # allowed_lateness: 1, 2, ... this window replaces what was written of it
    final: NotRequired[int]  # allowed_lateness: windows ending at or before it are final


def window_frame(window: Window) -> WindowFrame:
    """The window as a commit names it."""
    frame: WindowFrame = {
        "id": window.id,
        "start": window.start,
        "end": window.end,
        "kind": window.kind,
        "rows": len(window),
        "late": window.late_rows,
        "positions": {shard_id: p.to_json() for shard_id, p in window.positions.items()},  # type: ignore[misc]
    }
    if window.starts:
        frame["starts"] = {shard_id: p.to_json() for shard_id, p in window.starts.items()}  # type: ignore[misc]
    if window.output:
        frame["output"] = {shard_id: p.to_json() for shard_id, p in window.output.items()}  # type: ignore[misc]
    if window.version:
        frame["version"] = window.version
    if window.final_until is not None:
        frame["final"] = window.final_until
    return frame


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
    """One entry of the commit log (``spark/commitlog.py``), appended after the output."""

    window: str
    start: int
    end: int
    rows: int
    late: int
    rows_out: int | None  # None: the format has no row count, or the pipeline wrote its own output
    positions: dict[str, tuple[str, int]]
    starts: NotRequired[dict[str, tuple[str, int]]]  # a shard's interval [start, position] is committed
    output: NotRequired[dict[str, tuple[str, int]]]
    version: NotRequired[int]  # its versions committed (amended: replaced)
    final: NotRequired[int]


def commit_entry(window: WindowFrame, rows_out: int | None, version: int | None = None) -> CommitEntry:
    entry: CommitEntry = {
        "window": window["id"],
        "start": window["start"],
        "end": window["end"],
        "rows": window["rows"],
        "late": window["late"],
        "rows_out": rows_out,
        "positions": window["positions"],
    }
    if "starts" in window:
        entry["starts"] = window["starts"]
    if "output" in window:
        entry["output"] = window["output"]
    if version is not None:
        entry["version"] = version
    if "final" in window:
        entry["final"] = window["final"]
    return entry
