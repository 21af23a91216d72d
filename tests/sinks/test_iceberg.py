"""The table sink against a real Iceberg table (pyiceberg, a SQLite catalog in a
temporary folder): positions read back from the table's metadata, two servers'
commits of the same shard's rows, a conflict between two writers, a crash between
writing the data files and committing them, and one after the commit landed.

Faults are injected at the catalog's edge (``commit_table``, the one call that
publishes a commit), by a subclass of the real SQLite catalog."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from mldserver.base.config import Settings, load
from mldserver.base.handoff import JsonLines, Window
from mldserver.base.intervals import after
from mldserver.base.deadletters import DeadLetters
from mldserver.errors import ConfigError, retriable
from mldserver.base.positions import Position
from mldserver.sinks.iceberg import IcebergSink, TableUnavailable, fresh_rows, position_key

TABLE = ("mldserver", "windows")


def pos(seq: int) -> Position:
    return Position(seq, 0, str(seq))


def window(start: int, shards: dict[str, list[int]], late: int = 0) -> Window:
    """A window as the coordinator seals it: rows in merged order, their sources, and
    each shard's highest position."""
    rows, sources = [], []
    for shard_id, seqs in shards.items():
        for seq in seqs:
            rows.append(orjson.dumps({"shard_id": shard_id, "seq": seq}))
            sources.append((shard_id, pos(seq)))
    positions = {shard_id: pos(seqs[-1]) for shard_id, seqs in shards.items() if seqs}
    return Window(start, start + 10, JsonLines.of(rows), late, positions, sources)


def settings(tmp_path: Path, **changes) -> Settings:
    base = Settings(stream="orders", state_dir=str(tmp_path / "state"), sink=f"iceberg:{tmp_path / 'lake'}",
                    server_id="server-a")
    return base.replace(**changes)


def catalog(tmp_path: Path, kind=SqlCatalog, **extra) -> SqlCatalog:
    lake = tmp_path / "lake"
    lake.mkdir(exist_ok=True)
    return kind("mldserver", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}", **extra)


async def sink(tmp_path: Path, server_id: str = "server-a", cat=None, **changes) -> IcebergSink:
    s = IcebergSink(settings(tmp_path, server_id=server_id, **changes), tmp_path / "lake",
                    DeadLetters(tmp_path / "state" / "dead-letters"), catalog=cat)
    await s.start()
    return s


def table_rows(tmp_path: Path) -> list[tuple[str, int]]:
    table = catalog(tmp_path).load_table(TABLE)
    data = table.scan().to_arrow()
    return sorted(zip(data.column("shard_id").to_pylist(), data.column("seq").to_pylist()))


def commits(tmp_path: Path) -> list[dict[str, str]]:
    table = catalog(tmp_path).load_table(TABLE)
    return [s.summary.additional_properties for s in table.snapshots()]


async def test_a_shards_position_is_read_back_from_the_table_per_stream(tmp_path):
    a = await sink(tmp_path)
    assert await a.committed_position("shardId-0") is None  # no table yet
    await a.commit(window(0, {"shardId-0": [1, 2, 3], "shardId-1": [7]}))
    b = await sink(tmp_path, "server-b")
    assert await b.committed_position("shardId-0") == pos(3)
    assert await b.committed_position("shardId-1") == pos(7)
    assert await b.committed_position("shardId-2") is None
    other_stream = await sink(tmp_path, "server-c", stream="payments")  # same shard ids, another stream
    assert await other_stream.committed_position("shardId-0") is None
    properties = catalog(tmp_path).load_table(TABLE).properties
    assert orjson.loads(properties[position_key("orders", "shardId-0")]) == ["3", 0]


async def test_reading_a_position_back_reads_no_data_file_and_no_manifest(tmp_path):
    a = await sink(tmp_path)
    for n in range(3):
        await a.commit(window(n * 10, {"shardId-0": [n * 10 + 1, n * 10 + 2]}))
    location = Path(catalog(tmp_path).load_table(TABLE).location().removeprefix("file://"))
    for path in [*location.glob("data/**/*.parquet"), *location.glob("metadata/*.avro")]:
        path.unlink()  # only the metadata file is left: a scan could not run now
    assert await (await sink(tmp_path, "server-b")).committed_position("shardId-0") == pos(22)


