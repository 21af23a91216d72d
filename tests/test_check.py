"""``mldserver check``: the settings, the handler, the pipeline and the state directory
as ``serve`` would find them at start-up; exit 0 when clean, 2 with serve's own
one-line message when not."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from mldserver.ops import check
from mldserver.base.config import load
from mldserver.errors import ConfigError
from mldserver.ops.tether import started

from .harness import MLDSERVER, ROOT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)


def config(tmp_path, text: str = "") -> str:
    path = tmp_path / "mld.toml"
    path.write_text(f'handler = "tests.handlers:Noop"\nstate_dir = "{tmp_path / "state"}"\n{text}')
    return str(path)


def test_a_clean_config_prints_what_it_found_and_exits_0(tmp_path):
    done = run("check", "--config", config(tmp_path, f"window = 5\nport = 7171\nsink = 'file:{tmp_path / 'out'}'\n"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"config      {tmp_path / 'mld.toml'} (") and "window=5.0" in lines[0]
    assert lines[1:3] == [
        "handler     tests.handlers:Noop (class; its callbacks and constructor checked)",
        f"state_dir   {tmp_path / 'state'} (writable)",
    ]
    assert lines[3] == "listen      127.0.0.1:7171" and lines[4].startswith(f"sink        file:{tmp_path / 'out'}")
    assert lines[-1] == "ok"
    assert (tmp_path / "state").is_dir() and not list((tmp_path / "state").iterdir())
    assert done.stderr == ""


@pytest.mark.parametrize("text", ["window = 0\n", 'log_level = "verbose"\n', "port = -1\n", "nope = 1\n"])
def test_a_settings_mistake_is_the_line_serve_stops_on_and_exit_2(tmp_path, text):
    path = config(tmp_path, text)
    checked, served = run("check", "--config", path), run("serve", "--config", path)
    assert checked.returncode == served.returncode == 2
    assert checked.stderr == served.stderr and len(checked.stderr.splitlines()) == 1, checked.stderr
    assert checked.stderr.startswith(f"mldserver: {path}: ")


def test_the_handler_flag_is_imported_as_serve_would_and_named_when_it_fails(tmp_path):
    done = run("check", "--config", config(tmp_path), "--handler", "tests.handlers:Nope")
    assert done.returncode == 2
    assert done.stderr == 'mldserver: Attribute "Nope" not found in module "tests.handlers" (handler).\n'
    assert "config" in done.stdout and "handler" not in done.stdout.split("\n", 1)[1]


def test_a_pipeline_that_cannot_be_imported_is_named_as_serve_names_it(tmp_path):
    done = run("check", "--config", config(tmp_path), "--pipeline", "tests.nosuch:pipeline")
    assert done.returncode == 2
    assert done.stderr.startswith('mldserver: Could not import module "tests.nosuch" (pipeline tests.nosuch:pipeline)')
    # serve finds it in its Spark process, and stops on the importer's own line
    served = run("serve", "--config", config(tmp_path), "--pipeline", "tests.nosuch:pipeline", "--port", "0",
                 "--admin", "off")
    assert (served.returncode, served.stderr) == (2, done.stderr)


def test_a_state_dir_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "state").write_text("not a directory\n")
    done = run("check", "--config", config(tmp_path))
    assert done.returncode == 2
    assert done.stderr == (f"mldserver: --state-dir {tmp_path / 'state'}: exists and is not a directory: "
                           "remove it or choose another --state-dir\n")


def test_a_sink_that_cannot_be_written_is_named_by_check_and_refused_by_serve(tmp_path):
    (tmp_path / "out").write_text("not a directory\n")
    conf = config(tmp_path, f'sink = "file:{tmp_path / "out"}"\n')
    said = (f"mldserver: --sink file:{tmp_path / 'out'}: exists and is not a directory: remove it or choose "
            f"another --sink directory\n")
    done = run("check", "--config", conf)
    assert (done.returncode, done.stderr) == (2, said)
    served = run("serve", "--config", conf, "--handler", "tests.handlers:Noop", "--port", "0", "--admin", "off")
    assert (served.returncode, served.stderr) == (2, said)


def test_a_pipeline_and_a_unix_socket_are_reported(tmp_path):
    settings = load(config(tmp_path), pipeline="tests.handlers:Noop", unix=str(tmp_path / "mld.sock"))
    out = io.StringIO()
    check.run(check.Given(settings, "mld.toml"), out)
    found = dict(line.split(None, 1) for line in out.getvalue().splitlines()[:-1])
    assert found["pipeline"] == "tests.handlers:Noop (class)"
    assert found["listen"] == f"unix:{tmp_path / 'mld.sock'}"
    assert found["sink"] == f"parquet:{tmp_path / 'state' / 'output'} (writable)"
    assert not (tmp_path / "mld.sock").exists()  # check never binds


def test_a_mistake_stops_the_checks_at_the_first_one_that_fails(tmp_path):
    settings = load(config(tmp_path), handler="tests.nosuch:H")
    out = io.StringIO()
    with pytest.raises(ConfigError, match='Could not import module "tests.nosuch"'):
        check.run(check.Given(settings, None), out)
    assert out.getvalue().startswith("config      (no file) (") and "ok" not in out.getvalue()


def test_a_log_file_serve_could_not_open_is_named(tmp_path):
    path = tmp_path / "missing" / "server.log"
    done = run("check", "--config", config(tmp_path, f'log_file = "{path}"\n'))
    assert done.returncode == 2
    assert done.stderr.startswith(f"mldserver: --log-file {path}: cannot open it for appending")


def test_an_admin_token_file_is_read_as_serve_reads_it_and_never_printed(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    done = run("check", "--config", config(tmp_path, f'admin_token_file = "{path}"\n'))
    assert done.returncode == 0, done.stderr
    assert f"admin_token {path} (readable; POST /pause, /resume, /reload need it)" in done.stdout.splitlines()
    assert "0123456789abcdef" not in done.stdout
    path.write_text("")
    checked = run("check", "--config", config(tmp_path, f'admin_token_file = "{path}"\n'))
    assert checked.returncode == 2
    assert checked.stderr.startswith(f"mldserver: --admin-token-file {path}: the file is empty: write the token")


# -- check takes what serve and run take, and checks it as run will use it ---------------------------------------

def test_check_takes_every_flag_serve_and_run_take():
    from mldserver.cli import _parser

    subs = next(a for a in _parser()._actions if a.dest == "command").choices
    flags = {name: {s for a in subs[name]._actions for s in a.option_strings} for name in ("serve", "run", "check")}
    assert flags["serve"] | flags["run"] <= flags["check"]
    assert flags["check"] - (flags["serve"] | flags["run"]) == {"--for"}


def test_a_sink_flag_is_checked_as_serve_would(tmp_path):
    (tmp_path / "out").write_text("not a directory\n")
    done = run("check", "--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"),
               "--sink", f"file:{tmp_path / 'out'}", "--port", "7070")
    assert (done.returncode, done.stderr) == (2, f"mldserver: --sink file:{tmp_path / 'out'}: exists and is not a "
                                                 f"directory: remove it or choose another --sink directory\n")
    (tmp_path / "out").unlink()
    done = run("check", "--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"),
               "--sink", f"file:{tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr
    assert f"sink        file:{tmp_path / 'out'} (writable)" in done.stdout.splitlines()


SAMPLE_HANDLER = "samples.sample_kclpy_app:RecordProcessor"


def sample_properties(tmp_path, extra: str = "", drop: tuple[str, ...] = ()) -> str:
    """amazon_kclpy's own sample.properties (as kclpy-ext installs it), its endpoints on
    loopback where nothing listens (a daemon that reaches nothing), ``drop``'s keys left out."""
    import samples

    text = (Path(samples.__file__).parent / "sample.properties").read_text()
    kept = [line for line in text.splitlines() if not line.split("=")[0].strip() in drop]
    path = tmp_path / "sample.properties"
    path.write_text("\n".join(kept) + "\nkinesisEndpoint = http://127.0.0.1:9\ndynamoDBEndpoint = http://127.0.0.1:9\n"
                    "metricsLevel = NONE\n" + extra)
    return str(path)


