"""Dead letters: what could not be processed, kept with its data so nothing is lost.

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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import orjson

from .durable import append_fsync, safe_filename, until_written, utc_timestamp
from .logs import EventLogger, get_logger


class DeadLetters:
    def __init__(self, directory: Path, log: EventLogger | None = None) -> None:
        self.directory = directory
        self.log = log or get_logger("mldserver.deadletters")
        self.metrics: Any = None  # the server's Metrics: entries counted by kind once written

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

    async def failed_records(self, shard_id: str | None, entries: list[tuple[dict[str, Any], str, int]],
                             reason: str) -> Path:
        """Records each with its own error and attempts (``batch.fail``), in one write."""
        ts = utc_timestamp()
        lines = [_record_entry(ts, shard_id, reason, error, r, {"attempts": attempts})
                 for r, error, attempts in entries]
        path = await self._append(shard_id, lines)
        self._count(reason, len(lines))
        return path

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

    def _count(self, reason: str, entries: int) -> None:
        if self.metrics is not None:
            self.metrics.dead_letter(reason, entries)

    async def _append(self, shard_id: str | None, entries: list[dict[str, Any]]) -> Path:
        path = self.path_for(shard_id)
        data = b"".join(orjson.dumps(e, default=str) + b"\n" for e in entries)
        return await until_written(
            lambda: append_fsync(path, data), path, self.log, what="dead letter", shard_id=shard_id
        )


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
