"""Durable files: whole or not at all, fsynced, named safely from network data."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mldserver.base.backoff import Backoff
from mldserver.base.durable import (
    MAX_NAME,
    append_fsync,
    atomic_write,
    fsync_dir,
    on_blocked,
    publish_dir,
    safe_filename,
    until_written,
    utc_timestamp,
)
from mldserver.base.logs import get_logger

from .faults.conftest import SmallFs
from .helpers import small_tmpfs

# Any text, and ids close to real ones, where an escaped character meets its escape.
shard_ids = st.text(max_size=300) | st.from_regex(r"shardId-[0-9]{12}[_/. -]?[0-9a-f_/]{0,4}", fullmatch=True)


def test_real_shard_ids_keep_their_names():
    for shard_id in ("shardId-000000000001", "shardId-00000001536019433976-a7d8b1e9", "shard.v2-7"):
        assert safe_filename(shard_id) == shard_id


def test_ids_that_an_underscore_used_to_merge_get_different_names():
    assert safe_filename("shardId-x_1") != safe_filename("shardId-x/1")
    assert safe_filename("shardId-x/1") == "shardId-x_2f1"


@settings(max_examples=500)
@given(shard_ids, shard_ids)
def test_two_different_ids_never_share_a_name(a, b):
    if a != b:
        assert safe_filename(a) != safe_filename(b)


@given(shard_ids)
def test_a_name_is_a_plain_file_name(shard_id):
    name = safe_filename(shard_id)
    assert re.fullmatch(r"[A-Za-z0-9._~-]*", name)
    assert not name.startswith(".")
    assert len(name) <= MAX_NAME


def test_a_huge_id_gives_a_bounded_name_that_can_be_created(tmp_path):
    huge = "shardId-" + "9" * 5000
    name = safe_filename(huge)
    assert len(name) <= MAX_NAME and name.startswith("shardId-999")
    assert name != safe_filename(huge + "9")
    atomic_write(tmp_path / f"{name}.late.jsonl", b"ok\n")  # room left for a suffix and the temporary name
    assert (tmp_path / f"{name}.late.jsonl").read_bytes() == b"ok\n"


def test_dot_names_are_escaped():
    assert safe_filename(".") == "_2e" and safe_filename("..") == "_2e."
    assert safe_filename("") == ""


def test_atomic_write_replaces_the_file_and_leaves_no_temporary_name(tmp_path):
    path = tmp_path / "w.json"
    atomic_write(path, b"old")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.json"]


def test_append_fsync_appends_and_creates_the_folder(tmp_path):
    path = tmp_path / "dead-letters" / "s.jsonl"
    append_fsync(path, b"a\n")
    append_fsync(path, b"b\n")
    assert path.read_bytes() == b"a\nb\n"
    fsync_dir(path.parent)


def test_publish_dir_replaces_a_half_published_folder(tmp_path):
    staging = tmp_path / "_staging" / "w-1"
    staging.mkdir(parents=True)
    (staging / "part-0.parquet").write_bytes(b"new")
    final = tmp_path / "window=w"
    final.mkdir()
    (final / "part-9.parquet").write_bytes(b"half")
    publish_dir(staging, final)
    assert os.listdir(final) == ["part-0.parquet"] and not staging.exists()


def test_publish_dir_swaps_a_window_in_one_step_so_its_folder_is_never_missing_or_partial(tmp_path, monkeypatch):
    """An amended window's folder, looked at before and after every step publish_dir
    takes (each rename, swap and removal), is always there and always one version
    whole: a reader finds the old files or the new ones, never none, never a mix."""
    from mldserver.base import durable

    final = tmp_path / "window=w"
    final.mkdir()
    (final / "part-0.parquet").write_bytes(b"0")
    seen: list = []

    def look() -> None:
        seen.append(tuple(sorted(os.listdir(final))) if final.exists() else None)

    def watched(step):
        def run(*args, **kwargs):
            look()
            result = step(*args, **kwargs)
            look()
            return result
        return run

    monkeypatch.setattr(durable.os, "rename", watched(os.rename))
    monkeypatch.setattr(shutil, "rmtree", watched(shutil.rmtree))  # (durable imports it where it uses it)
    monkeypatch.setattr(durable, "_exchange", watched(durable._exchange))
    for version in range(1, 4):
        staging = tmp_path / "_staging" / f"w-{version}"
        staging.mkdir(parents=True)
        for part in range(3):
            (staging / f"part-{version}-{part}.parquet").write_bytes(b"x")
        publish_dir(staging, final)
        assert not staging.exists()
    whole = {("part-0.parquet",)} | {tuple(f"part-{v}-{p}.parquet" for p in range(3)) for v in range(1, 4)}
    assert seen and set(seen) <= whole, [s for s in seen if s not in whole]
    assert os.listdir(tmp_path / "_staging") == []


def test_publish_dir_without_an_atomic_swap_renames_the_old_folder_aside(tmp_path, monkeypatch):
    """A file system with no RENAME_EXCHANGE: the old folder is renamed aside, then
    removed: the window is briefly absent, never half there."""
    from mldserver.base import durable

    monkeypatch.setattr(durable, "_exchange", lambda a, b: False)
    final = tmp_path / "window=w"
    final.mkdir()
    (final / "part-old.parquet").write_bytes(b"old")
    staging = tmp_path / "_staging" / "w-1"
    staging.mkdir(parents=True)
    (staging / "part-new.parquet").write_bytes(b"new")
    publish_dir(staging, final)
    assert os.listdir(final) == ["part-new.parquet"]
    assert os.listdir(tmp_path / "_staging") == []


def test_utc_timestamp_is_iso_to_the_millisecond():
    assert utc_timestamp(1763719265.125) == "2025-11-21T10:01:05.125Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", utc_timestamp())


@pytest.fixture
def small_fs(tmp_path):
    """A real 256 KiB tmpfs (a disk that fills up); needs root, as the fault tests do."""
    with small_tmpfs(tmp_path / "small", "256k") as path:
        yield SmallFs(path)


def test_an_append_that_fails_half_way_leaves_the_file_as_it_was(small_fs):
    path = small_fs.path / "dead-letters" / "s.jsonl"
    append_fsync(path, b'{"n":1}\n')
    small_fs.fill(keep=4096)  # room for part of the next append, not all of it
    with pytest.raises(OSError) as failed:
        append_fsync(path, b'{"n":2,"data":"' + b"x" * 50_000 + b'"}\n')
    assert failed.value.errno == errno.ENOSPC
    assert path.read_bytes() == b'{"n":1}\n'
    small_fs.free()
    append_fsync(path, b'{"n":3}\n')
    assert path.read_bytes() == b'{"n":1}\n{"n":3}\n'


@pytest.mark.parametrize("tail", [b'{"n":2,"da', b"x" * 200_000], ids=["short", "longer_than_a_read"])
def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path, tail):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"n":1}\n' + tail)  # a crash in the middle of a write
    append_fsync(path, b'{"n":3}\n')
    assert path.read_bytes() == b'{"n":1}\n{"n":3}\n'
    torn_alone = tmp_path / "t.jsonl"
    torn_alone.write_bytes(tail)
    append_fsync(torn_alone, b'{"n":3}\n')
    assert torn_alone.read_bytes() == b'{"n":3}\n'


def test_an_atomic_write_on_a_full_disk_leaves_no_temporary_file(small_fs):
    path = small_fs.path / "spool" / "s.jsonl"
    path.parent.mkdir()
    atomic_write(path, b"old\n")
    small_fs.fill()
    with pytest.raises(OSError):
        atomic_write(path, b"x" * 100_000)
    assert os.listdir(path.parent) == ["s.jsonl"] and path.read_bytes() == b"old\n"


class Slot:
    """What a shard's task holds (its wire's in-flight slot), given back by a bound method."""

    def __init__(self, given_back: list) -> None:
        self.given_back = given_back

    def release(self) -> None:
        self.given_back.append(1)


@pytest.mark.parametrize("callback", ["function", "bound method"])
async def test_a_failing_write_is_logged_once_retried_and_its_task_gives_back_what_it_holds(tmp_path, caplog,
                                                                                             callback):
    caplog.set_level(logging.INFO, logger="mldserver")
    path = tmp_path / "s.jsonl"
    attempts, given_back = [], []
    slot = Slot(given_back)  # (held by the test: on_blocked holds a bound method weakly)

    def write():
        attempts.append(1)
        if len(attempts) <= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return append_fsync(path, b"ok\n")

    async def shard_task():
        on_blocked(slot.release if callback == "bound method" else lambda: given_back.append(1))
        return await until_written(write, path, get_logger("mldserver.test"), what="dead letter",
                                   backoff=Backoff(first=0.001, cap=0.001), shard_id="s")

    assert await asyncio.create_task(shard_task()) == path
    assert path.read_bytes() == b"ok\n" and len(attempts) == 4 and given_back == [1]
    [failed] = [r.fields for r in caplog.records if r.getMessage() == "state_write_failed"]
    assert failed["path"] == str(path) and failed["errno"] == "ENOSPC" and failed["shard_id"] == "s"
    assert "No space left on device" in failed["error"] and "free space" in failed["what_to_do"]
    [recovered] = [r.fields for r in caplog.records if r.getMessage() == "state_write_recovered"]
    assert recovered["attempts"] == 4


async def test_a_write_that_succeeds_logs_nothing_and_gives_back_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mldserver")
    given_back = []
    on_blocked(lambda: given_back.append(1))
    path = tmp_path / "s.jsonl"
    assert await until_written(lambda: append_fsync(path, b"a\n"), path, get_logger("mldserver.test"), what="x") == path
    assert given_back == [] and not [r for r in caplog.records if r.getMessage().startswith("state_write")]
