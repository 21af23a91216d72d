"""Values the server must refuse or survive: malformed values in what the daemon or
a handler sends (dead-lettered, the action answered), settings out of range and
start-up mistakes (refused in one clear line naming the setting or path), and the
smaller unclear errors (issue 10, defects 7, 10, 11, 15)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from mldserver.api.testing import make_records

from ..harness import MLDSERVER, ROOT, eventually
from .conftest import assert_refused, explained, launch
from .peer import Peer, initialize, process_records, wait_event, wait_exit

SHARD = "shardId-000000000001"


def dead_lettered(state_dir) -> list[dict]:
    folder = state_dir / "dead-letters"
    if not folder.is_dir():
        return []
    return [json.loads(line) for path in folder.glob("*.jsonl") for line in path.read_text().splitlines()]


def with_field(records: list[dict], **fields) -> list[dict]:
    return [{**r, **fields} for r in records]


# -- defect 7: malformed values are dead-lettered, the action answered -------------------

MALFORMED = {
    # name: (handler, sink?, shard id, the batch's records, the sequence number dead-lettered)
    "non_numeric_sequence_number": ("tests.handlers:Noop", False, SHARD,
                                    with_field(make_records(1, 1), sequenceNumber="abc"), "abc"),
    "arrival_time_yesterday_with_a_sink": ("tests.faulty_handlers:EmitRows", True, SHARD,
                                           with_field(make_records(1, 1), approximateArrivalTimestamp="yesterday"),
                                           "1"),
    "emitted_event_time_soon": ("tests.faulty_handlers:EmitSoon", True, SHARD, make_records(1, 1), "1"),
    "shard_id_of_5000_characters": ("tests.handlers:Raise", False, "shardId-" + "7" * 4992, make_records(1, 1), "1"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_value_is_dead_lettered_and_the_batch_answered(serve, tmp_path, case):
    handler, sink, shard_id, records, seq = MALFORMED[case]
    server = serve(handler, *(["--sink", f"file:{tmp_path / 'out'}"] if sink else []))
    peer = await Peer.open(server.port)
    with explained(server):
        await peer.action(initialize(shard_id))
        await peer.action(process_records(records))
        await peer.action(process_records(make_records(2, 1)))
    letters = dead_lettered(server.state_dir)
    assert [d["sequence_number"] for d in letters if d.get("shard_id") == shard_id][:1] == [seq]


# -- defect 10: --unix never deletes what is at its path --------------------------------

@pytest.mark.parametrize("there", ["a_regular_file", "a_running_servers_socket"])
async def test_unix_never_deletes_what_is_at_its_path(serve, tmp_path, there):
    path = tmp_path / "mld.sock"
    first = None
    if there == "a_regular_file":
        path.write_text("precious\n")
    else:
        first = serve("tests.handlers:Noop", "--unix", str(path))
    second = launch(tmp_path, "--handler", "tests.handlers:Noop", "--unix", str(path),
                    "--state-dir", str(tmp_path / "state2"))
    assert_refused(second, str(path))
    if first is None:
        assert path.read_text() == "precious\n"
    else:
        reader, writer = await asyncio.open_unix_connection(str(path))
        peer = Peer(reader, writer)
        await peer.action(initialize(SHARD), timeout=10)
        assert any(e["event"] == "initialize" for e in first.events()), "the first server lost its socket"


# -- defect 11: settings out of range are refused -----------------------------------------

OUT_OF_RANGE = {
    "execution_timeout_0": ("execution_timeout", {"execution_timeout": 0.0}, ()),
    "execution_timeout_negative": ("execution_timeout", {"execution_timeout": -1.0}, ()),
    "handler_retries_negative": ("handler_retries", {"handler_retries": -1}, ()),
    "max_line_size_0": ("max_line_size", {"max_line_size": 0}, ()),
    "window_0": ("window", {"window": 0.0}, ()),
    "window_tiny": ("window", {"window": 1e-6}, ()),
    "window_negative": ("window", {"window": -60.0}, ()),
    "idle_timeout_0": ("idle_timeout", {"idle_timeout": 0.0}, ()),
    "window_nan_flag": ("window", {}, ("--window", "nan")),
    "port_99999_flag": ("port", {}, ("--port", "99999")),
}


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_a_setting_out_of_range_is_refused_naming_it(tmp_path, config_file, case):
    name, values, flags = OUT_OF_RANGE[case]
    args = ["--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"),
            "--sink", f"file:{tmp_path / 'out'}", "--config", config_file(**values)]
    if "--port" not in flags:
        args += ["--port", "0"]
    assert_refused(launch(tmp_path, *args, *flags), name)


# -- defect 15: unclear errors ------------------------------------------------------------

def _start_up_case(case: str, tmp_path, config_file, held: list) -> tuple[list[str], str]:
    """(serve arguments, what the one-line message must name); sockets it holds go in ``held``"""
    state = ["--state-dir", str(tmp_path / "state")]
    noop = ["--handler", "tests.handlers:Noop"]
    if case == "config_not_utf8":
        path = tmp_path / "latin1.toml"
        path.write_bytes('handler = "tests.handlers:Noop"\n# caf\xe9\n'.encode("latin-1"))
        return ["--config", str(path), "--port", "0", *state], str(path)
    if case == "log_level_verbose":
        return [*noop, "--port", "0", *state, "--config", config_file(log_level="verbose")], "log_level"
    if case == "port_in_use":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        held.append(sock)
        port = str(sock.getsockname()[1])
        return [*noop, "--port", port, *state], port
    if case == "port_negative":
        return [*noop, *state, "--config", config_file(port=-1)], "port"
    if case == "host_unknown":
        return [*noop, "--port", "0", "--host", "no-such-host.invalid", *state], "no-such-host.invalid"
    if case == "unix_in_a_missing_folder":
        path = str(tmp_path / "missing" / "mld.sock")
        return [*noop, "--unix", path, *state], path
    if case == "log_file_in_a_missing_folder":
        path = str(tmp_path / "missing" / "server.log")
        return [*noop, "--port", "0", *state, "--log-file", path], path
    if case == "admin_in_use":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        held.append(sock)
        admin = f"127.0.0.1:{sock.getsockname()[1]}"
        return [*noop, "--port", "0", *state, "--admin", admin], admin
    if case == "handler_not_found":
        return ["--handler", "tests.no_such_module:H", "--port", "0", *state], "tests.no_such_module"
    if case == "handler_typo":
        return ["--handler", "tests.faulty_handlers:Typo", "--port", "0", *state], "did you mean process_records?"
    if case == "handler_constructor":
        return ["--handler", "tests.faulty_handlers:NoContext", "--port", "0", *state], "NoContext(context) failed"
    if case == "window_without_sink":
        return [*noop, "--port", "0", *state, "--window", "60"], "--sink"
    if case == "unknown_setting":
        return [*noop, "--port", "0", *state, "--config", config_file(wokers=2)], "did you mean 'workers'?"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["config_not_utf8", "log_level_verbose", "port_in_use", "port_negative",
                                  "host_unknown", "unix_in_a_missing_folder", "log_file_in_a_missing_folder",
                                  "admin_in_use", "handler_not_found", "handler_typo", "handler_constructor",
                                  "window_without_sink", "unknown_setting"])
def test_a_start_up_mistake_is_one_line_naming_the_setting_or_path(tmp_path, config_file, case):
    """Exit 2 and one line on stderr, where the logs go too: nothing of a shutdown for
    parts that never started."""
    held: list[socket.socket] = []
    try:
        args, named = _start_up_case(case, tmp_path, config_file, held)
        assert_refused(launch(tmp_path, *args), named)
    finally:
        for sock in held:
            sock.close()


def test_the_relay_refuses_an_impossible_port_in_one_line():
    done = subprocess.run([MLDSERVER, "connect", "127.0.0.1:99999", "--connect-timeout", "1"], cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "99999" in lines[0], done.stderr


async def test_a_peer_reset_is_logged_as_a_disconnect_not_a_crash(serve):
    server = serve("tests.handlers:Noop")
    peer = await Peer.open(server.port)
    await peer.action(initialize(SHARD))
    sock = peer.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close sends RST
    peer.close()
    await wait_event(server, "closed", 30, shard_id=SHARD)
    server.proc.send_signal(signal.SIGTERM)
    assert await wait_exit(server.proc, 30) == 0
    crashed = [e for e in server.events() if e["event"] == "driver_crashed" or "traceback" in e]
    assert not crashed, f"a reset peer was logged as a crash: {[(e['event'], e.get('traceback', '')[-80:]) for e in crashed]}"


async def test_a_handler_method_missing_async_is_named_and_not_retried(serve):
    try:
        server = serve("tests.faulty_handlers:SyncProcessRecords")
    except RuntimeError as exc:  # refused at start-up: fine, if it says why
        assert "process_records" in str(exc) and "async" in str(exc), str(exc)
        return
    peer = await Peer.open(server.port)
    await peer.action(initialize(SHARD))
    await peer.action(process_records(make_records(1, 1)))
    calls = [e for e in server.events() if e["event"] == "sync_handler_called"]
    failed = [e for e in server.events() if e["event"] == "handler_failed"]
    assert len(calls) == 1, f"the synchronous process_records ran {len(calls)} times"
    assert failed and "async" in failed[-1]["error"], failed


async def test_an_event_time_past_64_bits_still_logs_its_window(serve, tmp_path):
    out = tmp_path / "out"
    server = serve("tests.faulty_handlers:EventTimeFromKey", "--sink", f"file:{out}")
    peer = await Peer.open(server.port)
    await peer.action(initialize(SHARD))
    # Behind the tip: the shard's watermark is its last row's event time. An event time
    # past 2**64 ms is no epoch time (defect 7): its row is a bad row, dead-lettered with
    # its record, and never reaches the windows or the logs. The third batch moves the
    # watermark on an hour, which closes the first batch's window.
    now = int(time.time() * 1000)
    await peer.action(process_records(make_records(1, 1, approximate_arrival_timestamp=now),
                                      millis_behind_latest=10**9))
    await peer.action(process_records(make_records(2, 1, partition_key=str(2**64 + 1000)),
                                      millis_behind_latest=10**9))
    await peer.action(process_records(make_records(3, 1, approximate_arrival_timestamp=now + 3_600_000),
                                      millis_behind_latest=10**9))
    await eventually(lambda: list(out.glob("*.jsonl")), 60, what="the first window to be written")
    with explained(server):
        await wait_event(server, "window_committed", 5)
    assert [(d["sequence_number"], d["reason"]) for d in dead_lettered(server.state_dir)] == [("2", "bad row")]


async def test_rows_without_an_event_time_take_their_records_arrival_times_filled_in_by_the_server(serve, tmp_path):
    out = tmp_path / "out"
    # Handler processes (the default): the passthrough emits no event time, so each row's
    # is its record's arrival time, which the server reads from the line with the
    # positions. An arrival time that is no event time makes its row a bad row,
    # dead-lettered with its record and why; the batch goes on.
    server = serve("mldserver.examples.passthrough:Passthrough", "--sink", f"file:{out}", "--window", "60")
    peer = await Peer.open(server.port)
    await peer.action(initialize(SHARD))
    hour = (int(time.time() * 1000) // 3_600_000 - 2) * 3_600_000  # two hours ago, on a window's start
    records = make_records(1, 4, approximate_arrival_timestamp=hour + 1_000)
    records[1]["approximateArrivalTimestamp"] = "soon"
    records[2]["approximateArrivalTimestamp"] = 1.5
    records[3]["approximateArrivalTimestamp"] = hour + 2_000
    await peer.action(process_records(records, millis_behind_latest=10**9))
    # an hour on: the watermark passes the first window, which closes
    await peer.action(process_records(make_records(5, 1, approximate_arrival_timestamp=hour + 3_600_000),
                                      millis_behind_latest=10**9))
    with explained(server):
        await wait_event(server, "window_committed", 30)
    [committed] = [e for e in server.events() if e["event"] == "window_committed"]
    assert committed["window"] == f"{hour}-{hour + 60_000}" and committed["rows"] == 2
    rows = [json.loads(line) for path in out.rglob("*.jsonl") for line in path.read_text().splitlines()]
    assert [(r["sequence_number"], r["approximate_arrival_timestamp"]) for r in rows] == [
        ("1", hour + 1_000), ("4", hour + 2_000)]
    letters = dead_lettered(server.state_dir)
    assert [(d["sequence_number"], d["reason"]) for d in letters] == [("2", "bad row"), ("3", "bad row")]
    assert "event time 'soon' from the record's approximateArrivalTimestamp" in letters[0]["error"]
    assert "event time 1.5 from the record's approximateArrivalTimestamp" in letters[1]["error"]
    assert all(d["data"] for d in letters)


async def test_sighup_never_kills_the_server_without_a_clean_shutdown(serve):
    server = serve("tests.handlers:Noop")
    server.proc.send_signal(signal.SIGHUP)
    code = await wait_exit(server.proc, 10)
    if code is None:  # SIGHUP ignored: the server still serves
        peer = await Peer.open(server.port)
        await peer.action(initialize(SHARD))
        return
    assert code == 0 and any(e["event"] == "stopped" for e in server.events()), (
        f"SIGHUP ended the server with exit code {code}, without the 'stopped' event of a clean shutdown")


async def test_binding_every_interface_is_warned_about(serve):
    server = serve("tests.handlers:Noop", "--host", "0.0.0.0")
    warned = [e for e in server.events() if e.get("level") == "warning" and "0.0.0.0" in json.dumps(e)]
    assert warned, "no warning that 0.0.0.0 exposes the unauthenticated protocol on every interface"


def test_spark_without_java_is_one_line_naming_what_to_install(tmp_path):
    result = launch(tmp_path, "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir", str(tmp_path / "state"),
                    "--sink", f"parquet:{tmp_path / 'out'}", env={"JAVA_HOME": "", "PATH": str(tmp_path / "nothing")})
    assert_refused(result, "needs Java 17 or later", "no java is on PATH", "apt-get install openjdk-17-jre-headless")


def test_a_java_too_old_is_named_with_its_version(tmp_path):
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\necho \'openjdk version "11.0.21" 2023-10-17\' >&2\n')
    java.chmod(0o755)
    result = launch(tmp_path, "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir", str(tmp_path / "state"),
                    "--sink", f"parquet:{tmp_path / 'out'}", env={"JAVA_HOME": str(tmp_path / "jdk")})
    assert_refused(result, f"{java} is Java 11", "set JAVA_HOME")


@pytest.mark.parametrize("missing, args, extra", [
    ("pyspark", ["--pipeline", "mldserver.examples.orders:per_customer"], "mldserver[spark]"),
    ("pyspark", ["--sink", "parquet:out"], "mldserver[spark]"),
    ("pyiceberg", ["--sink", "iceberg:out", "--config", "STREAM"], "mldserver[iceberg]"),
])
def test_a_feature_whose_extra_is_not_installed_names_the_extra_in_one_line(tmp_path, config_file, missing, args,
                                                                              extra):
    """The core install (pip install mldserver) lacks Spark and Iceberg: here the module
    is hidden from this one process (sys.modules[name] = None), as a venv without the
    extra lacks it."""
    args = [config_file(stream="orders") if a == "STREAM" else a for a in args]
    code = (f"import sys; sys.modules[{missing!r}] = None; from mldserver.cli import main; "
            f"main(['serve', '--handler', 'tests.handlers:Noop', '--port', '0', '--admin', 'off', "
            f"'--state-dir', {str(tmp_path / 'state')!r}, *{args!r}])")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and f"pip install '{extra}'" in done.stderr, done.stderr
