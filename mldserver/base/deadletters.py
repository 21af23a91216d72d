r"""Dead letters: what could not be processed, kept with its data so nothing is lost.

One JSON line per record (or per unparseable daemon line), appended and fsynced to
``<state_dir>/dead-letters/<shard_id>.jsonl`` (the shard id made a file name by
``durable.safe_filename``)::

    {"ts":"2026-11-21T10:00:00.123Z","shard_id":"shardId-000000000001","reason":"handler failed",
     "error":"ValueError: bad order","attempts":3,"sequence_number":"4959...","sub_sequence_number":0,
     "partition_key":"cust-7","approximate_arrival_timestamp":1476889707000,"data":"bWVvdw=="}

``data`` is the record's base64 as the daemon sent it. A timer whose callback failed
every attempt goes to ``_timers.jsonl`` (no shard id makes that name) with its
context, ready to be created again::

    {"ts":"2026-11-21T10:00:00.123Z","reason":"timer callback failed","callback":"handlers.orders:remind",
     "reference":"order-7","due_ms":1763719260000,"error":"ValueError: no such order","attempts":3,
     "context":{"order":7}}

Lines are whole or absent (``durable.append_fsync``). Writes run in a thread: the
event loop never waits on the disk. A write that fails (a full disk) is logged once
and retried until it succeeds (``durable.until_written``): the caller, and so the
shard's status, waits for it.

A daemon line over ``max_line_size`` is never whole in memory: ``overlong`` streams it,
as it arrives, to a file of its own, published by a rename once the line has ended,
``<shard_id>.overlong-<ns>.jsonl``, one entry whose ``line`` is the line::

    await dead_letters.overlong("shardId-000000000001", error, wire.overflow(), log)
    -> {"ts":"...","shard_id":"shardId-000000000001","reason":"line too long","error":"...",
        "line":"{\"action\":\"processRecords\",\"records\":[..."}

Its bytes are read to the line's end even when the file cannot be written
(``dead_letter_failed``): the conversation goes on.

``mldserver redrive`` (mldserver.server.redrive) sends a shard file's records back
through the handler. Which entries it takes (``redrivable``): a record's, with its
``data`` and a position, for a reason a handler fix can cure (``record failed``,
``bad row``, ``handler failed``); the others stay where they are (a malformed record,
an invalid KPL aggregate, a daemon line, rows a sink rejected, timers)::

    redrivable({"shard_id": "shardId-000000000001", "reason": "record failed", "data": "bWVvdw==",
                "sequence_number": "4959...", "sub_sequence_number": 0, ...})
        -> Position(4959..., 0, "4959...")
    await dead_letters.remove(path, {line, ...})   # those lines gone, whatever was appended meanwhile

A redriven record's lines are removed (not marked) once its rows are committed; a
file left empty is deleted. ``remove`` rewrites the file beside it and renames it
into place under the lock every append to that file takes, so an append that
arrives meanwhile is never lost. ``Collected`` keeps a redrive's failures in memory:
a record that fails again stays in its original file, unchanged.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

import orjson

from .durable import append_fsync, atomic_write, fsync_dir, safe_filename, until_written, utc_timestamp
from .logs import EventLogger, get_logger
from .positions import Position

LINE_TOO_LONG = "line too long"
RECORD_FAILED = "record failed"  # batch.fail: one record the handler gave up on (metrics kind "record_failed")
# What a fixed handler may take (``redrivable``): "bad row" is a row the handler emitted that
# would not encode, "handler failed" the reason of older servers' whole batches.
REDRIVABLE = frozenset({RECORD_FAILED, "bad row", "handler failed"})
NOT_SHARD_FILES = ("rows.jsonl", "_timers.jsonl")  # rows a sink rejected or late, timers: not records


class DeadLetters:
    def __init__(self, directory: Path, log: EventLogger | None = None, *, metrics: Any = None) -> None:
        self.directory = directory
        self.log = log or get_logger("mldserver.deadletters")
        self.metrics = metrics  # the server's Metrics: entries counted by kind once written
        self._locks: dict[Path, asyncio.Lock] = {}  # a shard file's appends and removals, one at a time

    def _lock(self, path: Path) -> asyncio.Lock:
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = asyncio.Lock()
        return lock

    def files(self) -> tuple[list[Path], list[Path]]:
        """The shard files (``<shard_id>.jsonl``), where record dead letters are, and the
        others (rows, timers, overlong lines)."""
        try:
            paths = sorted(p for p in self.directory.iterdir() if p.suffix == ".jsonl" and p.is_file())
        except FileNotFoundError:
            return [], []
        others = [p for p in paths if p.name in NOT_SHARD_FILES or ".overlong-" in p.name]
        return [p for p in paths if p not in others], others

    async def remove(self, path: Path, lines: set[bytes]) -> int:
        """Remove these whole lines (as read, newline excluded) from ``path``; lines
        appended since they were read stay (each line has its own time stamp). The file is rewritten beside itself,
        fsynced and renamed into place (deleted when nothing is left). How many went."""
        async with self._lock(path):
            return await until_written(lambda: _without(path, lines), path, self.log, what="dead letter")

    def path_for(self, shard_id: str | None) -> Path:
        return self.directory / f"{safe_filename(shard_id or 'unknown-shard')}.jsonl"

    async def records(
        self, shard_id: str | None, records: Iterable[dict[str, Any]], reason: str, error: str, **extra: Any
    ) -> Path:
        ts = utc_timestamp()
        lines = [_record_entry(ts, shard_id, reason, error, r, extra) for r in records]
        path = await self._append(shard_id, lines)
        self._count(reason, len(lines))
        return path

    async def batch_records(self, shard_id: str | None, raws: list[Any], reason: str, error: str, attempts: int,
                            log: EventLogger) -> None:
        """Records of a batch as the daemon wrote them (one that is not a JSON object as
        ``{"data": null, "value": ...}``), all for one reason; ``dead_lettered`` says where."""
        records = [r if type(r) is dict else {"data": None, "value": r} for r in raws]
        path = await self.records(shard_id, records, reason, error, attempts=attempts)
        log.error("dead_lettered", reason=reason, error=error, records=len(records), path=str(path))

    async def failed_records(self, shard_id: str | None, records: Any, failed: list[Any], log: EventLogger) -> None:
        """The records of a batch the handler gave up on (``batch.fail``: (index in
        ``records``, error, attempts)), each with its own error and attempts, in one
        write; ``dead_lettered`` says where."""
        entries = [(_as_daemon_wrote(records, i), error, attempts) for i, error, attempts in failed
                   if type(i) is int and 0 <= i < len(records)]
        if len(entries) < len(failed):  # not from this batch: a defect on the handler's side of the seam
            log.error("failed_records_unknown", failed=failed[:10], records=len(records),
                      what_to_do="report this: the handler named records the batch does not have")
        if not entries:
            return
        ts = utc_timestamp()
        lines = [_record_entry(ts, shard_id, RECORD_FAILED, error, r, {"attempts": attempts})
                 for r, error, attempts in entries]
        path = await self._append(shard_id, lines)
        self._count(RECORD_FAILED, len(lines))
        log.error("dead_lettered", reason=RECORD_FAILED, error=entries[0][1], records=len(entries), path=str(path))

    async def rows(self, window_id: str, rows: list[tuple[bytes, str]], reason: str) -> Path:
        """Rows a sink could not take (``(row, error)``), to ``rows.jsonl``."""
        ts = utc_timestamp()
        entries = [
            {"ts": ts, "window": window_id, "reason": reason, "error": error, "row": row.decode("utf-8", "replace")}
            for row, error in rows
        ]
        path = self.directory / "rows.jsonl"
        data = b"".join(orjson.dumps(e) + b"\n" for e in entries)
        written = await until_written(
            lambda: append_fsync(path, data), path, self.log, what="dead letter", window=window_id
        )
        self._count(reason, len(entries))
        return written

    async def rejected_rows(self, window_id: str, rows: list[tuple[bytes, str]], reason: str,
                            log: EventLogger) -> None:
        """A sink's rows that do not fit its table (``rows``), and the ``rows_rejected``
        line that says where they went."""
        where = await self.rows(window_id, rows, reason)
        log.error(
            "rows_rejected",
            window=window_id,
            rows=len(rows),
            error=rows[0][1],
            path=str(where),
            what_to_do="declare the schema in the config ([schema]) or fix what the handler emits",
        )

    async def timers(self, entries: list[dict[str, Any]], reason: str = "timer callback failed") -> Path:
        """Timers that failed every attempt (callback, reference, due_ms, error,
        attempts, context), to ``_timers.jsonl``."""
        ts = utc_timestamp()
        path = self.directory / "_timers.jsonl"
        data = b"".join(orjson.dumps({"ts": ts, "reason": reason, **e}, default=str) + b"\n" for e in entries)
        written = await until_written(lambda: append_fsync(path, data), path, self.log, what="dead letter")
        self._count(reason, len(entries))
        return written

    async def line(self, shard_id: str | None, line: bytes, reason: str) -> Path:
        entry = {"ts": utc_timestamp(), "shard_id": shard_id, "reason": reason, "line": line.decode("utf-8", "replace")}
        path = await self._append(shard_id, [entry])
        self._count("bad line", 1)  # (its reason is the protocol error's text: not a label)
        return path

    async def overlong(self, shard_id: str | None, error: str, pieces: AsyncIterator[tuple[bytes, bool]],
                       log: EventLogger) -> Path | None:
        """Stream a line over ``max_line_size`` (``pieces``: its bytes as they arrive,
        and whether they end it) to its own dead-letter file (see the module). The
        file, or None if it could not be written; ``pieces`` is read to its end either way."""
        base = self.path_for(shard_id)
        path = base.with_name(f"{base.stem}.overlong-{time.time_ns()}.jsonl")
        tmp = path.with_name(path.name + ".tmp")
        head = orjson.dumps({"ts": utc_timestamp(), "shard_id": shard_id, "reason": LINE_TOO_LONG,
                             "error": error, "line": ""})[:-2]  # ... "line":"  (its text follows)
        out: Any = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = await asyncio.to_thread(open, tmp, "wb")
            await asyncio.to_thread(out.write, head)
        except OSError as exc:
            log.error("dead_letter_failed", path=str(tmp), error=f"{type(exc).__name__}: {exc}")
            out = None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        async for chunk, done in pieces:
            text = decoder.decode(chunk, final=done)
            if out is not None and text:
                try:
                    await asyncio.to_thread(out.write, json.dumps(text)[1:-1].encode("ascii"))
                except OSError as exc:
                    log.error("dead_letter_failed", path=str(tmp), error=f"{type(exc).__name__}: {exc}")
                    out.close()
                    out = None
        if out is None:
            return None

        def publish() -> None:
            with out:
                out.write(b'"}\n')
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)

        try:
            await asyncio.to_thread(publish)
        except OSError as exc:
            log.error("dead_letter_failed", path=str(tmp), error=f"{type(exc).__name__}: {exc}")
            return None
        log.error("dead_lettered", reason=LINE_TOO_LONG, path=str(path))
        self._count(LINE_TOO_LONG, 1)
        return path

    def _count(self, reason: str, entries: int) -> None:
        if self.metrics is not None:
            self.metrics.dead_letter(reason, entries)

    async def _append(self, shard_id: str | None, entries: list[dict[str, Any]]) -> Path:
        path = self.path_for(shard_id)
        data = b"".join(orjson.dumps(e, default=str) + b"\n" for e in entries)
        async with self._lock(path):
            return await until_written(
                lambda: append_fsync(path, data), path, self.log, what="dead letter", shard_id=shard_id
            )


class Collected(DeadLetters):
    """A redrive's dead letters: its records that fail again, kept in memory
    (``entries``), never written: each is still in its original file (``path``, what
    the ``dead_lettered`` line names), which the redrive leaves as it was."""

    def __init__(self, path: Path, log: EventLogger | None = None) -> None:
        super().__init__(path.parent, log)
        self.path = path
        self.entries: list[dict[str, Any]] = []

    def path_for(self, shard_id: str | None) -> Path:
        return self.path

    async def _append(self, shard_id: str | None, entries: list[dict[str, Any]]) -> Path:
        self.entries.extend(entries)
        return self.path


def redrivable(entry: Any) -> Position | None:
    """The position of a dead letter ``mldserver redrive`` may send again (see the
    module), or None: not a record's, no data, or a reason no handler fix cures."""
    if type(entry) is not dict or entry.get("reason") not in REDRIVABLE or type(entry.get("data")) is not str:
        return None
    if type(entry.get("shard_id")) is not str:
        return None
    return Position.parse(entry.get("sequence_number"), entry.get("sub_sequence_number") or 0)