def started_or_refused(tmp_path, args: list[str]) -> tuple[str, str | list[str]]:
    """``mldserver run ARGS``: ("refused", its stderr) when it exits 2 before the daemon
    starts, else ("started", what it logged of the properties as check's lines). Once the
    daemon is started the server is SIGKILLed: the kernel takes its daemon with it."""
    log = tmp_path / "server.log"
    with open(tmp_path / "run.stderr", "wb") as stderr:
        proc = subprocess.Popen([MLDSERVER, "run", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "x",
                                     "AWS_SECRET_ACCESS_KEY": "x"})
    try:
        deadline = time.monotonic() + 120
        while True:
            events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            daemon = next((e for e in events if e["event"] == "daemon_started"), None)
            if daemon is not None:
                break
            if proc.poll() is not None:
                assert proc.returncode == 2, (tmp_path / "run.stderr").read_text()
                return "refused", (tmp_path / "run.stderr").read_text()
            assert time.monotonic() < deadline, "run neither started its daemon nor exited in 120 s"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    while started(daemon["pid"]) is not None:  # tethered: killed by the kernel with the server
        assert time.monotonic() < deadline + 20, f"the daemon (pid {daemon['pid']}) outlived its server"
        time.sleep(0.05)
    return "started", sorted(
        f"{e['level']:<8} {e['path']}{'' if e['line'] is None else ':' + str(e['line'])} {e['key']}: {e['message']}"
        for e in events if e["event"] in ("properties_error", "properties_warning"))