async def test_rows_another_server_committed_are_left_out_and_each_commit_names_its_server(tmp_path):
    a, b = await sink(tmp_path), await sink(tmp_path, "server-b")
    await a.commit(window(0, {"s0": [1, 2, 3], "s1": [10]}))
    # b took s0's lease from a checkpoint before 3: it delivers 2 and 3 again, then 4 and 5
    await b.commit(window(0, {"s0": [2, 3, 4, 5], "s1": [11]}))
    await a.commit(window(0, {"s0": [1, 2, 3], "s1": [10]}))  # a retry of a's first commit: nothing new
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2), ("s0", 3), ("s0", 4), ("s0", 5), ("s1", 10), ("s1", 11)]
    summaries = commits(tmp_path)
    assert [(c["mldserver.server"], c["mldserver.rows"], c["mldserver.skipped-rows"]) for c in summaries] == [
        ("server-a", "4", "0"), ("server-b", "3", "2")]
    assert all(c["mldserver.stream"] == "orders" and c["mldserver.window"] == "0-10" for c in summaries)
    assert [sorted(orjson.loads(c["mldserver.positions"])) for c in summaries] == [["s0", "s1"], ["s0", "s1"]]
    properties = catalog(tmp_path).load_table(TABLE).properties
    assert {k: orjson.loads(v) for k, v in properties.items() if k.startswith("mldserver.server/")} == {
        "mldserver.server/server-a": {"stream": "orders", "window": "0-10", "end": 10},
        "mldserver.server/server-b": {"stream": "orders", "window": "0-10", "end": 10}}
    assert await a.committed_position("s0") == pos(5)


class Interleaved(SqlCatalog):
    """A catalog whose first commit lets another writer commit first: a real conflict
    on the compare-and-swap of the metadata pointer."""

    before_first_commit = None

    def commit_table(self, table, requirements, updates):
        hook, Interleaved.before_first_commit = Interleaved.before_first_commit, None
        if hook is not None:
            hook()
        return super().commit_table(table, requirements, updates)


async def test_a_conflict_between_two_writers_is_retried_on_the_new_base_without_adding_a_row_twice(tmp_path):
    a = await sink(tmp_path, cat=catalog(tmp_path, Interleaved))
    b = await sink(tmp_path, "server-b")
    await a.commit(window(0, {"s0": [1]}))  # the table exists
    b_first = window(10, {"s0": [2, 3, 4], "s1": [50]})

    def b_commits_first():
        # b's commit lands between a's read of the base and a's compare-and-swap
        import asyncio

        asyncio.run(b.commit(b_first))

    Interleaved.before_first_commit = b_commits_first
    await a.commit(window(10, {"s0": [2, 3, 4, 5, 6], "s2": [70]}))
    assert a.conflicts == 1
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2), ("s0", 3), ("s0", 4), ("s0", 5), ("s0", 6),
                                    ("s1", 50), ("s2", 70)]
    last = commits(tmp_path)[-1]
    assert (last["mldserver.server"], last["mldserver.rows"], last["mldserver.skipped-rows"]) == ("server-a", "3", "3")
    assert await b.committed_position("s0") == pos(6)


class CrashBeforeCommit(SqlCatalog):
    """The data files are written; the process dies before the commit is published."""

    def commit_table(self, table, requirements, updates):
        raise OSError("killed between writing the data files and committing them")


class CrashAfterCommit(SqlCatalog):
    """The commit is published; the process dies before its caller hears of it."""

    def commit_table(self, table, requirements, updates):
        super().commit_table(table, requirements, updates)
        raise OSError("killed after the commit landed")


async def test_a_crash_between_writing_files_and_committing_them_adds_the_window_once(tmp_path):
    a = await sink(tmp_path)
    await a.commit(window(0, {"s0": [1]}))
    crashing = await sink(tmp_path, cat=catalog(tmp_path, CrashBeforeCommit))
    w = window(10, {"s0": [2, 3]})
    with pytest.raises(TableUnavailable) as failed:
        await crashing.commit(w)
    assert retriable(failed.value)  # the coordinator offers the window again
    location = Path(catalog(tmp_path).load_table(TABLE).location().removeprefix("file://"))
    files_before = set(location.glob("data/**/*.parquet"))
    assert len(files_before) == 2  # the first window's and the uncommitted one's (an orphan)
    assert table_rows(tmp_path) == [("s0", 1)]  # readers see only what is committed

    restarted = await sink(tmp_path)
    await restarted.commit(w)  # the same window again, after the restart
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2), ("s0", 3)]


