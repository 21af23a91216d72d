"""The frames both sides of a handler process speak, and each side driven alone: the
child by this test acting as the server, the server's side (``HandlerProcess``) against
a scripted peer that speaks the frames and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys

import orjson
import pytest

from mldserver.base.config import Settings
from mldserver.base.logs import get_logger
from mldserver.pool import frames
from mldserver.pool.process import HandlerImportFailed, HandlerProcess, ProcessDied
from mldserver.api.records import EVENT_TIME, Record
from mldserver.api.testing import make_records

from ..helpers import counted_parses


def test_rows_cross_as_one_columnar_body_and_come_back_as_they_were_encoded():
    records = list(map(Record, make_records(10, 3)))
    emitted = [(records[0], {"k": 1}, None), (records[2], {"é": [1, 2]}, 1763719200000),
               (records[1], {"bad": {1, 2}}, None), (records[2], {}, 5), (records[0], {}, 5.5)]
    n, parts, bad = frames.encode_rows(emitted, records)
    assert n == 3 and bad == [(1, "row not JSON-encodable: Type is not JSON serializable: set"),
                              (0, f"event time 5.5 from batch.emit(event_time_ms=...) is not {EVENT_TIME}")]
    columns = frames.decode_rows(n, b"".join(parts))  # the parts are written one after another
    assert columns.records.tolist() == [0, 2, 2]
    # no event time given: the record's arrival time, which the server fills in (not read here)
    assert columns.times.tolist() == [frames.ARRIVAL_TIME, 1763719200000, 5]
    n, parts, _ = frames.encode_rows([(records[1], {}, None), (records[0], {}, None)], records)
    assert frames.decode_rows(n, b"".join(parts)).times.tolist() == [frames.ARRIVAL_TIME] * 2
    # records the server re-encoded (no line of the daemon's): their arrival times read here
    odd = Record({"sequenceNumber": "8", "approximateArrivalTimestamp": "soon"})
    none = Record({"sequenceNumber": "9"})
    for rows in ([(records[0], {}, None), (odd, {}, None), (none, {}, None)],
                 [(records[0], {}, None), (odd, {}, None), (none, {}, None), (records[1], {}, 5)]):
        n, parts, bad = frames.encode_rows(rows, [records[0], odd, none, records[1]], read_arrivals=True)
        assert frames.decode_rows(n, b"".join(parts)).times.tolist()[:2] == [
            records[0].approximate_arrival_timestamp, frames.NO_TIME]
        assert [i for i, _ in bad] == [1] and "'soon' from the record's approximateArrivalTimestamp" in bad[0][1]
    assert [orjson.loads(d) for d in columns.rows()] == [{"k": 1}, {"é": [1, 2]}, {}]
    assert bytes(columns.lines).count(b"\n") == 3  # JSON lines, as a sink takes them
    assert frames.decode_rows(0, b"".join(frames.encode_rows([], [])[1])).rows() == []


def test_each_row_names_its_record_by_its_place_in_the_batch():
    a, b, c = map(Record, make_records(10, 3))
    assert frames.record_indexes([a, b, c], [a, b, c]).tolist() == [0, 1, 2]  # one for one
    assert frames.record_indexes([c, b, a], [a, b, c]).tolist() == [2, 1, 0]
    assert frames.record_indexes([b, b, a], [a, b, c]).tolist() == [1, 1, 0]
    equal_not_same = Record(dict(a.raw))  # the same record's content is not the record
    with pytest.raises(KeyError):
        frames.record_indexes([equal_not_same], [a])
    assert frames.record_indexes([a, b], [a, b], one_for_one=True).tolist() == [0, 1]  # checked by the collector
    assert frames.record_indexes([b, a], [a, b], one_for_one=False).tolist() == [1, 0]
    many = [Record(r) for r in make_records(10, 25_000)]  # past the counting made so far: made longer
    assert frames.record_indexes(many, many).tolist() == list(range(25_000))
    assert frames.record_indexes(many[:3], many[:3]).tolist() == [0, 1, 2]


def test_records_cross_as_the_daemons_objects():
    raws = make_records(10, 2)
    records = list(map(Record, raws))
    decoded = frames.records_from(frames.encode_records(records))
    assert [r._raw for r in decoded] == raws
    deaggregated = Record(dict(raws[0], data=None, subSequenceNumber=1), b"user record")
    assert frames.records_from(frames.encode_records([deaggregated]))[0].data == b"user record"


@contextlib.asynccontextmanager
async def _child(tmp_path, handler: str, **settings):
    """A handler process started by hand, killed at the end whatever the test found."""
    s = Settings(handler=handler, state_dir=str(tmp_path), log_format="json", **settings)
    state = str(tmp_path / "child")
    with open(state + ".run", "wb") as f:
        f.write(b"\0" * frames.STATE_SIZE)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "mldserver.pool.child",
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        proc.stdin.write(frames.encode({"op": "start", "handler": handler, "settings": dataclasses.asdict(s),
                                        "sys_path": [os.getcwd()], "state": state}))
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_child_alone_runs_calls_proxies_checkpoints_and_answers_done(tmp_path):
    async with _child(tmp_path, "tests.pool_handlers:EmitCheckpoint") as proc:
        ready, _ = await frames.read_frame_async(proc.stdout)
        assert ready == {"op": "ready", "pid": proc.pid, "emits": True}
        info = ["shardId-1", "TRIM_HORIZON", 0]
        proc.stdin.write(frames.encode({"op": "call", "id": 1, "shard": 9, "action": "initialize", "info": info}))
        done, _ = await frames.read_frame_async(proc.stdout)
        assert (done["op"], done["id"], done["result"]) == ("done", 1, "ok")
        records = make_records(10, 2)
        proc.stdin.write(frames.encode({"op": "call", "id": 2, "shard": 9, "action": "process_records", "info": info,
                                        "millis_behind_latest": 0, "collect": True}, orjson.dumps(records)))
        request, _ = await frames.read_frame_async(proc.stdout)
        assert request == {"op": "checkpoint", "id": 2, "req": 1, "sequence_number": "11", "sub_sequence_number": 0}
        proc.stdin.write(frames.encode({"op": "reply", "req": 1, "error": "ThrottlingException"}))
        done, body = await frames.read_frame_async(proc.stdout)
        assert (done["id"], done["result"], done["error"], done["rows"]) == (2, "checkpoint_failed",
                                                                            "ThrottlingException", 2)
        columns = frames.decode_rows(done["rows"], body)
        # (an array of records, not the daemon's line: their arrival times are read by the child)
        assert columns.records.tolist() == [0, 1] and columns.times.tolist() == [r["approximateArrivalTimestamp"] for r in records]
        assert [orjson.loads(d)["seq"] for d in columns.rows()] == ["10", "11"]
        proc.stdin.write(frames.encode({"op": "call", "id": 3, "shard": 8, "action": "lease_lost", "info": info}))
        done, _ = await frames.read_frame_async(proc.stdout)
        assert done["result"] == "failed" and "no handler for shard" in done["error"]
        proc.stdin.write(frames.encode({"op": "stop"}))
        assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_the_child_alone_sends_the_records_given_up_as_indexes_and_what_the_handler_counted(tmp_path):
    async with _child(tmp_path, "tests.pool_handlers:Changes", handler_retries=1, handler_backoff=0.0) as proc:
        await frames.read_frame_async(proc.stdout)
        info = ["shardId-1", "TRIM_HORIZON", 0]
        proc.stdin.write(frames.encode({"op": "call", "id": 1, "shard": 9, "action": "initialize", "info": info}))
        await frames.read_frame_async(proc.stdout)
        records = make_records(10, 4)
        records[2]["partitionKey"] = "poison"
        proc.stdin.write(frames.encode({"op": "call", "id": 2, "shard": 9, "action": "process_records", "info": info,
                                        "millis_behind_latest": 0, "collect": True}, orjson.dumps(records)))
        request, _ = await frames.read_frame_async(proc.stdout)  # checkpoint(): held short of the failed record
        assert (request["op"], request["sequence_number"], request["sub_sequence_number"]) == ("checkpoint", "11", 0)
        proc.stdin.write(frames.encode({"op": "reply", "req": request["req"], "error": None}))
        done, body = await frames.read_frame_async(proc.stdout)
        assert (done["result"], done["rows"], done["bad"]) == ("ok", 3, [])
        assert done["failed"] == [[2, "RuntimeError: poisoned record", 2]]
        assert done["stats"] == {"on_update_success": 3, "on_update_failure": 2}
        assert frames.decode_rows(done["rows"], body).records.tolist() == [0, 1, 3]
        proc.stdin.write(frames.encode({"op": "call", "id": 3, "shard": 9, "action": "lease_lost", "info": info}))
        done, _ = await frames.read_frame_async(proc.stdout)
        assert done["result"] == "ok" and "failed" not in done and "stats" not in done
        proc.stdin.write(frames.encode({"op": "stop"}))
        assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_the_child_alone_reports_an_import_failure_with_the_importers_message(tmp_path):
    async with _child(tmp_path, "tests.pool_handlers:Nope") as proc:
        failed, _ = await frames.read_frame_async(proc.stdout)
        assert failed == {"op": "import_failed",
                          "error": 'Attribute "Nope" not found in module "tests.pool_handlers" (handler).'}
        assert await asyncio.wait_for(proc.wait(), 10) == 0


PEER = r"""
import sys, os
from mldserver.pool import frames
inp, out = sys.stdin.buffer, sys.stdout.buffer
start, _ = frames.read_frame(inp)
out.write(frames.encode({"op": "ready", "pid": os.getpid()})); out.flush()
call, body = frames.read_frame(inp)
out.write(frames.encode({"op": "checkpoint", "id": call["id"], "req": 1, "sequence_number": None,
                         "sub_sequence_number": None})); out.flush()
