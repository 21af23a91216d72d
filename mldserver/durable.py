"""Files that survive a crash: the few ways mldserver puts bytes on disk, written once.

- ``atomic_write(path, data)``: the whole file or the old one, never half of one. The
  bytes go to ``_<name>.tmp`` beside it (readers skip ``_`` names), are fsynced, renamed
  over ``path``, and the folder is fsynced so the rename itself survives a power cut::

      atomic_write(Path("out/_commits/1763719200000-1763719260000.json"), b'{"rows": 812}')

- ``append_fsync(path, data)``: append and fsync (dead letters); a new file's folder is
  fsynced too.
- ``publish_dir(staging, final)``: a folder written elsewhere (Spark's output) made
  durable and renamed into place, replacing a half-published one.
- ``fsync_dir(folder)``: make the names in a folder durable.
- ``utc_timestamp()``: ``"2026-11-21T10:01:05.120Z"``, the form every log line, commit-log
  entry and dead letter carries.
- ``safe_filename(shard_id)``: a name made from data that arrives from the network
  (a shard id), injective and bounded in length, yet readable for real ids::

      safe_filename("shardId-000000000001")  -> "shardId-000000000001"
      safe_filename("shardId-x/1")           -> "shardId-x_2f1"
      safe_filename("shardId-x_1")           -> "shardId-x_5f1"
      safe_filename("x" * 5000)              -> "xxx...xxx~<sha256 hex>"   (185 characters)

All of it blocks: the event loop calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

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


def fsync_dir(path: Path) -> None:
    """Make the names in a folder (files created, renamed, deleted) durable."""
    _fsync(path)


def _fsync(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> Path:
    """Write ``path`` whole: a temporary name, fsync, rename, fsync the folder."""
    tmp = path.with_name(f"_{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def append_fsync(path: Path, data: bytes) -> Path:
    """Append ``data`` to ``path`` (created with its folder if need be) and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)
    return path


def publish_dir(staging: Path, final: Path) -> Path:
    """Fsync every file under ``staging``, then rename it to ``final`` (replacing a
    folder left there by a crash before the publication was recorded) and fsync the
    folder holding ``final``."""
    for root, _, files in os.walk(staging):
        for name in files:
            _fsync(os.path.join(root, name))
    if final.exists():
        shutil.rmtree(final)
    os.rename(staging, final)
    fsync_dir(final.parent)
    return final
