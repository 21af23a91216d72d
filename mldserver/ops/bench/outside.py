"""Faults from outside the handler, for the chaos campaign (``chaos.py``): the sink
broken and mended, the admin port flooded, and what health said meanwhile.

While a campaign drives the shards, ``disturb`` takes turns, in an order and at
intervals its seed picks, until told to stop:

    file    the sink's folder is replaced by a file (renamed aside, a file in its place),
            then put back
    full    the sink's disk is filled (a ballast file takes every free byte of its
            file system: give the sink a small tmpfs of its own), then the ballast goes
    flood   ``flood`` connections to the admin port send half a request each and hold
            (as a scanner or a broken client would), then let go

A sink fault is held until ``/readyz`` answers 503 (or ``UNREADY_WITHIN`` seconds
pass), and ``/status`` is read for the sink's error; once mended, ``/readyz`` is polled
until ready again. A flood is held ``FLOOD_HOLD`` seconds while the shards go on; once
let go, ``/status`` must answer again. What was seen is the ``Disturbance``::

    stop = asyncio.Event()
    disturbing = asyncio.create_task(disturb(seed=7, admin=("127.0.0.1", 7071), sink_dir=out,
                                             kinds=("file", "full", "flood"), stop=stop))
    report = await chaos.campaign(...)          # the shards, meanwhile
    stop.set()
    disturbance = await disturbing              # every fault mended before it returns
    for check in disturbance.checks(events):    # the server's log events, for shard_refused
        print(check)

and ``sink_rows(out)`` and ``spooled_rows(state_dir)`` say which rows the sink and the
shard-end spool hold, for "every checkpointed record's row committed or spooled, once"
(``chaos.checks``, ``rows=``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import orjson

from .common import Check

SINK_FAULTS = ("file", "full")
KINDS = (*SINK_FAULTS, "flood")
UNREADY_WITHIN = 30.0  # s: a broken sink turns /readyz not ready within this (the server's own is 10 s)
READY_WITHIN = 60.0  # s: a mended sink's next commit succeeds and /readyz is ready again
FLOOD_HOLD = 3.0  # s a flood's connections are held
FLOOD = 300  # connections a flood opens (the admin port's cap is 64)
POLL = 0.25


@dataclass
class Break:
    kind: str  # "file" or "full"
    at: float  # seconds into the disturbance
    unready_s: float | None = None  # from the break to /readyz 503 (None: not within UNREADY_WITHIN)
    after_traffic: bool = False  # the campaign ended before a commit could fail: nothing to tell
    error: str | None = None  # the sink's error /status carried meanwhile
    ready_s: float | None = None  # from mending to /readyz 200 (None: not within READY_WITHIN)


@dataclass
class Flood:
    at: float
    opened: int = 0  # connections the port accepted
    answered_s: float | None = None  # from letting go to /status answered (None: not within READY_WITHIN)


@dataclass
class Disturbance:
    breaks: list[Break] = field(default_factory=list)
    floods: list[Flood] = field(default_factory=list)

    def checks(self, events: Iterable[dict]) -> list[Check]:
        """Health told the truth about the sink; the admin port hurt no shard."""
        out = []
        silent = [b for b in self.breaks if b.unready_s is None and not b.after_traffic]
        late = [b for b in self.breaks if b.after_traffic]
        out.append(Check(f"/readyz not ready within {UNREADY_WITHIN:g} s of each sink break", not silent,
                         _times(self.breaks, "unready_s") + (f"; never: {_kinds(silent)}" if silent else "")
                         + (f"; begun as the traffic ended (nothing to commit): {_kinds(late)}" if late else "")))
        untold = [b for b in self.breaks if b.unready_s is not None and not b.error]
        out.append(Check("/status carried the broken sink's error", not untold,
                         f"{len(self.breaks) - len(untold)} of {len(self.breaks)}"
                         + (f"; without: {_kinds(untold)}" if untold else "")))
        stuck = [b for b in self.breaks if b.ready_s is None]
        out.append(Check("/readyz ready again once the sink was mended", not stuck,
                         _times(self.breaks, "ready_s") + (f"; never: {_kinds(stuck)}" if stuck else "")))
        refused = [e for e in events if e.get("event") == "shard_refused"]
        deaf = [f for f in self.floods if f.answered_s is None]
        out.append(Check("no shard refused, the admin port answering again after each flood",
                         not refused and not deaf,
                         f"{len(self.floods)} floods of {FLOOD} connections ({sum(f.opened for f in self.floods)} "
                         f"accepted in all); shards refused {len(refused)}"
                         + (f" ({refused[0].get('reason')})" if refused else "")
                         + (f"; no answer after {len(deaf)} floods" if deaf else "")))
        return out


def _kinds(breaks: list[Break]) -> str:
    return ", ".join(f"{b.kind} at {b.at:.0f} s" for b in breaks)


def _times(breaks: list[Break], attr: str) -> str:
    seen = [getattr(b, attr) for b in breaks if getattr(b, attr) is not None]
    if not seen:
        return f"{len(breaks)} breaks"
    return f"{len(breaks)} breaks, {min(seen):.1f}-{max(seen):.1f} s"


# -- talking to the admin port --------------------------------------------------------------------


async def get(admin: tuple[str, int], path: str, timeout: float = 5.0) -> tuple[int, bytes] | None:
    """One GET on its own connection: (status, body), or None if the port did not answer."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*admin), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {admin[0]}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    return int(parts[1]), body


