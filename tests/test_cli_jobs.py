"""``mldserver demo`` and ``mldserver bench`` run end to end and report what they say."""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pyarrow.dataset as ds
import pytest

from .harness import MLDSERVER, bench

pytestmark = pytest.mark.spark  # the demo's pipeline and the bench's Spark part run in embedded Spark


def test_demo_processes_every_record_and_ends_the_split_parent(tmp_path):
    out = subprocess.run([MLDSERVER, "demo", "--records", "20000", "--shards", "3", "--dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=300)  # Spark may take a minute to start on a busy machine
    assert out.returncode == 0, out.stderr + out.stdout
    assert "records in          20,000 over 5 shards (one split into two)" in out.stdout
    assert "1 at SHARD_END" in out.stdout
    assert re.search(r"windows committed +[1-9]\d* .*20,000 rows in", out.stdout), out.stdout
    output = tmp_path / "d" / "output"
    commits = [json.loads(p.read_text()) for p in (output / "_commits").glob("*.json")]
    assert sum(c["rows"] for c in commits) == 20_000  # every record, in exactly one committed window
    per_customer = ds.dataset(output, format="parquet", partitioning="hive").to_table()
    assert sum(per_customer.column("orders").to_pylist()) == 20_000
    assert {f"window={c['window']}" for c in commits} == {p.name for p in output.glob("window=*")}
    # Every order in its own window: none late (the split's children held by their parent, not
    # overtaken by shards caught up at the wall clock), none clamped, and no window lumping
    # others' orders: 3 shards over 20 minutes, the parent's part over its first 13 1/3 and
    # its children's over the rest, is 875 orders a minute, then 1,250 (rounding aside).
    assert re.search(r"late rows +0$", out.stdout, re.M), out.stdout
    assert re.search(r"dead letters +0$", out.stdout, re.M), out.stdout
    # the stream goes quiet: its last window closes at the idle timeout, and the summary says so
    assert re.search(r"every order in at [\d.]+ s; the last window then waits for the 10 s idle_timeout",
                     out.stdout), out.stdout
    [stopped] = [json.loads(line) for line in (tmp_path / "d" / "server.log").read_text().splitlines()
                 if '"coordinator_stopped"' in line]
    assert (stopped["late"], stopped["clamped"]) == (0, 0), stopped
    assert max(c["rows"] for c in commits) <= 1_260, sorted(c["rows"] for c in commits)


def _demo(d, records: int, on_line) -> tuple[int, list[str], str, str]:
    """``mldserver demo`` over 2 shards into ``d``, ``on_line(demo, line, lines so far)``
    called on each console line as it comes; its exit status, lines, output and stderr."""
    demo = subprocess.Popen([MLDSERVER, "demo", "--records", str(records), "--shards", "2", "--dir", str(d),
                             "--admin", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    for line in demo.stdout:
        lines.append(line)
        on_line(demo, line, lines)
    code, stderr = demo.wait(timeout=300), demo.stderr.read()
    demo.stdout.close(), demo.stderr.close()
    return code, lines, "".join(lines), stderr


def test_a_ctrl_c_stops_the_demo_in_order_with_its_summary_and_no_traceback(tmp_path):
    """The first SIGINT (a Ctrl-C) stops the server as ``serve`` stops: one line saying
    so, the summary of what was done, nothing dead-lettered, no traceback, exit 130."""
    d = tmp_path / "d"

    def on_line(demo: subprocess.Popen, line: str, lines: list[str]) -> None:
        progress = re.match(r" +[\d.]+ s +records in +([\d,]+) ", line)
        if progress and progress[1] != "0" and not any(x.startswith("demo stopped") for x in lines):
            demo.send_signal(signal.SIGINT)  # records are flowing

    code, lines, out, stderr = _demo(d, 200_000, on_line)
    assert code == 130, out + stderr
    assert "Traceback" not in out + stderr and stderr == "", out + stderr
    [stopped] = [line for line in lines if line.startswith("demo stopped")]
    assert stopped == "demo stopped: interrupted (Ctrl-C); a second one stops it at once\n"
    summary = out[out.index("\nsummary\n"):]
    assert re.search(r"^  records in +[1-9][\d,]* over 2 shards$", summary, re.M), summary
    assert re.search(r"^  dead letters +0$", summary, re.M), summary
    assert not list((d / "state" / "dead-letters").glob("*.jsonl"))
    events = [json.loads(line)["event"] for line in (d / "server.log").read_text().splitlines()]
    assert "stopped" in events and "task_crashed" not in events


def test_a_sink_that_keeps_failing_stops_the_demo_with_one_line_naming_the_cause(tmp_path):
    """A real fault: once the server listens (its Spark process has cleared the sink's
    staging folder), a file takes the folder's name, so Spark cannot write any window.
    The console gets the demo's lines only: one naming the error and the log to read,
    then the summary; no traceback from either side, exit status 1."""
    d = tmp_path / "d"

    def on_line(demo: subprocess.Popen, line: str, lines: list[str]) -> None:
        if line.startswith("server listening on "):  # before any record is sent
            (d / "output" / "_staging").write_text("not a folder\n")

    code, lines, out, stderr = _demo(d, 6000, on_line)
    assert code == 1, out + stderr
    assert "Traceback" not in out + stderr and stderr == "", out + stderr
    [stopped] = [line for line in lines if line.startswith("demo stopped")]
    assert re.fullmatch(r"demo stopped: the sink cannot commit window \d+-\d+ \(\d+ attempts\): SparkError: .* <- "
                        r"org\.apache\.hadoop\.fs\.ParentNotDirectoryException: Parent path is not a directory: "
                        rf"file:{re.escape(str(d.resolve() / 'output' / '_staging'))}; see {re.escape(str(d / 'server.log'))} "
                        r"\(sink_commit_failed\)\n", stopped), stopped
    failed = [json.loads(line) for line in (d / "server.log").read_text().splitlines() if '"sink_commit_failed"' in line]
    assert failed and "ParentNotDirectoryException" in failed[0]["error"]  # the line says what the log says
    summary = out[out.index("\nsummary\n"):]
    assert re.search(r"^  windows committed +0 ", summary, re.M), summary
    assert re.search(r"^  late rows +0$", summary, re.M), summary
    letters = re.search(r"^  dead letters +([\d,]+)(.*)$", summary, re.M)
    assert letters, summary
    # Whatever the stop left uncommitted: kept with its data, and the summary says where.
    kept = sum(p.read_text().count("\n") for p in (d / "state" / "dead-letters").glob("*.jsonl"))
    assert int(letters[1].replace(",", "")) == kept
    assert kept == 0 or f"under {d / 'state' / 'dead-letters'}" in letters[2]


def test_bench_prints_every_variant_side_by_side(tmp_path):
    out = subprocess.run([MLDSERVER, "bench", "--quick", "--load", "1000x100", "--shards", "1", "2"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    for variant in ("amazon_kclpy", "mldserver w2", "direct w2", "mldserver w0", "direct w0", "ceiling"):
        assert re.search(rf"^\s+{variant}\s+\d+\s+[\d,]+", out.stdout, re.M), (variant, out.stdout)
    for workers in (2, 0):  # the handler processes and the server's own loop, side by side
        assert re.search(rf"--workers {workers}, K=2: relay cost [-+][\d.]+% .*; memory per shard", out.stdout)
    assert re.search(r"relay start-up: \d+ ms", out.stdout)
    for workers in (2, 0):  # each server against amazon_kclpy round by round (one round with --quick; CPU
        # a record is left out where a run this short used less than a clock tick of it)
        assert re.search(rf"^  over 1 round taking turns, mldserver w{workers} against amazon_kclpy: records/s "
                         r"[\d.]+x \(median [\d.]+x\)(; CPU a record [\d.]+x \(median [\d.]+x\))?$", out.stdout,
                         re.M), out.stdout
    # under each server's rows, its CPU a record by process (the part that bounds records/s)
    for variant, handlers in (("mldserver w2", True), ("direct w2", True), ("mldserver w0", False)):
        parts = r"server [\d.]+ us \(\d+% of a core\)" + (r", handler processes [\d.]+ us" if handlers else "")
        relays = r", relays [\d.]+ us" if variant.startswith("mldserver") else ""
        assert re.search(rf"^    {variant}: CPU a record: {parts}{relays}; the fake daemon [\d.]+ us$", out.stdout,
                         re.M), (variant, out.stdout)
    # the kclpy part: amazon_kclpy's sample behind mldserver beside KCLProcess (test_bench_kclpy.py)
    assert re.search(r"--workers 2, K=2: [\d.]+x amazon_kclpy's records/s", out.stdout), out.stdout
    for workers in (2, 0):  # the changes part: a ChangeHandler beside the batch Handler decoding by hand
        assert re.search(rf"^\s+{workers}\s+1 by hand\s+[\d,]+\s+[\d.]+$", out.stdout, re.M), out.stdout
        assert re.search(rf"^\s+{workers}\s+1 ChangeHandler\s+[\d,]+\s+[\d.]+x\s+[\d.]+\s+[\d.]+x$", out.stdout,
                         re.M), out.stdout
    # the timers part: created (await each, gathered, direct), fired per second, memory with many pending
    for workers in (2, 0):
        assert re.search(rf"^\s+{workers}\s+[\d,]+\s+[\d,]+\s+([\d,]+|-)$", out.stdout, re.M), out.stdout
        assert re.search(rf"^\s+{workers}\s+[\d,]+/s\s+[\d.]+ MiB$", out.stdout, re.M), out.stdout
    assert re.search(r"memory, idle: [\d,]+ pending [\d.]+ MiB PSS against [\d.]+ MiB with none", out.stdout)
    # the coordinator part: under its rows, the floor beside what the file sink adds a row (one figure a row)
    assert re.search(r"floor: a row encoded and written \(orjson a batch at a time, one file, one loop\) [\d.]+ us "
                     r"of CPU, against the file sink's [-+][\d.]+, [-+][\d.]+, [-+][\d.]+, [-+][\d.]+ us a row",
                     out.stdout), out.stdout
    # the Spark part: end to end and the bare handoff side by side, latency and loop lag
    assert re.search(r"^\s+[\d,]+\s+[\d,]+\s+\d+%\s+[\d,]+ / [\d,]+ ms\s+[\d.]+ ms$", out.stdout, re.M), out.stdout
    assert re.search(r"one window closing at a time \(each fed once the one before it committed\): close->commit "
                     r"[\d,]+ / [\d,]+ ms; windows \d+-\d+ \(Spark's JVM warmer\): [\d,]+ / [\d,]+ ms",
                     out.stdout), out.stdout
    assert re.search(r"floor, one [\d,]+-row window at a time on this machine: [\d,]+ ms \(its file [\d,]+ \+ "
                     r"Spark's job [\d,]+; its rows into Arrow, [\d,]+ ms, are parsed as they arrive\)",
                     out.stdout), out.stdout
    # the table part: the iceberg sink beside the parquet sink, 1 and 2 servers; a position read back
    for servers in (1, 2):
        assert re.search(rf"^\s+{servers}\s+[\d,]+\s+[\d,]+\s+\d+%$", out.stdout, re.M), out.stdout
    assert re.search(r"^\s+200\s+\d+s\s+[\d.]+ms\s+[\d.]+ms\s+\d+KiB\s+\d+$", out.stdout, re.M), out.stdout


@pytest.mark.realdaemon
def test_bench_source_prints_the_server_reading_beside_the_daemon(tmp_path):
    # kinesis-local and DynamoDB Local (scripts/setup --test), the real KCL daemon for the
    # second row: a few minutes
    out = bench("--part", "source", "--quick", timeout=900)
    for path in ("serve --source kinesis:", r"KCL daemon \+ relay \(run\)"):
        assert re.search(rf"^\s+{path}\s+([\d,]+|nan)\s+([\d.]+|nan)\s", out, re.M), (path, out)
    assert re.search(r"^\s+serve --source kinesis:.*\s\d+ / \d+ ms$", out, re.M), out
    assert "--source against the daemon:" in out
    # the floor, on every record of the stream (2,000 with --quick)
    assert re.search(r"^\s+floor \(orjson, base64\)\s+[\d.]+\s+\(2,000 records: ", out, re.M), out
