"""The state directory under faults: checked at start-up, write errors retried while
the action still gets its status, dead-letter lines whole or absent, one file per
shard id, and nothing kept for shards that are gone (issue 10, defects 3, 4, 5, 13).
The full disk is a real one: a 1 MiB tmpfs."""

from __future__ import annotations

import gc
import json
import signal
import time
import tracemalloc

import pytest

from mldserver.base.config import Settings
from mldserver.server.server import Server
from mldserver.protocol.framing import LineBuffer
from mldserver.shard.driver import ShardDriver
from mldserver.shard.slots import Wire
from mldserver.api.testing import make_records

from ..handlers import Noop
from ..harness import eventually
from .conftest import assert_refused, explained, launch
from .peer import Peer, initialize, process_records, wait_event

SHARD = "shardId-000000000001"


def behind_the_tip(first: int, count: int, data_bytes: int = 8) -> dict:
    """A batch far behind the stream's tip, arriving now: its window stays open (the
    shard's watermark is its own last row)."""
    now = int(time.time() * 1000)
    return process_records(make_records(first, count, data_bytes, approximate_arrival_timestamp=now),
                           millis_behind_latest=10**9)


def no_space_logged(server) -> bool:
    return "No space left on device" in server.log_path.read_text() if server.log_path.exists() else False


@pytest.mark.parametrize("where", ["a_regular_file", "under_proc"])
def test_a_state_dir_that_cannot_be_written_is_refused_at_start_up(tmp_path, where):
    if where == "a_regular_file":
        state = tmp_path / "state"
        state.write_text("not a directory\n")
    else:
        state = "/proc/mldserver-state"
    result = launch(tmp_path, "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir", str(state))
    assert_refused(result, str(state))


@pytest.mark.parametrize("write", ["dead_letter", "shard_end_spool"])
async def test_a_full_disk_is_waited_out_and_the_action_still_answered(serve, small_fs, config_file, tmp_path, write):
    state = small_fs.path / "state"
    if write == "dead_letter":
        server = serve("tests.handlers:Raise", "--state-dir", str(state),
                       "--config", config_file(handler_retries=0, handler_backoff=0.01))
    else:
        server = serve("tests.faulty_handlers:EmitRows", "--state-dir", str(state),
                       "--sink", f"file:{tmp_path / 'out'}")
    peer = await Peer.open(server.port)
    with explained(server):
        await peer.action(initialize(SHARD))
        if write == "dead_letter":
            batch, name = process_records(make_records(1, 1, data_bytes=20_000)), "processRecords"
        else:
            await peer.action(behind_the_tip(1, 3))
            batch, name = {"action": "shardEnded"}, "shardEnded"
        small_fs.fill()
        await peer.send(json.dumps(batch).encode() + b"\n")
        await eventually(lambda: no_space_logged(server), 30, what="the server to log the full disk")
        small_fs.free()
        await peer.answer(name, timeout=30)
    if write == "dead_letter":
        lines = (state / "dead-letters" / f"{SHARD}.jsonl").read_text().splitlines()
        assert [json.loads(line)["sequence_number"] for line in lines] == ["1"]
    else:
        assert not list((state / "spool").glob("*.tmp")), "a temporary spool file was left behind"
        assert (state / "spool").glob("*.jsonl")