async def test_a_commit_that_landed_before_a_crash_is_not_added_again(tmp_path, caplog):
    crashing = await sink(tmp_path, cat=catalog(tmp_path, CrashAfterCommit))
    w = window(0, {"s0": [1, 2], "s1": [9]})
    with pytest.raises(TableUnavailable):
        await crashing.commit(w)
    restarted = await sink(tmp_path)
    await restarted.commit(w)
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2), ("s1", 9)]
    assert len(commits(tmp_path)) == 1


async def test_old_snapshots_are_expired_so_the_metadata_stays_small(tmp_path):
    a = await sink(tmp_path, table_snapshots_kept=3)
    for n in range(12):
        await a.commit(window(n * 10, {"s0": [n]}))
    table = catalog(tmp_path).load_table(TABLE)
    assert len(table.snapshots()) <= 2 * 3  # twelve without expiry
    assert len(table_rows(tmp_path)) == 12  # expiring snapshots drops no row
    assert await a.committed_position("s0") == pos(11)


async def test_rows_that_do_not_fit_the_tables_schema_are_dead_lettered(tmp_path):
    a = await sink(tmp_path)
    await a.commit(window(0, {"s0": [1]}))  # the table's schema: shard_id string, seq int64
    b = await sink(tmp_path, "server-b")
    w = window(10, {"s0": [2, 3]})
    w.rows = JsonLines.of([w.rows[0], orjson.dumps({"shard_id": "s0", "seq": 3, "extra": True})])
    await b.commit(w)
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2)]
    dead = [orjson.loads(line) for line in (tmp_path / "state" / "dead-letters" / "rows.jsonl").read_bytes().splitlines()]
    assert [d["window"] for d in dead] == ["10-20"] and "extra" in dead[0]["error"]
    assert await b.committed_position("s0") == pos(3)  # the rejected row's record is done


class Requirements(SqlCatalog):
    """The SQLite catalog, noting what each commit asserts of the table it commits on."""

    asserted: list = []

    def commit_table(self, table, requirements, updates):
        Requirements.asserted.append(requirements)
        return super().commit_table(table, requirements, updates)


async def test_a_commit_that_only_moves_positions_is_a_snapshot_asserting_the_branch_it_read(tmp_path):
    """Every row dead-lettered: the commit still makes a snapshot (empty), so it asserts
    the branch's snapshot as it read it (``assert-ref-snapshot-id``). A REST catalog has
    nothing else to compare and swap on: properties alone would overwrite a newer
    commit's intervals with this one's stale ones."""
    a = await sink(tmp_path)
    await a.commit(window(0, {"s0": [1]}))
    Requirements.asserted = []
    b = await sink(tmp_path, "server-b", cat=catalog(tmp_path, Requirements))
    read = catalog(tmp_path).load_table(TABLE).current_snapshot().snapshot_id
    w = window(10, {"s0": [2, 3]})
    w.rows = JsonLines.of([orjson.dumps({"shard_id": "s0", "seq": n, "extra": True}) for n in (2, 3)])
    await b.commit(w)
    assert table_rows(tmp_path) == [("s0", 1)] and await b.committed_position("s0") == pos(3)
    last = commits(tmp_path)[-1]
    assert (last["mldserver.server"], last["mldserver.rows"]) == ("server-b", "0")
    asserted = {(r.type, getattr(r, "snapshot_id", None)) for r in Requirements.asserted[-1]}
    assert ("assert-ref-snapshot-id", read) in asserted, asserted


async def test_a_table_made_elsewhere_gets_pyicebergs_own_retry_switched_off(tmp_path):
    import pyarrow as pa

    catalog(tmp_path).create_namespace("mldserver")
    catalog(tmp_path).create_table(TABLE, schema=pa.schema([("shard_id", pa.string()), ("seq", pa.int64()),
                                                            ("window", pa.string())]))
    await sink(tmp_path)
    assert catalog(tmp_path).load_table(TABLE).properties["commit.retry.num-retries"] == "0"


