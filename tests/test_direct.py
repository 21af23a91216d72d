"""A large file written once past the page cache: every byte, in order, fsynced, with
O_DIRECT where the file system takes it and through the page cache where it does not."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from mldserver.base import direct
from mldserver.base.direct import BLOCK, O_DIRECT, STAGE, write_synced
from mldserver.base.durable import atomic_write

from .helpers import mounted

SIZES = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, STAGE - 1, STAGE, STAGE + 1, 2 * STAGE + BLOCK + 17]


def open_flags(path: Path) -> int:
    """The flags this process opened ``path`` with (``/proc/self/fdinfo``)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
                    if line.startswith("flags:"):
                        return int(line.split()[1], 8)
        except OSError:
            continue
    raise AssertionError(f"{path} is not open")


def pieces(data: bytes, cuts: list[int]):
    """``data`` in pieces cut at ``cuts``, as memoryviews (what ``JsonLines.chunks`` gives)."""
    edges = [0, *cuts, len(data)]
    for a, b in zip(edges, edges[1:]):
        yield memoryview(data)[a:b]


@pytest.mark.parametrize("size", SIZES)
def test_every_byte_is_written_in_order_across_block_and_stage_edges(tmp_path, size):
    data = os.urandom(size)
    cuts = sorted({min(size, c) for c in (1, 7, BLOCK + 3, STAGE - 2, STAGE + BLOCK)})
    write_synced(tmp_path / "out", pieces(data, cuts))
    assert (tmp_path / "out").read_bytes() == data


def test_the_file_is_written_with_o_direct_where_the_file_system_takes_it(tmp_path):
    path = tmp_path / "out"
    seen = []

    def chunks():
        yield b"x" * (STAGE + 10)  # a whole stage is written before the next chunk is asked for
        seen.append(open_flags(path))
        yield b"y" * 10

    write_synced(path, chunks())
    assert O_DIRECT and seen[0] & O_DIRECT, f"flags {seen[0]:o}: the file was not opened with O_DIRECT"
    assert path.read_bytes() == b"x" * (STAGE + 10) + b"y" * 10


def test_a_file_system_that_refuses_o_direct_gets_the_same_bytes_through_the_page_cache(tmp_path):
    with mounted(tmp_path / "ramfs", "ramfs") as folder:  # ramfs: open(O_DIRECT) is EINVAL
        with pytest.raises(OSError) as refused:
            os.close(os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | O_DIRECT))
        assert refused.value.errno == errno.EINVAL
        data = os.urandom(STAGE + 12_345)
        atomic_write(folder / "out.jsonl", pieces(data, [100, STAGE]), direct=True)
        assert (folder / "out.jsonl").read_bytes() == data
        assert not [p.name for p in folder.iterdir() if p.name.startswith("_")]  # no temporary file left


def test_the_staging_buffer_is_reused_file_after_file(tmp_path):
    write_synced(tmp_path / "a", [b"a" * 10])
    kept = list(direct._stages)
    write_synced(tmp_path / "b", [b"b" * (BLOCK * 3)])
    assert direct._stages == kept and len(kept) == 1
    assert (tmp_path / "b").read_bytes() == b"b" * (BLOCK * 3)


def test_a_failed_write_leaves_no_temporary_file_and_the_buffer_free(tmp_path):
    def chunks():
        yield b"z" * (BLOCK + 1)
        raise RuntimeError("the rows could not be read")

    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "w.jsonl", chunks(), direct=True)
    assert list(tmp_path.iterdir()) == []
    assert len(direct._stages) >= 1


def test_a_write_o_direct_refuses_is_made_through_the_page_cache(tmp_path):
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT | O_DIRECT, 0o644)
    try:
        still_direct = direct._write(fd, memoryview(b"abc"), True)  # not a whole block: EINVAL
        assert not open_flags(tmp_path / "out") & O_DIRECT
    finally:
        os.close(fd)
    assert still_direct is False
    assert (tmp_path / "out").read_bytes() == b"abc"


def test_a_chunk_on_a_block_edge_is_written_from_where_it_is_not_copied_into_the_staging_buffer(tmp_path,
                                                                                                 monkeypatch):
    import mmap

    import numpy as np

    writes = []  # (address, length) of each write's bytes
    real_write = os.write

    def write(fd, data):
        writes.append((np.frombuffer(data, dtype=np.uint8).ctypes.data, len(data)))
        return real_write(fd, data)

    first, second = (np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8) for size in (3 * BLOCK, 2 * BLOCK))
    first[:] = 1
    second[:] = 2
    tail = b"t" * 100
    monkeypatch.setattr(direct.os, "write", write)
    write_synced(tmp_path / "out", [memoryview(first), memoryview(second), tail, memoryview(first)])
    monkeypatch.undo()
    assert (tmp_path / "out").read_bytes() == bytes(first) + bytes(second) + tail + bytes(first)
    assert writes[:2] == [(first.ctypes.data, 3 * BLOCK), (second.ctypes.data, 2 * BLOCK)]
    assert all(address != first.ctypes.data for address, _ in writes[2:])  # after the tail: staged
