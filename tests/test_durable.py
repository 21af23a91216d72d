"""Durable files: whole or not at all, fsynced, named safely from network data."""

from __future__ import annotations

import os
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from mldserver.durable import (
    MAX_NAME,
    append_fsync,
    atomic_write,
    fsync_dir,
    publish_dir,
    safe_filename,
    utc_timestamp,
)

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


def test_utc_timestamp_is_iso_to_the_millisecond():
    assert utc_timestamp(1763719265.125) == "2025-11-21T10:01:05.125Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", utc_timestamp())