async def _until(admin: tuple[str, int], path: str, want: int, within: float,
                 stop: asyncio.Event | None = None) -> float | None:
    """Seconds until ``GET path`` answers ``want`` (None: not within ``within``, or
    ``stop`` set first)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while loop.time() - began < within and not (stop is not None and stop.is_set()):
        answer = await get(admin, path)
        if answer is not None and answer[0] == want:
            return loop.time() - began
        await asyncio.sleep(POLL)
    return None


async def _sink_error(admin: tuple[str, int]) -> str | None:
    answer = await get(admin, "/status")
    if answer is None or answer[0] != 200:
        return None
    failing = ((orjson.loads(answer[1]) or {}).get("coordinator") or {}).get("sink_failing")
    return failing.get("error") if failing else None


# -- the faults -----------------------------------------------------------------------------------


def _break_file(sink_dir: Path) -> Path:
    aside = sink_dir.with_name(f"{sink_dir.name}.aside")
    sink_dir.rename(aside)
    sink_dir.write_bytes(b"the sink's folder was replaced by this file\n")
    return aside


def _mend_file(sink_dir: Path, aside: Path) -> None:
    sink_dir.unlink()
    aside.rename(sink_dir)


def _fill(sink_dir: Path) -> Path:
    """A ballast file beside the sink's folder taking every free byte of its file system."""
    ballast = sink_dir.with_name(f"_{sink_dir.name}.ballast")
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        disk = os.statvfs(fd)
        free = disk.f_bavail * disk.f_frsize
        try:
            os.posix_fallocate(fd, 0, max(free, 1))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        block = b"\0" * (1 << 16)
        while True:  # what fallocate left (blocks a file system keeps back)
            try:
                os.lseek(fd, 0, os.SEEK_END)
                os.write(fd, block)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    break
                raise
    finally:
        os.close(fd)
    return ballast


async def disturb(*, seed: int, admin: tuple[str, int], sink_dir: Path, stop: asyncio.Event,
                  kinds: Iterable[str] = KINDS, interval: float = 5.0) -> Disturbance:
    """Take turns with the faults ``kinds`` names (see the module docstring), a pause of
    about ``interval`` seconds between them, until ``stop`` is set; every fault is
    mended before this returns."""
    kinds = tuple(kinds)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}: choose from {KINDS}")
    rng = random.Random(f"{seed}/outside")
    loop = asyncio.get_running_loop()
    began = loop.time()
    out = Disturbance()
    order = Counter()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval * rng.uniform(0.5, 1.5))
            break
        except TimeoutError:
            pass
        kind = min(kinds, key=lambda k: (order[k], rng.random()))  # each in turn, in a seeded order
        order[kind] += 1
        at = loop.time() - began
        if kind == "flood":
            out.floods.append(await _flood(admin, at))
            continue
        brk = Break(kind, at)
        out.breaks.append(brk)
        if kind == "file":
            aside = await asyncio.to_thread(_break_file, sink_dir)
        else:
            ballast = await asyncio.to_thread(_fill, sink_dir)
        try:
            # Once the campaign is over no row is written, so no commit can fail: a break
            # begun so late is not held for the server to notice what never happened.
            brk.unready_s = await _until(admin, "/readyz", 503, UNREADY_WITHIN, stop)
            brk.after_traffic = brk.unready_s is None and stop.is_set()
            brk.error = await _sink_error(admin)
        finally:
            if kind == "file":
                await asyncio.to_thread(_mend_file, sink_dir, aside)
            else:
                await asyncio.to_thread(ballast.unlink)
        brk.ready_s = await _until(admin, "/readyz", 200, READY_WITHIN)
    return out


async def _flood(admin: tuple[str, int], at: float) -> Flood:
    flood = Flood(at)
    writers = []
    try:
        for _ in range(FLOOD):
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(*admin), 2.0)
            except (OSError, TimeoutError):
                continue
            writer.write(b"GET /status HTTP/1.1\r\nHost: flood\r\n")  # and never the end of the headers
            writers.append(writer)
        flood.opened = len(writers)
        await asyncio.sleep(FLOOD_HOLD)  # held while the shards go on (not a wait for a condition)
    finally:
        for writer in writers:
            writer.close()
    flood.answered_s = await _until(admin, "/status", 200, READY_WITHIN)
    return flood


# -- what the sink holds ----------------------------------------------------------------------------


def sink_rows(sink_dir: Path) -> Counter:
    """(shard id, sequence number) of every row the file sink committed, with how many
    times (``ChaosRowsHandler``'s rows: ``{"shard": ..., "seq": ...}``)."""
    seen: Counter = Counter()
    for path in Path(sink_dir).glob("*.jsonl"):
        if path.name.startswith("_"):
            continue
        for line in path.read_bytes().splitlines():
            row = orjson.loads(line)
            seen[(row["shard"], row["seq"])] += 1
    return seen


def spooled_rows(state_dir: Path) -> Counter:
    """The same, of the rows ended shards spooled (``<state-dir>/spool/``, replayed and
    committed at the server's next start): durable, so not lost."""
    seen: Counter = Counter()
    for path in (Path(state_dir) / "spool").glob("*.jsonl"):
        if path.name.startswith("_"):
            continue
        for line in path.read_bytes().splitlines()[1:]:  # after the header
            row = orjson.loads(line)[3]
            seen[(row["shard"], row["seq"])] += 1
    return seen
