"""The commit log: entries written durably, read back as per-shard highest positions."""

from __future__ import annotations

from mldserver.base.positions import Position
from mldserver.spark.commitlog import CommitLog


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


def test_compaction_folds_the_older_entries_into_one_file_and_reads_the_same(tmp_path, monkeypatch):
    """Past COMPACT_AT entries the writer folds all but the newest KEEP into
    ``_compacted.json``: the log reads as it did (each shard's highest position, the last
    end, every window counted once), a folded window still answers as committed, and a
    compaction a crash stopped before its deletions (entries left that it folded) is
    read without counting them twice."""
    monkeypatch.setattr("mldserver.spark.commitlog.COMPACT_AT", 10)
    monkeypatch.setattr("mldserver.spark.commitlog.KEEP", 5)
    log = CommitLog(tmp_path)
    for i in range(25):
        log.append(entry(i * 10, {f"S{i % 4}": [str(100 + i), 0], "A": [str(1000 + i), i % 3]}))
        log.compact_if_due()
    names = sorted(p.name for p in (tmp_path / "_commits").iterdir())
    assert "_compacted.json" in names and len(names) <= 11  # the compacted file and the newest entries
    committed = log.read()
    assert committed.end == 250 and committed.windows == 25
    assert committed.positions == {"A": Position(1024, 0, "1024"), "S0": Position(124, 0, "124"),
                                   "S1": Position(121, 0, "121"), "S2": Position(122, 0, "122"),
                                   "S3": Position(123, 0, "123")}
    assert log.has("0-10") and log.entry("0-10") == {"window": "0-10", "compacted": True}
    assert log.entry("240-250")["rows"] == 1 and not log.has("250-260")
    # a crash after the compacted file was written, before the entries it folded went
    kept = {p.name: p.read_bytes() for p in (tmp_path / "_commits").glob("[0-9]*.json")}
    log.append(entry(250, {"B": ["5", 0]}))
    log.compact(keep=0)
    for name, data in kept.items():
        (tmp_path / "_commits" / name).write_bytes(data)
    again = CommitLog(tmp_path).read()
    assert again.end == 260 and again.windows == 26 and again.positions["B"] == Position(5, 0, "5")


def test_starts_make_each_shards_committed_intervals_and_an_entry_without_them_reads_as_before(tmp_path):
    """An entry's ``starts`` make [start, position] of each shard committed; entries of
    one reading touch and merge; a reading begun higher is an interval of its own; an
    entry without ``starts`` (an older log) says everything at or below its position.
    Compaction keeps the intervals."""
    def p(seq, sub=0):
        return Position(seq, sub, str(seq))

    log = CommitLog(tmp_path)
    log.append({**entry(0, {"A": ["150", 0]}), "starts": {"A": ["99", 1]}})
    log.append({**entry(10, {"A": ["170", 0]}), "starts": {"A": ["99", 1]}})
    log.append({**entry(20, {"A": ["320", 0], "B": ["5", 0]}), "starts": {"A": ["300", 0]}})
    committed = log.read()
    assert committed.intervals == {"A": ((p(99, 1), p(170)), (p(300), p(320))), "B": ((None, p(5)),)}
    assert committed.positions == {"A": p(320), "B": p(5)}
    assert log.compact(keep=0) == 3
    assert CommitLog(tmp_path).read().intervals == committed.intervals