def upto(seq: int):
    return ((None, pos(seq)),)


def test_fresh_rows_leaves_out_each_shards_rows_inside_its_committed_intervals():
    w = window(0, {"s0": [6, 8, 9], "s1": [1, 2]})
    assert fresh_rows(w, {}) is None
    assert fresh_rows(w, {"s0": upto(5), "s1": upto(0)}) is None  # every shard's first row is above
    assert fresh_rows(w, {"s0": upto(8)}) == [False, False, True, True, True]
    assert fresh_rows(w, {"s0": upto(9), "s1": upto(2)}) == [False] * 5
    # a reading that started after a checkpoint at 7 committed 8: 6, below where it started, is new
    assert fresh_rows(w, {"s0": ((after(pos(7)), pos(8)),)}) == [True, False, True, True, True]
    assert fresh_rows(w, {"s0": ((after(pos(5)), pos(6)), (after(pos(8)), pos(9)))}) == [False, True, False, True, True]


def started_at(w: Window, **starts: Position) -> Window:
    """``w`` with where each shard's reading started (``Window.starts``)."""
    w.starts = dict(starts)
    return w


async def test_rows_below_where_a_reading_started_are_committed_when_read_and_those_in_it_never_twice(
        tmp_path, caplog):
    """A reading after a checkpoint at 99 commits 100..150; the shard read from a
    checkpoint at 49 commits 50..160: 50..99, which no reading had, and 151..160 are
    added, 100..150 not again; a retry of that commit adds nothing."""
    a = await sink(tmp_path)
    await a.commit(started_at(window(0, {"s0": list(range(100, 151))}), s0=after(pos(99))))
    assert await a.committed_intervals("s0") == ((after(pos(99)), pos(150)),)
    b = await sink(tmp_path, "server-b")
    again = started_at(window(10, {"s0": list(range(50, 161))}), s0=after(pos(49)))
    await b.commit(again)
    assert table_rows(tmp_path) == [("s0", seq) for seq in range(50, 161)]
    assert [c["mldserver.skipped-rows"] for c in commits(tmp_path)] == ["0", "51"]
    properties = catalog(tmp_path).load_table(TABLE).properties
    assert orjson.loads(properties["mldserver.intervals/orders/s0"]) == [[["49", 1], ["160", 0]]]
    assert orjson.loads(properties[position_key("orders", "s0")]) == ["160", 0]
    await b.commit(again)  # a retry of a commit that landed
    assert len(commits(tmp_path)) == 2 and table_rows(tmp_path) == [("s0", seq) for seq in range(50, 161)]
    assert await b.committed_position("s0") == pos(160)


async def test_a_table_with_only_a_position_reads_as_everything_at_or_below_it(tmp_path):
    """A table written before intervals (only ``mldserver.position/...``): its rows at or
    below the position are committed, as before."""
    a = await sink(tmp_path)
    await a.commit(started_at(window(0, {"s0": list(range(100, 151))}), s0=after(pos(99))))
    table = catalog(tmp_path).load_table(TABLE)
    with table.transaction() as tx:
        tx.remove_properties("mldserver.intervals/orders/s0")
    assert await a.committed_intervals("s0") == ((None, pos(150)),)
    await a.commit(started_at(window(10, {"s0": list(range(50, 161))}), s0=after(pos(49))))
    assert table_rows(tmp_path) == [("s0", seq) for seq in range(100, 161)]
    assert await a.committed_intervals("s0") == ((None, pos(160)),)


async def test_a_lease_moved_past_a_gap_keeps_two_intervals_and_the_gap_is_committed_once_read(tmp_path):
    """Server a read 1..20 and committed them; server b was given the shard at a
    checkpoint moved forward to 50 and commits 51..60; a reading from 20 later fills the
    gap 21..50 without adding a row twice."""
    a, b = await sink(tmp_path), await sink(tmp_path, "server-b")
    await a.commit(started_at(window(0, {"s0": list(range(1, 21))}), s0=after(pos(0))))
    await b.commit(started_at(window(0, {"s0": list(range(51, 61))}), s0=after(pos(50))))
    assert await a.committed_intervals("s0") == ((after(pos(0)), pos(20)), (after(pos(50)), pos(60)))
    await a.commit(started_at(window(10, {"s0": list(range(21, 71))}), s0=after(pos(20))))
    assert table_rows(tmp_path) == [("s0", seq) for seq in range(1, 71)]
    assert await b.committed_intervals("s0") == ((after(pos(0)), pos(70)),)


