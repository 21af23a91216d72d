"""``mldserver run``: the server, then the real KCL MultiLangDaemon (Java, from the
kclpy-ext jars) as its supervised child. What needs the daemon to reach Kinesis is in
tests/integration/test_real_daemon.py; here the JVM runs on a file it refuses, which
is quick, and the refusals before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from mldserver.ops.tether import started

from .harness import MLDSERVER, ROOT

NO_STREAM = """\
# no streamName: the daemon exits at once
executableName = some/other/relay \\
    --with args
applicationName = quick
regionName = us-east-1
shutdownGraceMillis = 1000
"""


# Endpoints where nothing listens: the daemon retries its lease coordinator's start for
# minutes ("Initializing LeaseCoordinator attempt N"), a daemon that stays up without emulators.
NOWHERE = """\
streamName = nowhere
applicationName = nowhere
regionName = us-east-1
AWSCredentialsProvider = DefaultCredentialsProvider
kinesisEndpoint = http://127.0.0.1:9
dynamoDBEndpoint = http://127.0.0.1:9
metricsLevel = NONE
shutdownGraceMillis = 30000
"""


def run(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MLDSERVER, "run", "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir", str(tmp_path / "state"),
         "--log-file", str(tmp_path / "server.log"), "--admin", "127.0.0.1:0", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def events(tmp_path) -> list[dict]:
    path = tmp_path / "server.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_daemon_that_exits_by_itself_is_logged_with_why_and_run_exits_1(tmp_path):
    props = tmp_path / "quick.properties"
    props.write_text(NO_STREAM)
    done = run(tmp_path, "--properties", str(props), env={"MLDSERVER_JAXB_JAR": str(tmp_path / "no-jaxb.jar")})
    assert done.returncode == 1, done.stderr
    why = "the KCL MultiLangDaemon exited by itself with code 1: java.lang.NullPointerException: Stream name or " \
          "Stream Arn is required."
    assert done.stderr.startswith(f"mldserver: DaemonExited: {why}")
    by = {e["event"]: e for e in events(tmp_path)}
    order = [e["event"] for e in events(tmp_path)]
    assert "NoClassDefFoundError" in by["jaxb_missing"]["what_to_do"]
    assert by["properties_error"]["key"] == "streamName"
    assert by["executable_overridden"]["was"] == "some/other/relay --with args"
    assert by["daemon_error"]["line"].startswith("java.lang.NullPointerException: Stream name or Stream Arn")
    assert by["daemon_exited"]["returncode"] == 1
    assert by["task_crashed"]["task"] == "kcl-daemon" and by["task_crashed"]["error"].startswith(f"DaemonExited: {why}")
    assert order.index("listening") < order.index("daemon_started") < order.index("daemon_exited") \
        < order.index("shutting_down") < order.index("stopped")
    # The daemon ran on a copy of the file with this server's relay as its executableName.
    effective = (tmp_path / "state" / "daemon" / "daemon.properties").read_text()
    assert "# (mldserver run) executableName = some/other/relay \\\n# (mldserver run)     --with args\n" in effective
    worker = by["daemon_started"]["worker_id"]
    assert effective.endswith(f"executableName = {by['daemon_started']['executable']}\n# This state dir's worker: a "
                              f"restart resumes its own leases.\nworkerId = {worker}\n")
    assert (tmp_path / "state" / "daemon" / "worker-id").read_text() == worker + "\n"
    assert not (tmp_path / "state" / "daemon" / "daemon.pid").exists()  # it exited: nothing left to stop
    assert by["daemon_started"]["executable"].endswith(f" connect 127.0.0.1:{by['listening']['port']}")
    assert "Stream name or Stream Arn is required" in (tmp_path / "state" / "daemon" / "daemon.log").read_text()


def test_a_properties_file_that_is_missing_stops_run_before_anything_starts(tmp_path):
    done = run(tmp_path, "--properties", str(tmp_path / "nope.properties"))
    assert done.returncode == 2
    assert done.stderr == (f"mldserver: --properties {tmp_path / 'nope.properties'}: no such file: give the "
                           f"daemon's properties file (deploy/mld.properties is a template)\n")
    assert not [e for e in events(tmp_path) if e["event"] == "listening"]


def test_no_java_is_said_before_anything_starts(tmp_path):
    props = tmp_path / "p.properties"
    props.write_text(NO_STREAM)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    done = subprocess.run(
        [MLDSERVER, "run", "--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"),
         "--properties", str(props)],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT), "PATH": str(tmp_path)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("mldserver: mldserver run (the KCL MultiLangDaemon) needs Java 17 or later, and "
                                  "there is none: JAVA_HOME is not set and no java is on PATH; install one")
    assert done.stderr.count("\n") == 1


def test_no_jars_names_the_extra_to_install(tmp_path):
    # An amazon_kclpy package without its jars ahead of the installed one on the path.
    (tmp_path / "shadow" / "amazon_kclpy").mkdir(parents=True)
    (tmp_path / "shadow" / "amazon_kclpy" / "__init__.py").write_text("")
    props = tmp_path / "p.properties"
    props.write_text(NO_STREAM)
    done = subprocess.run(
        [MLDSERVER, "run", "--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"),
         "--properties", str(props)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{tmp_path / 'shadow'}:{ROOT}"}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == ("mldserver: the KCL MultiLangDaemon jars are not installed: pip install 'mldserver[kcl]' "
                           "(the kclpy-ext wheel ships them)\n")


def test_the_systemd_unit_runs_mldserver_run_with_flags_it_has_and_signals_only_it():
    from mldserver.cli import _parser

    unit = (ROOT / "deploy" / "mldserver-run.service").read_text()
    exec_start = unit.split("ExecStart=", 1)[1].split("\n#", 1)[0].replace("\\\n", " ").split()
    args = _parser().parse_args(exec_start[1:])
    assert (args.command, args.properties, args.handler) == ("run", "/etc/mldserver/mld.properties", "orders:Orders")
    assert "\nKillMode=mixed\n" in unit and "\nRestart=on-failure\n" in unit


def test_the_daemons_lines_that_matter_become_events():
    from mldserver.ops.daemon import scan

    prefix = "2026-11-22 09:51:05,865 [ShardRecordProcessor-0003] INFO  s.a.kinesis.multilang.MessageWriter [NONE] - "
    assert scan(prefix + "Writing LeaseLostMessage to child process for shard shardId-000000000002 ") == (
        "daemon_lease_lost", "info", {"shard_id": "shardId-000000000002"})
    discoverer = "2026-11-22 09:50:40,585 [LeaseCoordinator-0002] INFO  s.a.k.l.d.DynamoDBLeaseDiscoverer [NONE] - "
    assert scan(discoverer + "New leases assigned to worker : fc92, count : 2, leases : [shardId-000000000000, "
                             "shardId-000000000001] ") == (
        "daemon_lease_taken", "info", {"count": 2, "leases": ["shardId-000000000000", "shardId-000000000001"]})
    assert scan(discoverer + "New leases assigned to worker : fc92, count : 0, leases : [] ") is None
    error = "2026-11-22 09:51:14,664 [Thread-1] ERROR s.a.k.multilang.MultiLangDaemon [NONE] - Encountered an error"
    assert scan(error) is None  # an error is a whole message's (daemon_messages), not one line's
    assert scan(prefix + "Writing ProcessRecordsMessage to child process for shard shardId-000000000002") is None


# The daemon's real output, captured: a MultiLangDaemon whose lease table's endpoint
# refuses (NOWHERE), two attempts at its lease coordinator, then its shutdown's error.
CAPTURED = ROOT / "tests" / "data" / "kcl-lease-coordinator-errors.log"


def test_the_daemons_messages_are_its_log_lines_with_their_stack_traces():
    from mldserver.ops.daemon_messages import Messages

    messages = Messages()
    lines = CAPTURED.read_text().splitlines()
    got = [m for line in lines for m in messages.feed(line)] + [messages.flush()]
    assert messages.flush() is None and not messages.pending
    assert sum(len(m.lines) for m in got) == len(lines)  # every line in exactly one message, in order
    assert [line for m in got for line in m.lines] == lines
    errors = [m for m in got if m.level == "error"]
    assert [m.first.split(" - ", 1)[1] for m in errors] == ["Caught exception when initializing LeaseCoordinator "] * 2 \
        + ["Encountered an error during shutdown. "]
    first = errors[0]
    assert len(first.lines) == 68 and first.lines[-1] == "\tat java.base/java.lang.Thread.run(Thread.java:840)"
    assert first.exception.startswith("java.lang.RuntimeException: software.amazon.awssdk.core.exception."
                                      "SdkClientException: Unable to execute HTTP request: Connection refused")
    assert first.caused_by == "java.net.ConnectException: Connection refused"
    assert errors[2].exception == "java.util.concurrent.TimeoutException: null" and errors[2].caused_by is None
    [warning] = [m for m in got if m.level == "warning"]
    assert warning.lines == (next(line for line in lines if " WARN " in line),) and warning.exception is None
    assert len(got) == sum(line.startswith("2026-11-27 ") for line in lines)  # one per line of logback's


def test_an_exception_the_jvm_prints_itself_is_a_message_of_its_own_at_error():
    """MultiLangDaemon without a stream name (real output): the exception follows an INFO line."""
    from mldserver.ops.daemon_messages import Messages

    messages = Messages()
    out = ["2026-11-27 21:44:15,266 [main] INFO  s.a.k.m.c.KinesisClientLibConfigurator [NONE] - Processing "
           "(key=executableName, value=/bin/true) ",
           "java.lang.NullPointerException: Stream name or Stream Arn is required. Stream Arn takes precedence if "
           "both are passed in.",
           "Stream name or Stream Arn is required. Stream Arn takes precedence if both are passed in.",
           "Usage: amazon-kinesis-client MultiLangDaemon [options]",
           "  Options:"]
    got = [m for line in out for m in messages.feed(line)] + [messages.flush()]
    assert [(m.level, len(m.lines)) for m in got] == [("info", 1), ("error", 4)]
    assert got[1].exception == out[1]


async def test_a_stack_trace_is_one_daemon_error_at_the_daemons_level_told_once_the_daemon_is_quiet(tmp_path, caplog):
    """The captured output through Daemon's own reader, from a process that writes it and
    then says nothing more: each message one event, the last one told by the quiet timer
    while the process still runs."""
    import asyncio
    import logging

    from mldserver.base.config import Settings
    from mldserver.ops.daemon import Daemon

    from .harness import eventually

    props = tmp_path / "app.properties"
    props.write_text(NOWHERE)
    daemon = Daemon(Settings(state_dir=str(tmp_path / "state")), props)
    daemon.dir.mkdir(parents=True)
    caplog.set_level(logging.DEBUG, logger="mldserver.daemon")
    daemon.proc = await asyncio.create_subprocess_exec(
        "sh", "-c", f'cat "{CAPTURED}"; exec sleep 60', stdout=asyncio.subprocess.PIPE)
    watching = asyncio.create_task(daemon._watch())

    def told():
        return [r for r in caplog.records if r.msg == "daemon_error"]

    try:
        errors = await eventually(lambda: len(told()) == 3 and told(), 10, what="three daemon_error events")
        assert daemon.proc.returncode is None  # the last one told by the quiet timer, not by the end of output
        assert [(r.levelname, r.fields["lines"]) for r in errors] == [("ERROR", 68), ("ERROR", 68), ("ERROR", 6)]
        first = errors[0].fields
        assert first["line"].endswith("ERROR s.a.kinesis.coordinator.Scheduler [NONE] - Caught exception when "
                                      "initializing LeaseCoordinator ")
        assert first["caused_by"] == "java.net.ConnectException: Connection refused"
        assert first["exception"].startswith("java.lang.RuntimeException: ")
        assert first["text"].startswith(first["line"] + "\n" + first["exception"] + "\n\tat ")
        assert errors[2].fields["exception"] == "java.util.concurrent.TimeoutException: null"
        assert daemon.last_error == "java.util.concurrent.TimeoutException: null"
        # The WARN line without an exception is not an error; the daemon's lines are all in its log.
        assert not [r for r in caplog.records if r.msg == "daemon_error" and r.levelname != "ERROR"]
    finally:
        daemon._stopping = True
        daemon.proc.kill()
        await watching
    assert (daemon.dir / "daemon.log").read_text() == CAPTURED.read_text()


def test_the_daemons_log_is_rolled_over_at_whole_lines_and_keeps_its_last_files(tmp_path):
    """daemon.log is written as the daemon's output comes (in reads that cut lines) and
    rolled over past its size at a line's end: every file holds whole lines, none is
    over the size, only the last files are kept, and together they are the end of the
    output byte for byte (its bytes that are not UTF-8 too, and a last line without its
    newline)."""
    from mldserver.ops.daemon import DaemonLog

    path = tmp_path / "daemon.log"
    output = b"".join(b"2026-11-26 17:00:00,%03d [LeaseRenewer] INFO renewed lease %06d \xff\n" % (i % 1000, i)
                      for i in range(2_000)) + b"the last words"
    log = DaemonLog(path, max_bytes=10_000, backups=2)
    for at in range(0, len(output), 777):
        log.write(output[at : at + 777])
    log.close()
    files = [tmp_path / "daemon.log.2", tmp_path / "daemon.log.1", path]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in files)
    kept = [p.read_bytes() for p in files]
    assert all(len(k) <= 10_000 for k in kept)
    assert all(k.endswith(b"\n") for k in kept[:-1]) and kept[-1].endswith(b"\nthe last words")
    together = b"".join(kept)
    assert output.endswith(together) and output[-len(together) - 1 : -len(together)] == b"\n"  # from a line's start
    assert len(together) > 20_000


def wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.05)
    return found


def test_a_sigkilled_run_takes_its_daemon_with_it_at_once(tmp_path):
    """An OOM kill of the server: the daemon (in its own session, so no signal to the
    group reaches it) is SIGKILLed by the kernel, not left to notice its relays' pipes."""
    props = tmp_path / "nowhere.properties"
    props.write_text(NOWHERE)
    with open(tmp_path / "server.stderr", "wb") as stderr:
        server = subprocess.Popen(
            [MLDSERVER, "run", "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir", str(tmp_path / "state"),
             "--log-file", str(tmp_path / "server.log"), "--admin", "127.0.0.1:0", "--properties", str(props)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"},
        )  # fmt: skip
    try:
        daemon = wait(lambda: next((e["pid"] for e in events(tmp_path) if e["event"] == "daemon_started"), None)
                      or server.poll(), 120, "daemon_started")
        assert server.poll() is None, (tmp_path / "server.stderr").read_text()
        # The JVM is up (its own log says so), not merely forked.
        wait(lambda: "LeaseCoordinator" in (tmp_path / "state" / "daemon" / "daemon.log").read_text(), 120,
             "the daemon running")
        pidfile = json.loads((tmp_path / "state" / "daemon" / "daemon.pid").read_text())
        assert pidfile["pid"] == daemon and pidfile["server_pid"] == server.pid
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        wait(lambda: started(daemon) is None, 20, f"the daemon (pid {daemon}) gone")
        print(f"daemon gone {time.monotonic() - killed:.2f} s after the server's SIGKILL")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if started(daemon) is not None:
            os.kill(daemon, signal.SIGKILL)


def test_a_daemon_left_by_an_earlier_run_is_stopped_before_listening_and_its_worker_id_kept(tmp_path):
    """A daemon the kernel did not tether (an earlier version's), its server gone: the
    next run of the state dir SIGKILLs it before it listens, and its daemon is the same
    worker as the earlier one."""
    props = tmp_path / "quick.properties"
    props.write_text(NO_STREAM)
    state = tmp_path / "state" / "daemon"
    state.mkdir(parents=True)
    (state / "worker-id").write_text("mldserver-earlier\n")
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        (state / "daemon.pid").write_text(json.dumps({"pid": leftover.pid, "started": started(leftover.pid),
                                                      "server_pid": int(gone.stdout), "server_started": 1}))
        done = run(tmp_path, "--properties", str(props))
        assert done.returncode == 1, done.stderr  # (this daemon has no stream: it exits at once)
        assert leftover.wait(5) == -signal.SIGKILL
        order = [e["event"] for e in events(tmp_path)]
        stopped = next(e for e in events(tmp_path) if e["event"] == "daemon_leftover_stopped")
        assert (stopped["pid"], stopped["gone"], stopped["level"]) == (leftover.pid, True, "warning")
        assert order.index("daemon_leftover_stopped") < order.index("listening")
        assert next(e for e in events(tmp_path) if e["event"] == "daemon_started")["worker_id"] == "mldserver-earlier"
        assert "\nworkerId = mldserver-earlier\n" in (state / "daemon.properties").read_text()
    finally:
        if leftover.poll() is None:
            leftover.kill()
        leftover.wait()


def test_a_worker_id_in_the_properties_file_is_the_users(tmp_path):
    props = tmp_path / "quick.properties"
    props.write_text(NO_STREAM + "workerId = theirs\n")
    done = run(tmp_path, "--properties", str(props))
    assert done.returncode == 1, done.stderr
    assert next(e for e in events(tmp_path) if e["event"] == "daemon_started")["worker_id"] == "theirs"
    assert (tmp_path / "state" / "daemon" / "daemon.properties").read_text().count("workerId") == 1
    assert not (tmp_path / "state" / "daemon" / "worker-id").exists()


async def test_a_lease_the_daemon_takes_holds_its_shards_windows_open_before_its_first_batch(tmp_path):
    """Two servers on a stream: shard 1's lease moves here while shard 0's rows have run
    ahead. From the daemon's own log line the shard holds the watermark, so the window it
    has rows for is not committed before they come (they would be late)."""
    import orjson

    from mldserver.rows.batch import Item, RowBatch
    from mldserver.base.config import Settings
    from mldserver.base.positions import Position
    from mldserver.coordinator import Coordinator
    from mldserver.ops.daemon import Daemon
    from mldserver.sinks.file import FileSink

    from .helpers import FakeClock

    def rows(shard, seq, t):
        return RowBatch.of([Item(t, Position(seq, 0, str(seq)), orjson.dumps({"shard": shard, "seq": seq}))])

    props = tmp_path / "app.properties"
    props.write_text(NOWHERE)
    settings = Settings(window=60.0, idle_timeout=600.0, state_dir=str(tmp_path / "state"), sink=f"file:{tmp_path / 'out'}")
    clock = FakeClock(1_000)
    coordinator = Coordinator(settings, FileSink(tmp_path / "out"), clock=clock)
    await coordinator.start()
    daemon = Daemon(settings, props)
    daemon.taken = coordinator.expect  # as start(server) sets it
    try:
        await coordinator.open_shard("shardId-000000000000", None)
        coordinator.add_batch("shardId-000000000000", rows(0, 1, 10_000), Position(1, 0, "1"), 100)
        daemon._scan("2026-11-27 18:50:40,585 [LeaseCoordinator-0002] INFO  s.a.k.l.d.DynamoDBLeaseDiscoverer [NONE] - "
                     "New leases assigned to worker : fc92, count : 1, leases : [shardId-000000000001] ")
        coordinator.add_batch("shardId-000000000000", rows(0, 2, 70_000), Position(2, 0, "2"), 100)
        assert await coordinator.step() == 0  # shard 1 holds [0, 60 s): its lease is here, its rows to come
        assert coordinator.status().watermarks["shardId-000000000001"] == float("-inf")
        await coordinator.open_shard("shardId-000000000001", None)
        coordinator.add_batch("shardId-000000000001", rows(1, 5, 20_000), Position(5, 0, "5"), 100)
        coordinator.add_batch("shardId-000000000001", rows(1, 6, 65_000), Position(6, 0, "6"), 100)
        assert await coordinator.step() == 1
        window = [orjson.loads(line) for line in (tmp_path / "out" / "0-60000.jsonl").read_text().splitlines()]
        assert window == [{"shard": 0, "seq": 1}, {"shard": 1, "seq": 5}]  # on time, in its own window
        assert coordinator.ordering.late_rows == 0
    finally:
        await coordinator.stop()