reply, _ = frames.read_frame(inp)
assert reply == {"op": "reply", "req": 1, "error": None, "echo": call["action"]}, reply
n, rows, bad = frames.encode_rows([(0, {"n": len(body)}, 7)], [0])
out.write(frames.encode({"op": "done", "id": call["id"], "result": "ok", "error": None, "traceback": None,
                         "rows": n, "bad": bad}, b"".join(rows))); out.flush()
call, _ = frames.read_frame(inp)
os._exit(7)
"""


async def test_the_servers_side_alone_against_a_scripted_peer(tmp_path, monkeypatch):
    script = tmp_path / "peer"
    (script / "mldserver" / "pool").mkdir(parents=True)
    # The peer runs as "python -m mldserver.pool.child": a package path whose child is the script.
    for name in ("__init__.py", "pool/__init__.py"):
        (script / "mldserver" / name).write_text("")
    (script / "mldserver" / "pool" / "child.py").write_text(
        "import sys\nsys.path.remove(sys.path[0])\nsys.modules.pop('mldserver', None)\n"
        "sys.modules.pop('mldserver.pool', None)\n" + PEER)
    monkeypatch.chdir(script)  # ``-m`` looks in the working directory first
    proc = HandlerProcess(Settings(handler="x:y", state_dir=str(tmp_path / "state")), log=get_logger("t"))
    await proc.start()

    async def answer(request):
        return {"error": None, "echo": "process_records"}

    message, body = await proc.call({"op": "call", "id": 5, "action": "process_records"}, b"x" * 10, answer,
                                    ("s", "process_records"))
    assert message["result"] == "ok"
    columns = frames.decode_rows(message["rows"], body)
    assert (columns.records.tolist(), columns.times.tolist(), [orjson.loads(d) for d in columns.rows()]) == (
        [0], [7], [{"n": 10}])
    with pytest.raises(ProcessDied, match="exit_code 7") as died:
        await proc.call({"op": "call", "id": 6, "action": "lease_lost"}, b"", answer, ("s", "lease_lost"))
    assert died.value.blamed  # no call was marked running, and it was the only one in flight
    await proc.stop()


async def test_a_handler_that_cannot_be_imported_fails_the_start_with_the_importers_message(tmp_path):
    proc = HandlerProcess(Settings(handler="tests.nosuch:H", state_dir=str(tmp_path)), log=get_logger("t"))
    with pytest.raises(HandlerImportFailed, match='Could not import module "tests.nosuch"'):
        await proc.start()


def test_records_cross_as_the_line_that_arrived_when_the_server_kept_them_one_for_one():
    raws = make_records(10, 2)
    line = orjson.dumps({"action": "processRecords", "records": raws, "millisBehindLatest": 0})
    assert [r.to_json() for r in frames.records_from(line, line=True)] == raws
    broken = line.replace(b'"pk0"', b'"pk\xff"')  # not UTF-8: decoded tolerantly
    assert frames.records_from(broken, line=True)[0].partition_key == "pk\ufffd"
    records = frames.records_from(memoryview(broken), True, 2)  # the count from the server's call frame
    assert [(r.partition_key, r.data) for r in records] == [("pk\ufffd", Record(raws[0]).data),
                                                            ("pk1", Record(raws[1]).data)]


async def test_a_body_of_megabytes_is_read_whole_in_pieces_and_a_cut_one_reads_as_the_end():
    from mldserver.shard.pieces import PieceReader
    from mldserver.spark import pipes

    body = bytes(range(256)) * 5000  # 1.28 MB: more than one piece
    frame = pipes.encode({"op": "x"}, body)
    reader = PieceReader()  # as a handler process's pipes are read
    for i in range(0, len(frame), 100_000):
        reader.feed_data(frame[i : i + 100_000])
    reader.feed_data(frame[:-1])  # a second frame cut short by EOF
    reader.feed_eof()
    assert await pipes.read_frame_async(reader) == ({"op": "x"}, body)
    assert await pipes.read_frame_async(reader) is None


@pytest.fixture
def native_line(monkeypatch):
    """A line's records as the native parts read them (``LineRecord``): with
    ``MLDSERVER_NO_EXTENSIONS`` set they are put back by hand (they are built)."""
    from mldserver.pool import _b64
    from mldserver.protocol import _scan, lazy

    monkeypatch.setattr(frames, "_datas", _b64.datas)
    monkeypatch.setattr(lazy, "_head", _scan.head)


def _fields(record) -> tuple:
    raw = record.raw  # (a line's record: pysimdjson's lazy mapping, as before)
    return (record.data, record.partition_key, record.sequence_number, record.sub_sequence_number,
            raw.as_dict() if hasattr(raw, "as_dict") else raw)


def test_a_handler_reading_only_the_data_never_parses_the_line_and_the_first_other_field_parses_it_once(
        native_line, monkeypatch):
    raws = make_records(100, 5, partition_key="pk-é")  # (a byte past ASCII: the native check leaves it)
    raws[2]["data"] = "bWV vdw=="  # (not plain base64: read the usual way, leniently)
    raws.append(7)  # what the daemon never sends: a record that is not an object
    for line in (orjson.dumps({"action": "processRecords", "records": raws}),
                 orjson.dumps({"action": "processRecords", "records": raws[:-1]}).replace("é".encode(), b"e")):
        with monkeypatch.context() as patched:
            eager = [Record(raw) for raw in orjson.loads(line)["records"]]
            parses = counted_parses(patched)
            records = frames.records_from(bytearray(line), True)
            plain = line.isascii()
            assert parses == ([] if plain else [1]) and len(records) == len(eager)  # how many: the native check
            assert [r.data for r in records[:2]] == [e.data for e in eager[:2]]
            assert parses == ([] if plain else [1])  # every record's data decoded natively, the line not parsed
            if plain:
                assert all(r._data is not None for r in records[3:])  # (decoded with the first)
            assert records[4].partition_key == eager[4].partition_key
            assert parses == ([1] if plain else [1, 1])  # once, for every record
            for record, expected in zip(records, eager):
                if isinstance(expected.raw, dict):
                    assert _fields(record) == _fields(expected)
                else:
                    assert record.raw == expected.raw
            assert parses == ([1] if plain else [1, 1])


@pytest.mark.parametrize("read_before", ["nothing", "data", "a field", "both"])
def test_records_kept_past_their_call_read_the_line_they_came_from_not_what_reuses_its_region(native_line, read_before):
    raws = make_records(100, 3)
    line = orjson.dumps({"action": "processRecords", "records": raws})
    region = bytearray(line)  # the arena's region, as a handler process sees it
    records = frames.records_from(memoryview(region), True, 3)  # (the count the server's call frame gives)
    if read_before in ("data", "both"):
        records[0].data
    if read_before in ("a field", "both"):
        records[1].partition_key
    frames.line_of(records).close()
    region[:] = b"x" * len(region)  # the next call's line lands there
    eager = [Record(raw) for raw in raws]
    assert [_fields(r) for r in records] == [_fields(e) for e in eager]
