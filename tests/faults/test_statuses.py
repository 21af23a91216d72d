"""Every action read is answered with exactly one status, whatever the handler, the
checkpoint conversation or the other connections do (issue 10, defects 1, 2, 6, 8,
9, 12, 14). Black-box: ``mldserver serve`` in a subprocess, the daemon's side played
over raw sockets by the strict ``Peer``."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from mldserver.api.testing import make_records

from ..harness import eventually
from .conftest import explained
from .peer import Peer, initialize, ok_reply, process_records, wait_event, wait_exit

SHARD = "shardId-000000000001"


async def slow_reply(request):
    await asyncio.sleep(0.4)  # the daemon's side: a lease table that answers slowly
    return ok_reply(request)


@pytest.mark.parametrize(
    "handler, extra",
    [
        ("tests.faulty_handlers:WorkThenCheckpoint", ("--execution-timeout", "1")),
        ("tests.faulty_handlers:CheckpointWithinOwnTimeout", ()),
    ],
    ids=["execution_timeout", "handler_wait_for"],
)
async def test_a_time_out_during_a_checkpoint_still_answers_the_batch(serve, handler, extra):
    server = serve(handler, *extra, env={"MLDSERVER_TEST_WORK": "0.8"})
    peer = await Peer.open(server.port)
    with explained(server):
        await peer.action(initialize(SHARD))
        await peer.action(process_records(make_records(1, 3)), reply=slow_reply, timeout=30)
        await peer.action(process_records(make_records(4, 1)), reply=slow_reply, timeout=30)
        assert await peer.finish() == b"", "the server wrote something after the last status"
    assert not [e for e in server.events() if e["event"] == "driver_crashed"]


async def test_sigterm_answers_every_shard_whose_action_arrived_even_past_the_in_flight_slots(serve):
    server = serve("tests.faulty_handlers:SlowLogged", env={"MLDSERVER_TEST_SLEEP": "2"})
    peers = [await Peer.open(server.port) for _ in range(20)]
    for i, peer in enumerate(peers):
        await peer.action(initialize(f"shardId-{i:012d}"))
    for i, peer in enumerate(peers):
        await peer.send(json.dumps(process_records(make_records(10 * i + 1, 2))).encode() + b"\n")
    # max_batches_in_flight is 8: the other 12 actions wait for a slot.
    await eventually(lambda: sum(e["event"] == "handler_started" for e in server.events()) >= 8, 30,
                     what="8 handlers to start")
    server.proc.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*(p.answer("processRecords", timeout=60) for p in peers), return_exceptions=True)
    unanswered = [(i, str(r)) for i, r in enumerate(results) if isinstance(r, BaseException)]
    with explained(server):
        assert not unanswered, f"{len(unanswered)} of 20 shards got no status after SIGTERM: {unanswered[:2]}"
        assert await wait_exit(server.proc, 30) == 0


@pytest.mark.parametrize("stall", ["peers_stop_mid_action", "handlers_hang"])
async def test_stalled_peers_or_hanging_handlers_cannot_freeze_a_new_shard(serve, config_file, stall):
    quick_stop = ("--config", config_file(shutdown_timeout=2.0))
    if stall == "peers_stop_mid_action":
        server = serve("tests.handlers:Noop", *quick_stop)
    else:
        server = serve("tests.faulty_handlers:Hang", *quick_stop)  # execution_timeout: the default 60 s
    stalled = [await Peer.open(server.port) for _ in range(8)]
    for i, peer in enumerate(stalled):
        await peer.action(initialize(f"shardId-{i:012d}"))
        if stall == "peers_stop_mid_action":
            await peer.send(b'{"action":"processRecords","records":[{"data":"AA==",')  # ... and nothing more
        else:
            await peer.send(json.dumps(process_records(make_records(1, 1))).encode() + b"\n")
    if stall == "handlers_hang":
        await eventually(lambda: sum(e["event"] == "handler_started" for e in server.events()) >= 8, 30,
                         what="8 handlers to hang")
    newcomer = await Peer.open(server.port)
    with explained(server):
        await newcomer.action(initialize("shardId-000000000100"), timeout=15)
        if stall == "peers_stop_mid_action":  # they hold no decoded batch: nothing to wait for
            await newcomer.action(process_records(make_records(1, 2)), timeout=15)
        else:  # the hanging handlers hold their slots: a batch waits, and who holds it up is logged
            await newcomer.send(json.dumps(process_records(make_records(1, 2))).encode() + b"\n")
            held = await wait_event(server, "slots_held", 15)
            assert sum(h.get("callback") == "process_records" for h in held["holders"]) == 8, held
        held_up = [e for e in server.events() if e.get("level") in ("warning", "error")]
        assert held_up, "nothing was logged about the connections holding the others up"


async def test_a_malformed_checkpoint_reply_is_a_failed_checkpoint_not_a_status(serve, config_file):
    server = serve("tests.handlers:CheckpointNull", "--config", config_file(shutdown_timeout=2.0))
    peer = await Peer.open(server.port)

    def malformed(request):
        return {"action": "checkpoint", "sequenceNumber": {"not": "a string"}, "subSequenceNumber": 0, "error": None}

    with explained(server):
        await peer.action(initialize(SHARD))
        requests = await peer.action(process_records(make_records(1, 3)), reply=malformed)
        assert len(requests) == 1
        await peer.action(process_records(make_records(4, 1)))
        assert await peer.finish() == b""


async def test_a_handler_that_swallows_cancellation_cannot_hold_its_status_or_the_shutdown(serve, config_file):
    server = serve("tests.faulty_handlers:SwallowCancel", "--execution-timeout", "1",
                   "--config", config_file(handler_retries=0, shutdown_timeout=3.0))
    try:
        peer = await Peer.open(server.port)
        with explained(server):
            await peer.action(initialize(SHARD))
            await peer.action(process_records(make_records(1, 1)), timeout=15)
            server.proc.send_signal(signal.SIGTERM)
            code = await wait_exit(server.proc, 20)
            assert code == 0, f"the server did not stop within 20 s of SIGTERM (exit code {code})"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


async def test_a_line_over_max_line_size_is_answered_and_dead_lettered_whole(serve):
    server = serve("tests.handlers:Noop", "--max-line-size", "4096")
    peer = await Peer.open(server.port)
    record = make_records(1, 1, data_bytes=6000)
    line = json.dumps(process_records(record)).encode()
    with explained(server):
        await peer.action(initialize(SHARD))
        await peer.action(line, timeout=10)
        await peer.action(process_records(make_records(2, 1)))
    letters_dir = server.state_dir / "dead-letters"
    kept = "".join(p.read_text() for p in letters_dir.glob("*.jsonl")) if letters_dir.is_dir() else ""
    assert record[0]["data"] in kept, "the over-long line was not dead-lettered whole"


async def test_a_checkpointer_kept_past_its_action_no_longer_checkpoints(serve):
    server = serve("tests.faulty_handlers:KeepCheckpointer")
    peer = await Peer.open(server.port)
    with explained(server):
        await peer.action(initialize(SHARD))
        assert await peer.action(process_records(make_records(1, 3))) == []
        during_second = await peer.action(process_records(make_records(4, 3)))
        assert during_second == [], (
            f"the first batch's checkpointer reached the daemon during the second batch: {during_second}")
        assert [e for e in server.events() if e["event"] == "stale_checkpointer_refused"]