def _without(path: Path, lines: set[bytes]) -> int:
    """``remove``'s write, in a thread."""
    try:
        kept = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return 0
    tail = kept.pop() if kept and kept[-1] else None  # a torn last line (a crash mid-append) is kept as is
    if kept and not kept[-1]:
        kept.pop()
    left = [line for line in kept if line not in lines]
    removed = len(kept) - len(left)
    if not removed:
        return 0
    data = b"".join(line + b"\n" for line in left) + (tail or b"")
    if not data:
        path.unlink()
    else:
        atomic_write(path, data)
    fsync_dir(path.parent)
    return removed


def _record_entry(ts: str, shard_id: str | None, reason: str, error: str, r: dict[str, Any],
                  extra: dict[str, Any]) -> dict[str, Any]:
    """One dead-lettered record: why, and the record as the daemon wrote it."""
    return {
        "ts": ts,
        "shard_id": shard_id,
        "reason": reason,
        "error": error,
        **extra,
        "sequence_number": r.get("sequenceNumber"),
        "sub_sequence_number": r.get("subSequenceNumber"),
        "partition_key": r.get("partitionKey"),
        "approximate_arrival_timestamp": r.get("approximateArrivalTimestamp"),
        "data": r.get("data"),
    }


def _as_daemon_wrote(records: Any, i: int) -> dict[str, Any]:
    """Record ``i`` of a batch as the daemon wrote it, for a dead letter; one that is
    not a JSON object (which the handler saw as such) as ``{"data": null, "value": ...}``."""
    try:
        return records[i].to_json()
    except (AttributeError, TypeError, ValueError):  # not an object: its value from the line read whole
        raws = getattr(records, "raws", None)
        value = raws.records()[i] if raws is not None else getattr(records[i], "_raw", None)
        return value if type(value) is dict else {"data": None, "value": value}
