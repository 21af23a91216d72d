"""The spool round-trips an ended shard's rows, whole or not at all."""

from __future__ import annotations

from mldserver.coordinator.spool import Spool
from mldserver.base.positions import Position
from mldserver.rows.batch import Item, RowBatch


def test_spool_round_trips_rows_positions_and_parents(tmp_path):
    spool = Spool(tmp_path / "spool")
    seven, eight = Position(7, 0, "7"), Position(8, 2, "8")
    rows = RowBatch.concat([RowBatch.of([Item(1000, seven, b'{"k":"v"}')]),
                            RowBatch.of([Item(1001, eight, b'{"n":[1,2]}')])])
    path = spool.write("shardId-1", rows, Position(9, 0, "9"), ["shardId-0"])
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    [spooled] = spool.read_all()
    assert spooled.shard_id == "shardId-1" and spooled.parents == ["shardId-0"]
    assert spooled.last == Position(9, 0, "9")
    assert list(spooled.rows) == [Item(1000, seven, b'{"k":"v"}'), Item(1001, eight, b'{"n":[1,2]}')]
    spool.delete("shardId-1")
    assert spool.read_all() == []


def test_sequence_numbers_keep_their_exact_digits(tmp_path):
    spool = Spool(tmp_path)
    seq = "000000000000000000028"  # DynamoDB Local pads its sequence numbers
    position = Position.parse(seq)
    spool.write("s", RowBatch.of([Item(1, position, b"{}")]), position, [])
    [spooled] = spool.read_all()
    assert spooled.rows.position(0).text == seq and spooled.last == Position(28, 0, seq)


def test_a_spool_named_by_an_older_version_is_read_and_deleted(tmp_path):
    # Older versions replaced unsafe characters with "_"; real shard ids never had any.
    spool = Spool(tmp_path)
    spool.write("shardId-000000000001", RowBatch.empty(), None, [])
    legacy = tmp_path / "shardId-x_1.jsonl"
    legacy.write_bytes(b'{"shard_id":"shardId-x/1","last":null,"parents":[]}\n')
    assert {s.shard_id for s in spool.read_all()} == {"shardId-000000000001", "shardId-x/1"}
    assert spool.path_for("shardId-000000000001").name == "shardId-000000000001.jsonl"
    spool.delete("shardId-x/1")
    assert not legacy.exists()
    assert [s.shard_id for s in spool.read_all()] == ["shardId-000000000001"]