RUN_CASES = {
    # amazon_kclpy's sample, as its users give it to run (executableName = sample_kclpy_app.py)
    "kclpy-sample": lambda t: ["--properties", sample_properties(t), "--handler", SAMPLE_HANDLER],
    "kclpy-sample-fixed-file-sink": lambda t: [
        "--properties", sample_properties(t, "shutdownGraceMillis = 10000\ncallProcessRecordsEvenForEmptyRecordList"
                                             " = true\n"),
        "--handler", SAMPLE_HANDLER, "--sink", f"file:{t / 'out'}", "--window", "10"],
    "iceberg-stream-from-properties": lambda t: [
        "--properties", sample_properties(t, "shutdownGraceMillis = 10000\ncallProcessRecordsEvenForEmptyRecordList"
                                             " = true\n"),
        "--handler", "tests.handlers:Noop", "--sink", f"iceberg:{t / 'lake'}"],
    "iceberg-no-stream": lambda t: [
        "--properties", sample_properties(t, drop=("streamName", "streamArn")), "--handler", "tests.handlers:Noop",
        "--sink", f"iceberg:{t / 'lake'}"],
    "iceberg-stream-flag": lambda t: [
        "--properties", sample_properties(t, drop=("streamName", "streamArn")), "--handler", "tests.handlers:Noop",
        "--sink", f"iceberg:{t / 'lake'}", "--stream", "orders"],
    "handler-not-found": lambda t: ["--properties", sample_properties(t), "--handler", "samples.sample_kclpy_app:Nope"],
    "no-handler": lambda t: ["--properties", sample_properties(t)],
    "pipeline-not-found": lambda t: ["--properties", sample_properties(t), "--handler", "tests.handlers:Noop",
                                     "--pipeline", "tests.nosuch:pipeline"],
    "reset-without-source": lambda t: ["--properties", sample_properties(t), "--handler", SAMPLE_HANDLER,
                                       "--reset-positions"],
    "no-properties-file": lambda t: ["--properties", str(t / "nope.properties"), "--handler", SAMPLE_HANDLER],
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_check_for_run_passes_exactly_when_run_starts_with_the_same_line_when_not(tmp_path, case):
    """``mldserver check ARGS --for run && mldserver run ARGS``: check, then run itself,
    on the same arguments and directories, as a user runs them. Exit 2 from check when
    run refuses to start, with run's own line; else check's findings in the properties
    are what run logs of them (properties_error, properties_warning), exit 1 when one is
    an error (run starts anyway)."""
    args = RUN_CASES[case](tmp_path) + ["--state-dir", str(tmp_path / "state"), "--log-file",
                                        str(tmp_path / "server.log"), "--port", "0", "--admin", "127.0.0.1:0"]
    checked = run("check", *args, "--for", "run")
    verdict, said = started_or_refused(tmp_path, args)

    if verdict == "refused":
        assert (checked.returncode, checked.stderr) == (2, said) and said.count("\n") == 1, checked.stdout
        return
    assert checked.returncode in (0, 1), checked.stderr
    findings = sorted(line for line in checked.stdout.splitlines() if line.startswith(("error ", "warning ")))
    assert findings == said
    assert checked.returncode == any(line.startswith("error ") for line in said)
    assert (checked.returncode == 0) == (checked.stdout.splitlines()[-1] == "ok")


def test_the_table_sink_without_a_stream_names_the_flag_and_the_setting(tmp_path):
    args = RUN_CASES["iceberg-no-stream"](tmp_path) + ["--state-dir", str(tmp_path / "state")]
    done = run("check", *args, "--for", "run")
    assert done.returncode == 2
    assert "give --stream STREAM (stream = \"...\" in --config; under mldserver run, the properties file's " \
           "streamName or streamArn)" in done.stderr
    served = run("serve", "--handler", "tests.handlers:Noop", "--sink", f"iceberg:{tmp_path / 'lake'}",
                 "--state-dir", str(tmp_path / "state"))
    assert served.returncode == 2 and served.stderr == done.stderr


def test_for_serve_the_properties_are_the_daemons_own_and_say_when_run_is_meant(tmp_path):
    """The default, --for serve: the daemon runs on the file as written, so its
    executableName must be the relay to this server; serve takes no stream from it."""
    props = sample_properties(tmp_path, "shutdownGraceMillis = 10000\n")
    done = run("check", "--properties", props, "--handler", SAMPLE_HANDLER, "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1
    (finding,) = [line for line in done.stdout.splitlines() if line.startswith("error ")]
    assert finding.startswith(f"error    {props}:4 executableName: 'sample_kclpy_app.py' is not the relay")
    assert finding.endswith("(or, when mldserver run starts the daemon, check with --for run: run sets "
                            "executableName itself)")
    assert "stream=" not in done.stdout.splitlines()[0]
    ran = run("check", "--properties", props, "--handler", SAMPLE_HANDLER, "--state-dir", str(tmp_path / "state"),
              "--for", "run")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "stream='arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample'" in ran.stdout.splitlines()[0]
    assert any(line.startswith("daemon      ") for line in ran.stdout.splitlines())


def test_for_run_needs_the_properties_file_run_needs(tmp_path):
    done = run("check", "--handler", SAMPLE_HANDLER, "--for", "run")
    assert (done.returncode, done.stderr) == (2, "mldserver: check --for run: run needs --properties FILE (the "
                                                 "daemon's properties file): give the one you give run\n")


@pytest.mark.parametrize("flags", [["--from", "latest"], ["--source", "kinesis:orders", "--source", "kinesis:orders"],
                                   ["--reset-positions"]])
def test_the_source_flags_are_parsed_as_serve_parses_them(tmp_path, flags):
    args = ["--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"), *flags]
    checked, served = run("check", *args), run("serve", *args, "--port", "0", "--admin", "off")
    assert checked.returncode == served.returncode == 2
    assert checked.stderr == served.stderr and checked.stderr.count("\n") == 1, checked.stderr


def test_a_source_is_listed_and_reset_positions_deletes_nothing(tmp_path):
    from mldserver.sources.positions import positions_path

    saved = positions_path(tmp_path / "state", "kinesis:orders")  # what serve --reset-positions deletes
    saved.parent.mkdir(parents=True)
    saved.write_text("{}\n")
    done = run("check", "--handler", "tests.handlers:Noop", "--state-dir", str(tmp_path / "state"), "--source",
               "kinesis:orders", "--from", "latest", "--reset-positions")
    assert done.returncode == 0, done.stderr
    assert "source      kinesis:orders (from latest; their saved positions deleted at start)" in done.stdout
    assert saved.read_text() == "{}\n"


def test_for_run_says_what_run_would_warn_of_the_daemon(tmp_path):
    done = subprocess.run(
        [MLDSERVER, "check", "--for", "run", "--properties", str(ROOT / "deploy" / "mld.properties"), "--handler",
         "tests.handlers:Noop", "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MLDSERVER_JAXB_JAR": str(tmp_path / "no-jaxb.jar")})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("daemon ")]
    assert "the KCL jars in " in line and "; warning: without the JAXB API jar one malformed KPL aggregate" in line


