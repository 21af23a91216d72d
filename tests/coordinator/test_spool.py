"""The spool round-trips an ended shard's rows, whole or not at all."""

from __future__ import annotations

from mldserver.coordinator.spool import Spool


def test_spool_round_trips_rows_positions_and_parents(tmp_path):
    spool = Spool(tmp_path / "spool")
    rows = [(1000, "shardId-1", 7, 0, 1, "7", b'{"k":"v"}'), (1001, "shardId-1", 8, 2, 2, "8", b'{"n":[1,2]}')]
    path = spool.write("shardId-1", rows, (9, 0, "9"), ["shardId-0"])
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    [spooled] = spool.read_all()
    assert spooled.shard_id == "shardId-1" and spooled.parents == ["shardId-0"]
    assert spooled.last == (9, 0, "9")
    assert spooled.items == [(1000, 7, 0, "7", b'{"k":"v"}'), (1001, 8, 2, "8", b'{"n":[1,2]}')]
    spool.delete("shardId-1")
    assert spool.read_all() == []


def test_sequence_numbers_keep_their_exact_digits(tmp_path):
    spool = Spool(tmp_path)
    seq = "000000000000000000028"  # DynamoDB Local pads its sequence numbers
    spool.write("s", [(1, "s", int(seq), 0, 1, seq, b"{}")], (int(seq), 0, seq), [])
    [spooled] = spool.read_all()
    assert spooled.items[0][3] == seq and spooled.last == (28, 0, seq)
