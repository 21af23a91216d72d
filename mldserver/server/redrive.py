"""``mldserver redrive`` on the server's side (``POST /redrive``): dead-lettered records
sent again through the handler that serves now (after a fix and ``mldserver reload``),
their rows into the sink like any other, and what fails again reported and kept.

Which dead letters: the shard files' (``<state-dir>/dead-letters/<shard_id>.jsonl``)
records that ``deadletters.redrivable`` takes: ``record failed`` (bisect,
``batch.fail``), ``bad row``, ``handler failed``, each with its data and position. A
malformed record, an invalid KPL aggregate, a daemon line, rows a sink rejected or that
came late (``rows.jsonl``) and timers (``_timers.jsonl``) are left where they are: no
handler fix makes them records again.

How: each shard file is one connection of the redrive's own, spoken by a ``Feed`` (as
a ``--source`` shard is), under a shard id no stream has::

    initialize      shardId "redrive-20261121T100000123Z:shardId-000000000001"
    processRecords  the file's records, in position order (one a position: a record
                    dead-lettered twice is sent once), 500 a batch,
                    approximateArrivalTimestamp: now (the original stays in the file)

so the handler, its retries, bisect, the pause gate and the handler processes of the
current generation are those of every shard. Its rows reach the coordinator under that
id (``shard.downstream.RedriveLink``): they hold no watermark back, join the window
their time falls in (their arrival time is now: the window open now, unless the
handler gives times of its own: older than a closed window, they are late, as any late
row), and are committed in the commit log under that id. No shard of a stream is
checkpointed by them, and the id, new every run, is never anything's duplicate.

A record that fails again is dead-lettered by the driver into ``deadletters.Collected``
(in memory): its lines stay in the original file, unchanged. A record whose rows are
committed (the coordinator's ``safe_position`` of the redrive's shard has passed it;
with no sink, once the handler took it) has its lines removed from the file
(``DeadLetters.remove``: lines appended meanwhile stay).

A crash, or a redrive that does not commit within its time-out: nothing is removed
before its rows are committed, so nothing is lost; rows committed whose lines were not
yet removed are sent again by the next redrive: a duplicate at worst, in the sink.

One redrive at a time; a paused server refuses it (``Busy``). The answer::

    {"run": "redrive-20261121T100000123Z", "redriven": 1, "failed_again": 0, "left": 2,
     "not_committed": 0, "failures": []}
    # failures: [{"shard_id": "shardId-000000000001", "sequence_number": "4959...",
    #             "sub_sequence_number": 0, "error": "ValueError: bad order"}, ...] (the first 100)

``redriven``, ``failed_again`` and ``left`` count dead letters (lines): removed, kept
because their record failed again, and kept otherwise (not redrivable, ``rows.jsonl``'s
and ``_timers.jsonl``'s included, or not committed within the time-out:
``not_committed``).
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..base.deadletters import Collected, redrivable
from ..base.durable import utc_timestamp, wall_clock_ms
from ..base.logs import get_logger
from ..base.positions import Position
from ..sources.feed import LINE_LIMIT, Feed, FeedClosed

log = get_logger("mldserver.redrive")

BATCH = 500  # records a processRecords
BATCH_BYTES = 8 << 20  # and at most this much data in one (well under max_line_size)
REPORTED = 100  # failures named in the answer (all are counted)


class Busy(Exception):
    """The redrive cannot start now (paused, one under way, shutting down): why."""


@dataclass
class Letters:
    """One shard file's redrivable dead letters: each position's lines and entry."""

    path: Path
    shard_id: str
    lines: dict[Position, list[bytes]] = field(default_factory=dict)
    entries: dict[Position, dict[str, Any]] = field(default_factory=dict)

    def records(self, arrival_ms: int) -> list[dict[str, Any]]:
        out = []
        for position in sorted(self.entries):
            e = self.entries[position]
            out.append({"action": "record", "data": e["data"], "partitionKey": e.get("partition_key"),
                        "sequenceNumber": e["sequence_number"], "subSequenceNumber": e.get("sub_sequence_number"),
                        "approximateArrivalTimestamp": arrival_ms})
        return out


@dataclass
class RedriveResult:
    run: str
    redriven: int = 0
    failed_again: int = 0
    left: int = 0
    not_committed: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def answer(self) -> dict[str, Any]:
        return {"run": self.run, "redriven": self.redriven, "failed_again": self.failed_again, "left": self.left,
                "not_committed": self.not_committed, "failures": self.failures[:REPORTED]}


def read_letters(paths: list[Path], elsewhere: list[Path]) -> tuple[list[Letters], int]:
    """The redrivable dead letters of these shard files, and how many others there are,
    there and in the files ``elsewhere`` (rows, timers: one a line)."""
    found, others = [], 0
    for path in elsewhere:
        try:
            others += path.read_bytes().count(b"\n")
        except FileNotFoundError:
            pass
    for path in paths:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            continue
        letters = None
        lines = raw.split(b"\n")
        if lines and lines[-1]:
            others += 1  # a line still being written (or torn by a crash): not whole
        for line in lines[:-1]:
            if not line:
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                others += 1
                continue
            position = redrivable(entry)
            if position is None:
                others += 1
                continue
            if letters is None:
                letters = Letters(path, entry["shard_id"])
            letters.lines.setdefault(position, []).append(line)
            letters.entries.setdefault(position, entry)
        if letters is not None:
            found.append(letters)
    return found, others


def _batches(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for r in records:
        n = len(r["data"])
        if out[-1] and (len(out[-1]) >= BATCH or size + n > BATCH_BYTES):
            out.append([])
            size = 0
        out[-1].append(r)
        size += n
    return out


async def _nothing(position: Any) -> None:
    """A redrive's shard stores no checkpoint: it reads no stream."""


