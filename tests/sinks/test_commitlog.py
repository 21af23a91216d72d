"""The commit log: entries written durably, read back as per-shard highest positions."""

from __future__ import annotations

from mldserver.base.positions import Position
from mldserver.base.commitlog import CommitLog


def entry(start, positions):
    return {"window": f"{start}-{start + 10}", "start": start, "end": start + 10, "rows": 1, "late": 0,
            "rows_out": 1, "positions": positions}


def test_read_gives_each_shards_highest_position_and_the_last_end(tmp_path):
    log = CommitLog(tmp_path)
    log.append(entry(0, {"A": ["1000000000000000000000", 3], "B": ["7", 0]}))
    log.append(entry(10, {"A": ["999", 0]}))  # lower as an integer, higher as a string
    log.append(entry(20, {"A": ["1000000000000000000000", 5]}))
    committed = log.read()
    assert committed.positions == {"A": Position(10**21, 5, "1000000000000000000000"), "B": Position(7, 0, "7")}
    assert all(type(p) is Position for p in committed.positions.values())
    assert committed.end == 30 and committed.windows == 3


def test_an_entry_is_published_whole_and_names_its_window(tmp_path):
    log = CommitLog(tmp_path)
    assert not log.has("0-10") and log.read().end is None
    log.append(entry(0, {"A": ["1", None]}))
    assert log.has("0-10") and log.entry("0-10")["committed_at"].endswith("Z")
    assert [p.name for p in (tmp_path / "_commits").iterdir()] == ["0-10.json"]  # no temporary left
    assert log.read().positions == {"A": Position(1, 0, "1")}
