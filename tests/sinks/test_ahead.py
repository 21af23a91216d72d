"""A window's Arrow table made as its rows arrive (``sinks.ahead``): the same table the
window's JSON lines parse to, in merged order, from pieces a real ``Ordering`` kept and
``merge.seal`` sealed; the usual parse where a row does not fit; bounded memory."""

from __future__ import annotations

import orjson
import pyarrow as pa

from mldserver.base.handoff import Window
from mldserver.base.positions import Position
from mldserver.coordinator.merge import seal
from mldserver.rows.batch import Item, RowBatch
from mldserver.sinks import ahead as sinks_ahead
from mldserver.sinks.ahead import TablesAhead
from mldserver.sinks.schema import rows_to_table

from ..coordinator.test_ordering import MINUTE, ordering

SCHEMA = pa.schema([("seq", pa.string()), ("tag", pa.string()), ("n", pa.int64())])


def batch(first_seq: int, times: list[int], tag: str, extra: dict | None = None) -> RowBatch:
    return RowBatch.of(
        Item(t, Position.parse(str(first_seq + i)),
             orjson.dumps({"seq": str(first_seq + i), "tag": tag, "n": t, **(extra if i == 1 and extra else {})}))
        for i, t in enumerate(times)
    )


def feed(o, ahead: TablesAhead, shard_id: str, rows: RowBatch) -> None:
    ahead.arrived(o.add(shard_id, rows, rows.position(-1), now=0), SCHEMA)


def test_each_window_made_ahead_is_the_table_its_lines_parse_to_in_merged_order(monkeypatch):
    o, ahead = ordering(), TablesAhead(budget=1 << 20)
    # three shards whose rows interleave in time, batches that span two windows (cut
    # into a piece a window), and rows arriving after their window closed (late)
    feed(o, ahead, "C", batch(1, [1_000, 30_000, 59_000, 61_000, 90_000], "C"))
    feed(o, ahead, "A", batch(1, [2_000, 29_000, 70_000], "A"))
    feed(o, ahead, "B", batch(100, [1_000, 45_000, 62_000, 119_000], "B"))
    [first] = o.close(until=MINUTE)
    feed(o, ahead, "D", batch(1, [59_500, 80_000], "D"))  # 59,500: late, with the next window
    [second] = o.close(until=2 * MINUTE)
    for made_ahead in list(ahead._tables.values()):
        made_ahead.table.result()
    parses = []
    monkeypatch.setattr(sinks_ahead, "parse", lambda *a: parses.append(a))  # none from here on
    for closed in (first, second):
        window, _ = seal(closed)
        assert window.rows.pieces is not None and window.rows.pieces[1] is not None  # interleaved: an order
        made = ahead.table(window.rows, SCHEMA)
        assert not parses
        parsed, rejected = rows_to_table(window.rows, SCHEMA)
        assert made is not None and not rejected
        assert made.to_pylist() == parsed.to_pylist() and made.schema.equals(SCHEMA)
        ahead.committed(window)
    assert window.late_rows == 1 and made.to_pylist()[0]["n"] == 59_500
    assert ahead.held == 0  # every table let go once its window committed


def test_a_row_that_does_not_fit_leaves_the_window_to_the_usual_parse_which_rejects_it():
    o, ahead = ordering(), TablesAhead(budget=1 << 20)
    feed(o, ahead, "A", batch(1, [1_000, 2_000, 3_000], "A", extra={"surprise": 1}))
    feed(o, ahead, "B", batch(1, [1_500], "B"))
    [closed] = o.close(until=MINUTE)
    window, _ = seal(closed)
    assert ahead.table(window.rows, SCHEMA) is None
    table, rejected = rows_to_table(window.rows, SCHEMA)
    assert [i for i, _ in rejected] == [2] and table.num_rows == 3  # A's second row, after B's


def test_a_window_with_rows_past_the_budget_is_left_to_the_usual_parse():
    o = ordering()
    one = batch(1, [1_000, 2_000], "A")
    ahead = TablesAhead(budget=one.nbytes())  # room for one batch
    feed(o, ahead, "A", one)
    feed(o, ahead, "B", batch(1, [1_500, 2_500], "B"))
    assert ahead.held == one.nbytes()
    [closed] = o.close(until=MINUTE)
    window, _ = seal(closed)
    assert ahead.table(window.rows, SCHEMA) is None and ahead.made == 0
    ahead.committed(window)
    assert ahead.held == 0


