"""Files that survive a crash: the few ways mldserver puts bytes on disk, written once.

- ``atomic_write(path, data)``: the whole file or the old one, never half of one. The
  bytes go to ``_<name>.tmp`` beside it (readers skip ``_`` names), are fsynced, renamed
  over ``path``, and the folder is fsynced so the rename itself survives a power cut::

      atomic_write(Path("out/_commits/1763719200000-1763719260000.json"), b'{"rows": 812}')
      atomic_write(Path("out/0-60000.jsonl"), window.rows.chunks(), direct=True)
      # buffers one after another; ``direct``: past the page cache (``direct.py``)

- ``append_fsync(path, data)``: append and fsync (dead letters), whole lines or nothing:
  a write that fails or falls short is cut back to the size before it, and a file found
  ending in a torn line (a crash mid-write) has that tail cut first. A new file's folder
  is fsynced too.
- ``publish_dir(staging, final)``: a folder written elsewhere (Spark's output) made
  durable and put in place of ``final`` in one step (``renameat2`` with
  ``RENAME_EXCHANGE``): a reader listing ``final`` while a window is amended sees the
  old files or the new ones, never an empty or half-deleted folder. The old folder
  leaves under ``staging``'s name (``_``: readers skip it) and is removed after.
- ``fsync_dir(folder)``: make the names in a folder durable.
- ``empty_dir(folder)``: a scratch folder emptied at start-up (the Spark sinks' input
  files, the coordinator's spill): what a crash left there goes.
- ``utc_timestamp()``: ``"2026-11-21T10:01:05.120Z"``, the form every log line, commit-log
  entry and dead letter carries; ``wall_clock_ms()``: now in epoch milliseconds, the form
  of event times and timers' due times.
- ``safe_filename(shard_id)``: a name made from data that arrives from the network
  (a shard id), injective and bounded in length, yet readable for real ids::

      safe_filename("shardId-000000000001")  -> "shardId-000000000001"
      safe_filename("shardId-x/1")           -> "shardId-x_2f1"
      safe_filename("shardId-x_1")           -> "shardId-x_5f1"
      safe_filename("x" * 5000)              -> "xxx...xxx~<sha256 hex>"   (185 characters)

All of the above blocks (the event loop runs it in a thread). ``until_written`` is how
the state directory's writers (dead letters, the spool) do that and wait out a failing
disk (ENOSPC, EIO, EFBIG...): the failure is logged once with the path, the errno and
what to do, the write is retried with backoff until it succeeds, and the caller (a
shard's status) waits for it: nothing is lost, the daemon waits. A task that holds
something others need while it waits (a shard's in-flight slot) says so once with
``on_blocked(give_back)``::

    on_blocked(wire.release)      # in the shard driver's task
    await until_written(lambda: append_fsync(path, data), path, log, what="dead letter")
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import hashlib
import os
import re
import time
import types
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, TypeVar

from .backoff import Backoff
from .direct import write_synced

T = TypeVar("T")


class Log(Protocol):
    """What ``until_written`` logs through (a ``logs.EventLogger``; ``logs`` imports this
    module for its timestamps, so it is not imported here)."""

    def error(self, event: str, exc_info: Any = None, **fields: Any) -> None: ...

    def warning(self, event: str, **fields: Any) -> None: ...

# A name made by safe_filename is at most this long, leaving room for a prefix and a
# suffix ("_", ".late.jsonl", ".tmp") under the usual 255-byte limit of a file name.
MAX_NAME = 185
_KEEP = 120  # readable characters kept in front of the hash of a name too long
_ESCAPE = re.compile(r"[^A-Za-z0-9.-]")  # "_" is the escape character, so it is escaped too


def safe_filename(text: str) -> str:
    """``text`` as a file name: letters, digits, ``-`` and ``.`` stay as they are, every
    other character becomes ``_`` and the hex of its UTF-8 bytes (so two texts never
    share a name), and a leading ``.`` is escaped (no hidden files, no ``.``/``..``).
    Past MAX_NAME, the name is its readable start, ``~`` (which no escaped name
    contains) and the SHA-256 of the text."""
    name = _ESCAPE.sub(lambda m: "".join(f"_{b:02x}" for b in m.group().encode()), text)
    if name.startswith("."):
        name = "_2e" + name[1:]
    if len(name) > MAX_NAME:
        name = f"{name[:_KEEP]}~{hashlib.sha256(text.encode()).hexdigest()}"
    return name


def utc_timestamp(now: float | None = None) -> str:
    """UTC to the millisecond, ISO 8601 with a ``Z``: ``2026-11-21T10:01:05.120Z``."""
    if now is None:
        now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def wall_clock_ms() -> int:
    """Now, in epoch milliseconds (an int, as every event time and timer's due time is)."""
    return time.time_ns() // 1_000_000


def fsync_dir(path: Path) -> None:
    """Make the names in a folder (files created, renamed, deleted) durable."""
    _fsync(path)


def _fsync(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | Iterable[Any], *, direct: bool = False) -> Path:
    """Write ``path`` whole: a temporary name, fsync, rename, fsync the folder. ``data``
    is bytes, or buffers written one after another (a window's rows, a run at a time).
    ``direct``: past the page cache where the file system allows (``direct``: a large
    file nobody reads soon). On an error the temporary file is removed: a failed write
    leaves nothing behind."""
    tmp = path.with_name(f"_{path.name}.tmp")
    chunks = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        if direct:
            write_synced(tmp, chunks)
        else:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def append_fsync(path: Path, data: bytes) -> Path:
    """Append ``data`` (whole lines) to ``path`` (created with its folder if need be)
    and fsync it. Whole or absent: on an error the file is cut back to its size before
    the write; a torn last line found there (a crash mid-write) is cut off first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = cut_torn_tail(fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, size)  # shrinking needs no space: a full disk allows it
            except OSError:
                pass  # the next append cuts the torn tail
            raise
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)
    return path


def cut_torn_tail(fd: int) -> int:
    """Cut an open file of lines back to its last newline; return its size then."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    os.ftruncate(fd, end)
    return end


# -- waiting out a failing disk --------------------------------------------------------

_ON_BLOCKED: contextvars.ContextVar[Callable[[], Callable[[], None] | None] | None] = contextvars.ContextVar(
    "mldserver_on_blocked", default=None
)  # a reference to the callback: weak for a bound method
RETRY = Backoff(first=0.2, cap=5.0)  # between attempts at a write that failed


def on_blocked(give_back: Callable[[], None] | None) -> None:
    """For the calling task (and what it awaits): what to give back when one of its
    writes starts waiting out a failing disk, so that others are not held up (a
    shard's in-flight slot). Called once per blocked write.

    A bound method is held weakly: a copy of the task's context outlives the task (a
    timer it started and cancelled keeps one, on asyncio's loop until the timer's time
    comes), and must not keep the method's object (a closed connection's wire and its
    read buffer) alive with it."""
    if give_back is None:
        _ON_BLOCKED.set(None)
    elif isinstance(give_back, types.MethodType):
        _ON_BLOCKED.set(weakref.WeakMethod(give_back))
    else:
        _ON_BLOCKED.set(lambda: give_back)


async def until_written(
    write: Callable[[], T], path: Path, log: Log, *, what: str, backoff: Backoff = RETRY, **fields: object
) -> T:
    """Run the blocking ``write`` in a thread until it succeeds; return its result.
    An OSError is logged once (``state_write_failed``: path, errno, what to do), the
    task's ``on_blocked`` callback runs, and the write is retried with backoff;
    ``state_write_recovered`` says when it finally went through."""
    attempt = 0
    started = time.monotonic()
    while True:
        try:
            result = await asyncio.to_thread(write)
        except OSError as exc:
            if attempt == 0:
                log.error(
                    "state_write_failed",
                    what=what,
                    path=str(path),
                    errno=errno.errorcode.get(exc.errno or 0, exc.errno),
                    error=f"{type(exc).__name__}: {exc}",
                    what_to_do=f"free space on (or repair) the file system holding {path.parent}; the write is "
                    "retried until it succeeds, and the shard's status waits for it (nothing is lost)",
                    **fields,
                )
                held = _ON_BLOCKED.get()
                give_back = held() if held is not None else None
                if give_back is not None:
                    give_back()
            await asyncio.sleep(backoff.delay(min(attempt, 20)))
            attempt += 1
            continue
        if attempt:
            log.warning(
                "state_write_recovered",
                what=what,
                path=str(path),
                attempts=attempt + 1,
                waited_ms=round((time.monotonic() - started) * 1000),
                **fields,
            )
        return result


def empty_dir(path: Path) -> Path:
    """``path`` as an empty folder, made if missing: a scratch folder at start-up,
    whose files a crash may have left (nothing in it is kept across a restart)."""
    import shutil  # (here and below: a handler process, which imports this module, needs none of it)

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def publish_dir(staging: Path, final: Path) -> Path:
    """Fsync every file under ``staging``, put it in place of ``final`` and fsync the
    folder holding ``final``. A ``final`` already there (an amended window, or one
    published before a crash but never recorded) is swapped out in one step and then
    removed; where the file system cannot swap, it is renamed aside first (``final`` is
    then briefly absent, never half there)."""
    import shutil

    for root, _, files in os.walk(staging):
        for name in files:
            _fsync(os.path.join(root, name))
    if not final.exists():
        os.rename(staging, final)
    elif _exchange(staging, final):
        shutil.rmtree(staging)  # now the old folder
    else:
        aside = staging.with_name(f"{staging.name}.old")
        os.rename(final, aside)
        os.rename(staging, final)
        shutil.rmtree(aside)
    fsync_dir(final.parent)
    return final


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two names atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    C library or the file system has no such call."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))