class Redrive:
    """One run (see the module): ``await Redrive(server).run(timeout)`` -> ``RedriveResult``."""

    def __init__(self, server: Any) -> None:  # the Server (its parts, coordinator, attach)
        self.server = server
        now = time.time()
        self.run_id = "redrive-" + utc_timestamp(now).replace("-", "").replace(":", "").replace(".", "")
        self.result = RedriveResult(self.run_id)

    async def run(self, timeout: float) -> RedriveResult:
        started = time.perf_counter()
        server, result = self.server, self.result
        dead_letters = server.parts.dead_letters
        found, result.left = await asyncio.to_thread(read_letters, *dead_letters.files())
        log.info("redrive_started", run=self.run_id, shards=len(found),
                 records=sum(len(f.entries) for f in found), dead_letters=sum(map(_count, found)), left=result.left)
        feeds: list[tuple[Letters, Feed, Collected]] = []
        try:
            for letters in found:
                feeds.append(await self._send(letters))
            outcomes = [(letters, self._failed(collected, letters)) for letters, _, collected in feeds]
            committed = await self._committed([(feed.shard_id, feed.delivered) for _, feed, _ in feeds], timeout)
            for (letters, failed), redrive_id, done in zip(outcomes, [feed.shard_id for _, feed, _ in feeds],
                                                           committed):
                await self._settle(letters, redrive_id, failed, done, timeout)
        finally:
            for _, feed, _ in feeds:
                await _close(feed)
        log.info("redrive_finished", run=self.run_id, redriven=result.redriven, failed_again=result.failed_again,
                 left=result.left, not_committed=result.not_committed,
                 duration_ms=round((time.perf_counter() - started) * 1000, 3))
        return result

    async def _send(self, letters: Letters) -> tuple[Letters, Feed, Collected]:
        """The file's records through a connection of the redrive's own; what failed
        again is in the Collected returned."""
        collected = Collected(letters.path, log)
        ours, theirs = socket.socketpair()
        try:
            await self.server.attach(theirs, redrive=collected)
        except BaseException:
            theirs.close()
            ours.close()
            raise
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=LINE_LIMIT)
        feed = Feed(reader, writer, f"{self.run_id}:{letters.shard_id}", store=_nothing)
        try:
            await feed.initialize("TRIM_HORIZON")
            for batch in _batches(letters.records(self._now_ms())):
                await feed.process_records(batch, 0)
        except BaseException:
            await _close(feed)
            raise
        return letters, feed, collected

    def _now_ms(self) -> int:
        coordinator = self.server.coordinator
        return int(coordinator.clock()) if coordinator is not None else wall_clock_ms()

    @staticmethod
    def _failed(collected: Collected, letters: Letters) -> dict[Position, str]:
        """The positions that failed again, and why. An entry without a position (which
        a redrive's batch should never make) fails the whole file: nothing is removed."""
        failed: dict[Position, str] = {}
        for entry in collected.entries:
            position = Position.parse(entry.get("sequence_number"), entry.get("sub_sequence_number") or 0)
            error = str(entry.get("error") or entry.get("reason"))
            if position is None:
                return {p: error for p in letters.entries}
            failed.setdefault(position, error)
        return failed

    async def _committed(self, sent: list[tuple[str, Position | None]], timeout: float) -> list[bool]:
        """For each redrive shard, whether its rows were committed within ``timeout``
        (with no sink: at once, the handler has taken them)."""
        coordinator = self.server.coordinator
        if coordinator is None:
            return [True] * len(sent)

        def done(shard_id: str, last: Position | None) -> bool:
            safe = coordinator.safe_position(shard_id)
            return last is None or (safe is not None and safe >= last)

        deadline = time.monotonic() + timeout
        coordinator.committer.wake()
        while not all(done(*s) for s in sent):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(coordinator.committer.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return [done(*s) for s in sent]

    async def _settle(self, letters: Letters, redrive_id: str, failed: dict[Position, str], committed: bool,
                      timeout: float) -> None:
        """Remove what is committed; count and report the rest."""
        result = self.result
        if failed:
            for position in sorted(failed):
                result.failures.append({"shard_id": letters.shard_id, "sequence_number": position.text,
                                        "sub_sequence_number": position.sub, "error": failed[position]})
                result.failed_again += len(letters.lines[position])
            first = min(failed)
            log.warning("redrive_failed_again", run=self.run_id, shard_id=letters.shard_id, redrive_shard=redrive_id,
                        records=len(failed), sequence_numbers=[p.text for p in sorted(failed)[:10]],
                        error=failed[first], path=str(letters.path),
                        what_to_do="their dead letters are kept: fix the handler, mldserver reload, and redrive again")
        done = [p for p in letters.entries if p not in failed]
        if not committed:
            kept = sum(len(letters.lines[p]) for p in done)
            result.not_committed += kept
            result.left += kept
            log.warning("redrive_not_committed", run=self.run_id, shard_id=letters.shard_id,
                        redrive_shard=redrive_id, records=len(done), timeout_s=timeout,
                        what_to_do="their dead letters are kept (the sink may commit the rows later: a redrive "
                                   "then sends them again, a duplicate at worst); see sink_commit_failed, or "
                                   "give --timeout more than the window and its watermark margin")
            return
        if not done:
            return
        removed = await self.server.parts.dead_letters.remove(
            letters.path, {line for p in done for line in letters.lines[p]})
        result.redriven += removed
        log.info("redriven", run=self.run_id, shard_id=letters.shard_id, redrive_shard=redrive_id, records=len(done),
                 dead_letters=removed, path=str(letters.path))


def _count(letters: Letters) -> int:
    return sum(map(len, letters.lines.values()))


async def _close(feed: Feed) -> None:
    """The redrive's connection ended in order: its shutdown answered, then closed."""
    try:
        await feed.shutdown_requested()
    except FeedClosed:
        pass
    await feed.close()


async def redrive(server: Any, timeout: float) -> RedriveResult:
    """A run, refused (``Busy``) while paused, shutting down, or with one under way."""
    if server.paused:
        raise Busy("the server is paused: resume it (mldserver resume) and redrive again")
    if not server.listening:
        raise Busy("the server is not serving (starting or shutting down)")
    return await Redrive(server).run(timeout)