def test_a_parse_that_failed_leaves_the_window_to_the_usual_parse_at_every_attempt(monkeypatch):
    def failing(lines, schema):
        raise MemoryError("no room")

    monkeypatch.setattr(sinks_ahead, "parse", failing)
    o, ahead = ordering(), TablesAhead(budget=1 << 20)
    feed(o, ahead, "A", batch(1, [1_000, 2_000], "A"))
    [closed] = o.close(until=MINUTE)
    window, _ = seal(closed)
    assert ahead.table(window.rows, SCHEMA) is None and ahead.table(window.rows, SCHEMA) is None  # a retry too


def test_rows_before_a_schema_and_lines_not_cut_from_batches_are_not_made_ahead():
    o, ahead = ordering(), TablesAhead(budget=1 << 20)
    ahead.arrived(o.add("A", batch(1, [1_000], "A"), Position.parse("1"), now=0), None)  # no schema yet
    assert ahead.held == 0
    [closed] = o.close(until=MINUTE)
    window, _ = seal(closed)
    assert ahead.table(window.rows, SCHEMA) is None
    from mldserver.base.handoff import JsonLines

    assert ahead.table(JsonLines.of([b'{"seq":"1"}']), SCHEMA) is None


def test_rows_no_window_took_are_let_go_a_commit_after_they_arrived_and_late_rows_wait_for_theirs():
    o, ahead = ordering(), TablesAhead(budget=1 << 20)
    feed(o, ahead, "A", batch(1, [1_000, 61_000, 121_000], "A"))
    [w1] = [seal(closed)[0] for closed in o.close(until=MINUTE)]
    ahead.committed(w1)
    [w2] = [seal(closed)[0] for closed in o.close(until=2 * MINUTE)]
    feed(o, ahead, "B", batch(1, [30_000], "B"))  # late, and older than w2: it arrives while w2 commits
    ahead.committed(w2)
    [w3] = [seal(closed)[0] for closed in o.close(until=3 * MINUTE)]
    made = ahead.table(w3.rows, SCHEMA)  # B's late row still made ahead, for the window it goes with
    assert w3.late_rows == 1 and made is not None and [r["n"] for r in made.to_pylist()] == [30_000, 121_000]
    lost = batch(50, [40_000], "lost").tagged()
    ahead.arrived([lost], SCHEMA)  # rows no window will take (say, of a lease lost)
    ahead.committed(w3)
    assert ahead.held == lost.nbytes()
    ahead.committed(Window(180_000, 240_000))  # a further commit since it arrived: let go
    assert ahead.held == 0


def test_a_hopping_windows_panes_are_parsed_once_for_every_window_that_holds_them(monkeypatch):
    from mldserver.coordinator.panes import Panes

    slide = MINUTE // 3
    o, ahead, panes = ordering(window_ms=slide), TablesAhead(budget=1 << 20, slide=slide), Panes(MINUTE, slide)
    parses = []
    parse = sinks_ahead.parse
    monkeypatch.setattr(sinks_ahead, "parse", lambda *a: parses.append(a) or parse(*a))
    for n, shard_id in enumerate("AB"):  # rows in four panes, two shards interleaved
        feed(o, ahead, shard_id, batch(1, [1_000 + n, 21_000 + n, 41_000 + n, 61_000 + n], shard_id))
    windows = [seal(w)[0] for w in panes.assemble(o.close(until=80_000), until=80_000)]
    assert [(w.start, w.end) for w in windows] == [(-40_000, 20_000), (-20_000, 40_000), (0, 60_000), (20_000, 80_000)]
    for made_ahead in list(ahead._tables.values()):
        made_ahead.table.result()
    parsed_ahead = len(parses)
    for window in windows:
        made = ahead.table(window.rows, SCHEMA)
        parsed, _ = rows_to_table(window.rows, SCHEMA)
        assert made is not None and made.to_pylist() == parsed.to_pylist()
        ahead.committed(window)
    assert parsed_ahead == 8 and len(parses) == 8  # a piece a pane and shard, each parsed once, ahead
    # the two newest panes' tables stay, for the windows to come (to 100,000 and 120,000);
    # the others went once their last window committed
    assert sorted(a.last_time for a in ahead._tables.values()) == [41_000, 41_001, 61_000, 61_001]
    assert ahead.held == sum(a.nbytes for a in ahead._tables.values())