def _pidfile(state, daemon, server=None) -> None:
    """``state``'s daemon.pid as a ``run`` writes it: ``daemon`` its daemon, ``server``
    the run (None: one that is gone)."""
    path = state / "daemon" / "daemon.pid"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": daemon.pid, "started": started(daemon.pid),
                                "server_pid": server.pid if server else 0,
                                "server_started": started(server.pid) if server else None}) + "\n")


def test_check_for_run_refuses_a_state_dir_a_live_run_uses_with_runs_line(tmp_path, sleepers):
    daemon, server = sleepers(), sleepers()
    _pidfile(tmp_path / "state", daemon, server)
    args = ["--properties", sample_properties(tmp_path), "--handler", SAMPLE_HANDLER, "--state-dir",
            str(tmp_path / "state"), "--log-file", str(tmp_path / "server.log"), "--port", "0", "--admin", "off"]
    checked = run("check", *args, "--for", "run")
    verdict, said = started_or_refused(tmp_path, args)
    assert verdict == "refused" and f"mldserver run (pid {server.pid}) still uses it" in said
    assert (checked.returncode, checked.stderr) == (2, said)
    assert daemon.poll() is None and server.poll() is None  # neither stops anything


def test_check_for_run_names_a_daemon_an_earlier_run_left_and_stops_nothing(tmp_path, sleepers):
    leftover = sleepers()
    _pidfile(tmp_path / "state", leftover)
    checked = run("check", "--properties", sample_properties(tmp_path), "--handler", SAMPLE_HANDLER,
                  "--state-dir", str(tmp_path / "state"), "--for", "run")
    assert checked.returncode in (0, 1), checked.stderr
    [line] = [line for line in checked.stdout.splitlines() if line.startswith("daemon ")]
    assert f"a daemon an earlier run of this state dir left runs (pid {leftover.pid}): run stops it" in line
    assert leftover.poll() is None