async def test_a_torn_dead_letter_line_never_swallows_the_next_record(serve, small_fs, config_file):
    state = small_fs.path / "state"
    server = serve("tests.handlers:Raise", "--state-dir", str(state),
                   "--config", config_file(handler_retries=0, handler_backoff=0.01))
    peer = await Peer.open(server.port)
    await peer.action(initialize(SHARD))
    (state / "dead-letters").mkdir(parents=True, exist_ok=True)
    small_fs.fill(keep=4096)  # room for part of the next dead letter, not all of it
    await peer.send(json.dumps(process_records(make_records(1, 1, data_bytes=20_000))).encode() + b"\n")
    await eventually(lambda: no_space_logged(server), 30, what="the server to log the full disk")
    small_fs.free()
    await peer.answer("processRecords", timeout=30)
    await peer.action(process_records(make_records(2, 1, data_bytes=100)))
    lines = (state / "dead-letters" / f"{SHARD}.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"", "the dead-letter file does not end with a whole line"
    bad = []
    for line in lines[:-1]:
        try:
            json.loads(line)
        except ValueError:
            bad.append(line[:60] + b"..." + line[-200:])
    assert not bad, f"dead-letter lines that are not whole JSON (a torn line and what was appended to it): {bad}"
    seqs = [json.loads(line)["sequence_number"] for line in lines[:-1]]
    assert "2" in seqs


async def test_each_shard_id_spools_to_its_own_file_and_both_replay_after_a_restart(serve, config_file, tmp_path):
    out = tmp_path / "out"
    server = serve("tests.faulty_handlers:EmitRows", "--sink", f"file:{out}")
    shards = {"shardId-x_1": 1, "shardId-x/1": 101}
    for shard_id, first in shards.items():
        peer = await Peer.open(server.port)
        await peer.action(initialize(shard_id))
        await peer.action(behind_the_tip(first, 3))
        await peer.action({"action": "shardEnded"})
        assert await peer.finish() == b""
    await eventually(lambda: sum(e["event"] == "spooled" for e in server.events()) == 2, 30,
                     what="both shards to spool")
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    # Restarted with a short idle time-out: the replayed shards stop holding, their windows commit.
    again = serve("tests.faulty_handlers:EmitRows", "--sink", f"file:{out}", "--config", config_file(idle_timeout=0.5))
    await wait_event(again, "window_committed", 60)
    rows = [json.loads(line) for path in out.glob("*.jsonl") for line in path.read_text().splitlines()]
    seqs = sorted(int(r["seq"]) for r in rows)
    assert seqs == [1, 2, 3, 101, 102, 103], f"rows committed after the restart: {seqs}"


def _mldserver_bytes(snapshot) -> int:
    return sum(stat.size for stat in snapshot.statistics("filename") if "/mldserver/" in stat.traceback[0].filename)


async def _in_process_server(tmp_path, **settings) -> Server:
    """A started server in the test's process, with a file sink, serving ``Noop``."""
    server = Server(Settings(handler="test", port=0, state_dir=str(tmp_path / "state"),
                             sink=f"file:{tmp_path / 'out'}", **settings), Noop)
    await server.start()
    return server


async def _end_a_shard(server: Server, shard_id: str, records: list) -> None:
    """One connection: the shard initialized, ``records`` processed, the shard ended,
    the connection closed by the test's side."""
    peer = await Peer.open(server.address[1])
    await peer.action(initialize(shard_id))
    await peer.action(process_records(records))
    await peer.action({"action": "shardEnded"})
    assert await peer.finish() == b""
    # The test's own connections are not the server's state: kept until the test
    # ends, their buffers were counted (tracemalloc files a block under the line
    # that first allocated it, an mldserver line when the allocator reuses one).
    peer.close()
    await peer.writer.wait_closed()
    Peer.opened.remove(peer)


async def test_ended_shards_leave_no_state_behind(tmp_path):
    server = await _in_process_server(tmp_path, idle_timeout=0.2)

    async def cycle(i: int) -> None:
        await _end_a_shard(server, f"shardId-{i:012d}", [])

    tracemalloc.start()
    try:
        for i in range(50):
            await cycle(i)
        await eventually(lambda: not server.drivers, 10, what="the connections to close")
        gc.collect()
        first = tracemalloc.take_snapshot()
        before = _mldserver_bytes(first)
        for i in range(50, 450):
            await cycle(i)
        await eventually(lambda: not server.drivers, 10, what="the connections to close")

        def grown() -> int:
            gc.collect()
            return _mldserver_bytes(tracemalloc.take_snapshot()) - before

        try:
            await eventually(lambda: grown() < 400 * 100, 5, what="the ended shards' state to be freed")
        except AssertionError:
            gc.collect()
            where = [str(d) for d in tracemalloc.take_snapshot().compare_to(first, "lineno")
                     if "/mldserver/" in d.traceback[0].filename and d.size_diff > 0][:5]
            raise AssertionError(f"400 ended shards still hold {grown()} bytes of mldserver state "
                                 f"(~{grown() // 400} bytes each), the most grown at: {where}") from None
    finally:
        tracemalloc.stop()
        await server.shutdown()


async def test_a_closed_connection_keeps_nothing_of_it_alive(tmp_path):
    """Once a shard's connection closes, its wire (the read buffer, 64 KiB) and its driver
    go with it: a copy of the driver task's context that outlives the task (a timer the
    task started and cancelled holds one, on asyncio's loop until the timer's time
    comes) keeps none of them."""
    server = await _in_process_server(tmp_path)
    try:
        await _end_a_shard(server, "shardId-000000000001", make_records(1, 3))
        await eventually(lambda: not server.drivers, 10, what="the connection to close")
        gc.collect()
        alive = [type(o).__name__ for o in gc.get_objects() if isinstance(o, (Wire, ShardDriver, LineBuffer))]
        assert not alive, f"a closed connection's parts still alive: {alive}"
    finally:
        await server.shutdown()