def test_the_table_sink_needs_a_stream_and_a_namespaced_table(tmp_path):
    with pytest.raises(ConfigError, match="give --stream STREAM"):
        load(sink=f"iceberg:{tmp_path}")
    with pytest.raises(ConfigError, match="NAMESPACE.NAME"):
        load(sink=f"iceberg:{tmp_path}", stream="orders", table="windows")
    assert load(sink=f"iceberg:{tmp_path}", stream="orders").table == "mldserver.windows"


def test_with_sources_the_tables_positions_are_keyed_by_their_text_unless_stream_is_set(tmp_path):
    from mldserver.base.config import positions_stream

    assert positions_stream(load(sink=f"iceberg:{tmp_path}", source=("dynamodb:orders",))) == "dynamodb:orders"
    both = load(sink=f"iceberg:{tmp_path}", source=("kinesis:clicks", "dynamodb:orders"))
    assert positions_stream(both) == "dynamodb:orders+kinesis:clicks"
    assert positions_stream(load(sink=f"iceberg:{tmp_path}", source=("dynamodb:orders",), stream="o")) == "o"


async def test_a_table_that_cannot_be_opened_is_a_config_error_naming_the_sink(tmp_path):
    (tmp_path / "lake").write_text("a file where the warehouse should be")
    s = IcebergSink(settings(tmp_path), tmp_path / "lake", DeadLetters(tmp_path / "dead-letters"))
    with pytest.raises(ConfigError, match=r"--sink iceberg:.*lake: cannot open the table mldserver.windows"):
        await s.start()


async def test_a_lease_move_within_the_allowed_lateness_amends_the_windows_where_they_are(tmp_path):
    """Server x commits shards A and B to the end of window 1; B's lease moves to server
    y, whose shard C has closed windows 0 to 3 already. B's row for window 2 is late at
    y: within the allowed lateness it amends window 2 in the table (a later snapshot), in
    its own window, not in the one y commits next; every row once."""
    from mldserver.coordinator import Coordinator

    from ..coordinator.test_amends import rows_of
    from ..helpers import FakeClock

    base = 1_699_999_980_000  # a window start
    w = [base + k * 60_000 for k in range(7)]
    clock = FakeClock(1_790_000_000_000)

    async def server(server_id):
        s = settings(tmp_path, server_id=server_id, window=60.0, allowed_lateness=600.0,
                     state_dir=str(tmp_path / server_id))
        c = Coordinator(s, IcebergSink(s, tmp_path / "lake", DeadLetters(tmp_path / server_id / "dl")), clock=clock)
        await c.start()
        return c

    async def deliver(c, shard_id, rows):
        c.add_batch(shard_id, rows_of(rows), Position(rows[-1][1], 0, str(rows[-1][1])), 100)
        clock.advance(1_000)
        await c.step()

    x, y = await server("x"), await server("y")
    try:
        for c, shard_id in ((x, "A"), (x, "B"), (y, "C")):
            await c.open_shard(shard_id, None)
        await deliver(x, "A", [(w[0] + 1_000, 1, 1.0), (w[1] + 1_000, 2, 1.0), (w[2] + 1_000, 3, 1.0),
                               (w[3] + 1_000, 4, 1.0)])
        await deliver(x, "B", [(w[0] + 2_000, 101, 1.0), (w[1] + 2_000, 102, 1.0), (w[2] + 2_000, 103, 1.0)])
        assert x.committer.windows_committed == 2 and x.safe_position("B") == pos(102)
        await deliver(y, "C", [(w[k] + 3_000, 201 + k, 1.0) for k in range(5)])  # y closes windows 0 to 3
        assert y.committer.windows_committed == 4
        x.lease_lost("B")
        await x.step()
        await y.open_shard("B", pos(102))  # from x's last checkpoint
        await deliver(y, "B", [(w[2] + 2_000, 103, 1.0)])  # late here: window 2 is closed
        await deliver(y, "B", [(w[5] + 2_000, 104, 1.0)])
        await deliver(y, "C", [(w[5] + 3_000, 206, 1.0)])  # window 4 closes, and 103 goes with it
        assert y.ordering.amended_rows == 1 and y.ordering.late_rows == 0
    finally:
        await x.stop()
        await y.stop()
    data = catalog(tmp_path).load_table(TABLE).scan().to_arrow()
    got = sorted(zip(data.column("seq").to_pylist(), data.column("t").to_pylist(), data.column("window").to_pylist()))
    assert [seq for seq, _, _ in got] == [1, 2, 3, 101, 102, 103, 201, 202, 203, 204, 205]  # each once (4: open)
    for seq, t, window_id in got:
        start = t - t % 60_000
        assert window_id == f"{start}-{start + 60_000}", f"row {seq} in {window_id}"
    summaries = commits(tmp_path)
    assert [c["mldserver.amended-rows"] for c in summaries if c["mldserver.server"] == "y"][-1] == "1"
    assert {c["mldserver.late-rows"] for c in summaries} == {"0"}


