"""The spool round-trips an ended shard's rows, whole or not at all."""

from __future__ import annotations

from mldserver.coordinator.ordering import Item, Row
from mldserver.coordinator.spool import Spool
from mldserver.positions import Position


def test_spool_round_trips_rows_positions_and_parents(tmp_path):
    spool = Spool(tmp_path / "spool")
    seven, eight = Position(7, 0, "7"), Position(8, 2, "8")
    rows = [Row(1000, "shardId-1", seven, 1, b'{"k":"v"}'), Row(1001, "shardId-1", eight, 2, b'{"n":[1,2]}')]
    path = spool.write("shardId-1", rows, Position(9, 0, "9"), ["shardId-0"])
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    [spooled] = spool.read_all()
    assert spooled.shard_id == "shardId-1" and spooled.parents == ["shardId-0"]
    assert spooled.last == Position(9, 0, "9")
    assert spooled.items == [Item(1000, seven, b'{"k":"v"}'), Item(1001, eight, b'{"n":[1,2]}')]
    spool.delete("shardId-1")
    assert spool.read_all() == []


def test_sequence_numbers_keep_their_exact_digits(tmp_path):
    spool = Spool(tmp_path)
    seq = "000000000000000000028"  # DynamoDB Local pads its sequence numbers
    position = Position.parse(seq)
    spool.write("s", [Row(1, "s", position, 1, b"{}")], position, [])
    [spooled] = spool.read_all()
    assert spooled.items[0].position.text == seq and spooled.last == Position(28, 0, seq)
