"""A large file written once and fsynced, past the page cache (``O_DIRECT``) where the
file system allows it: a window's rows in the file sink (``durable.atomic_write(...,
direct=True)``).

A file that is fsynced as soon as it is written gains nothing from the page cache: the
disk is waited for either way. Written through it, every byte is copied by the kernel
into pages it allocates, charges and later writes back, which costs more CPU than
anything else on the way (400 MB of JSON lines: 0.1 to 1 s of system time, by how full
the cache is, against 0.01 s with ``O_DIRECT``, for the same wall time on this
project's machines). With ``O_DIRECT`` the disk reads the bytes from the process's own
memory, which must be aligned: the chunks are copied into a page-aligned staging
buffer (a user-space copy, some ten times cheaper) and written from there a whole
number of blocks at a time; the last part of a block is written through the page cache
(``O_DIRECT`` cleared with ``fcntl``)::

    write_synced(Path("out/_0-60000.jsonl.tmp"), window.rows.chunks())  # then renamed

A file system that refuses ``O_DIRECT`` (ramfs, tmpfs before Linux 6.6, some network
and FUSE file systems: ``EINVAL`` at the open or the first write), or a system without it, gets the same bytes
through the page cache. Either way the file is fsynced before this returns.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path
from typing import Any, Iterable

O_DIRECT = getattr(os, "O_DIRECT", 0)
BLOCK = 4096  # what O_DIRECT's addresses, lengths and offsets are aligned to (a page: any device's block divides it)
STAGE = 4 << 20  # the staging buffer: each write to the disk is this much, but the last


def write_synced(path: Path | str, chunks: Iterable[Any]) -> None:
    """Create (or truncate) ``path``, write the buffers one after another, fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    fd = None
    if O_DIRECT:
        try:
            fd = os.open(path, flags | O_DIRECT, 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    if fd is None:
        fd = os.open(path, flags, 0o644)
        try:
            for chunk in chunks:
                _write(fd, memoryview(chunk).cast("B"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    try:
        _staged(fd, chunks)
        os.fsync(fd)
    finally:
        os.close(fd)


_stages: list[mmap.mmap] = []  # staging buffers free for the next file, their pages kept


def _staged(fd: int, chunks: Iterable[Any]) -> None:
    """The chunks through a staging buffer (one of ``_stages``, or a new one: a file
    written while another is, in another thread)."""
    try:
        buffer = _stages.pop()
    except IndexError:
        buffer = mmap.mmap(-1, STAGE)  # page-aligned, as O_DIRECT needs
    try:
        _through(fd, chunks, buffer)
    finally:
        _stages.append(buffer)


def _through(fd: int, chunks: Iterable[Any], buffer: mmap.mmap) -> None:
    """Whole blocks with ``O_DIRECT``, the tail through the page cache. A chunk that
    starts on a block's edge while the staging buffer is empty is written from where it
    is, its whole blocks at least (``merge`` gathers a window's interleaved rows so,
    a block at a time: copied once, not twice); the rest is copied into the staging
    buffer. The copies are numpy's, which let go of the GIL (a memoryview's hold it:
    the event loop would wait for every megabyte copied here)."""
    import numpy as np

    stage = np.frombuffer(buffer, dtype=np.uint8)
    view = memoryview(buffer)
    try:
        direct, fill = True, 0
        for chunk in chunks:
            data = np.frombuffer(chunk, dtype=np.uint8)
            whole = len(data) - len(data) % BLOCK
            if direct and fill == 0 and whole and data.ctypes.data % BLOCK == 0:
                direct = _write(fd, memoryview(data)[:whole], direct)
                data = data[whole:]
            while len(data):
                n = min(len(data), STAGE - fill)
                stage[fill : fill + n] = data[:n]
                data = data[n:]
                fill += n
                if fill == STAGE:
                    direct = _write(fd, view, direct)
                    fill = 0
        whole = fill - fill % BLOCK
        if whole:
            direct = _write(fd, view[:whole], direct)
        if fill > whole:
            if direct:
                direct = _buffered(fd)
            _write(fd, view[whole:fill])
    finally:
        view.release()


def _write(fd: int, data: memoryview, direct: bool = False) -> bool:
    """All of ``data``; whether the file is still written with ``O_DIRECT`` after."""
    while data:
        try:
            n = os.write(fd, data)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            direct = _buffered(fd)  # opened with O_DIRECT, yet the file system will not write so
            continue
        data = data[n:]
        if data and direct:
            direct = _buffered(fd)  # a short write left the offset unaligned
    return direct


def _buffered(fd: int) -> bool:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)
    return False