async def test_a_field_null_in_every_row_of_the_first_window_is_a_string_column(tmp_path):
    """Arrow infers its ``null`` type, which Iceberg has not: the committer crashed and
    the server crash-looped on the same rows. It is a nullable string column now, and a
    later window's text goes into it."""
    a = await sink(tmp_path)

    def rows(start, notes):
        lines = [orjson.dumps({"shard_id": "s0", "seq": start + i, "note": note, "tags": [note]})
                 for i, note in enumerate(notes)]
        return Window(start, start + 10, JsonLines.of(lines), 0, {"s0": pos(start + len(notes) - 1)},
                      [("s0", pos(start + i)) for i in range(len(notes))])

    await a.commit(rows(0, [None, None]))
    await a.commit(rows(10, ["late delivery", None]))
    data = catalog(tmp_path).load_table(TABLE).scan().to_arrow()
    assert sorted(zip(data.column("seq").to_pylist(), data.column("note").to_pylist())) == [
        (0, None), (1, None), (10, "late delivery"), (11, None)]


async def test_a_catalog_that_cannot_be_written_fails_the_commit_and_the_retry_adds_the_window_once(tmp_path):
    """The catalog unavailable (its database locked by another writer, as a catalog
    server down or a lock held too long would be): the commit raises, the sink stays
    usable, and the same window retried once the catalog is back is in the table once."""
    import sqlite3

    a = await sink(tmp_path)
    await a.commit(window(0, {"s0": [1, 2]}))
    blocker = sqlite3.connect(tmp_path / "lake" / "catalog.db", timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # no one else reads or writes the catalog meanwhile
    try:
        with pytest.raises(Exception) as failed:
            await a.commit(window(10, {"s0": [3, 4]}))
        assert "locked" in str(failed.value)
    finally:
        blocker.rollback()
        blocker.close()
    await a.commit(window(10, {"s0": [3, 4]}))
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2), ("s0", 3), ("s0", 4)]


class Throttled(SqlCatalog):
    """A catalog that answers the next commit as a throttling REST catalog does (429)."""

    throttle = 0

    def commit_table(self, table, requirements, updates):
        from pyiceberg.exceptions import TooManyRequestsError

        if Throttled.throttle:
            Throttled.throttle -= 1
            raise TooManyRequestsError("Slow down: rate of requests too high")
        return super().commit_table(table, requirements, updates)


async def test_a_catalog_that_throttles_fails_the_commit_as_retriable_and_the_retry_adds_the_window_once(tmp_path):
    """A REST catalog's 429 passes, as its 5xx do: retried like any sink I/O (the
    coordinator's backoff), not a bug that stops the server."""
    a = await sink(tmp_path, cat=catalog(tmp_path, Throttled))
    await a.commit(window(0, {"s0": [1, 2]}))  # the table made: the throttled commit is the next one
    Throttled.throttle = 1
    with pytest.raises(TableUnavailable, match="Slow down"):
        await a.commit(window(10, {"s0": [3, 4]}))
    await a.commit(window(10, {"s0": [3, 4]}))
    assert table_rows(tmp_path) == [("s0", 1), ("s0", 2), ("s0", 3), ("s0", 4)]
