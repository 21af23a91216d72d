"""The daemon's properties file: read as Java reads it, checked against the KCL 3.x
key set (``mldserver.ops.kcl_keys``, generated from the jars) and what the server needs;
``mldserver check --properties`` prints each finding with its line, exit 1 on an error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mldserver.ops import kcl_keys
from mldserver.ops import properties
from mldserver.base.config import load

from .harness import BIN, MLDSERVER, ROOT

GOOD = """\
executableName = mldserver connect 127.0.0.1:7070
streamName = orders
applicationName = orders-mldserver
AWSCredentialsProvider = DefaultCredentialsProvider
regionName = us-east-1
initialPositionInStream = TRIM_HORIZON
shutdownGraceMillis = 30000
callProcessRecordsEvenForEmptyRecordList = true
"""


@pytest.fixture(autouse=True)
def relay_on_path(monkeypatch):
    """``mldserver`` on PATH, as where the daemon runs (executableName names it bare)."""
    monkeypatch.setenv("PATH", f"{BIN}:{os.environ.get('PATH', '')}")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    return subprocess.run([MLDSERVER, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def config(tmp_path, text: str = "") -> str:
    path = tmp_path / "mld.toml"
    path.write_text(f'handler = "tests.handlers:Noop"\nstate_dir = "{tmp_path / "state"}"\n{text}')
    return str(path)


def findings(tmp_path, text: str, **settings) -> list[properties.Finding]:
    path = tmp_path / "f.properties"
    path.write_text(text)
    return properties.check(properties.read(path), load(**settings))


def test_a_misspelt_key_a_short_timeout_and_no_grace_are_named_with_their_lines_and_exit_1(tmp_path):
    path = tmp_path / "bad.properties"
    path.write_text(GOOD.replace("initialPositionInStream", "initialPositonInStream")
                    .replace("shutdownGraceMillis = 30000\n", "") + "timeoutInSeconds = 5\n")
    done = run("check", "--config", config(tmp_path), "--properties", str(path))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert f"error    {path} shutdownGraceMillis: missing (default 0): on SIGTERM no shard gets shutdownRequested" \
        in done.stdout
    (misspelt,) = [line for line in lines if "initialPositonInStream" in line]
    assert misspelt.startswith(f"error    {path}:6 initialPositonInStream: not a key the KCL")
    assert misspelt.endswith("did you mean initialPositionInStream?")
    (timeout,) = [line for line in lines if "timeoutInSeconds" in line]
    assert timeout.startswith(f"error    {path}:8 timeoutInSeconds: 5 s is shorter than one handler call")
    assert "set it to at least 191" in timeout
    assert lines[-1] == "3 errors, 0 warnings"


def test_the_deploy_template_is_clean_with_and_without_windows(tmp_path):
    template = str(ROOT / "deploy" / "mld.properties")
    for text in ("", f'sink = "file:{tmp_path / "out"}"\n'):
        done = run("check", "--config", config(tmp_path, text), "--properties", template)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-2:] == [f"properties  {template} (12 keys, KCL {kcl_keys.KCL_VERSION})",
                                                "ok"]


def test_the_deploy_template_passes_from_a_venv_that_is_not_activated(tmp_path):
    """The relay resolved as the daemon would: mldserver run gives it this installation's
    relay; a daemon started otherwise is told the absolute command that works."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    template = str(ROOT / "deploy" / "mld.properties")
    done = subprocess.run([MLDSERVER, "check", "--config", config(tmp_path), "--properties", template], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    (warning,) = [line for line in done.stdout.splitlines() if line.startswith("warning")]
    assert warning.endswith(f"or use executableName = {BIN / 'mldserver'} connect 127.0.0.1:7070"), warning
    assert done.stdout.splitlines()[-1] == "ok"


def test_a_properties_file_that_is_missing_or_does_not_parse_is_one_line_and_exit_2(tmp_path):
    done = run("check", "--properties", str(tmp_path / "nope.properties"))
    assert done.returncode == 2
    assert done.stderr == (f"mldserver: --properties {tmp_path / 'nope.properties'}: no such file: give the "
                           f"daemon's properties file (deploy/mld.properties is a template)\n")
    bad = tmp_path / "bad.properties"
    bad.write_text("# fine\nstreamName = a\\u00zz\n")
    done = run("check", "--properties", str(bad))
    assert done.returncode == 2
    assert done.stderr.startswith(f"mldserver: --properties {bad}:2: does not parse (malformed \\uxxxx escape")


def test_check_needs_something_to_check():
    done = run("check")
    assert done.returncode == 2 and "nothing to check" in done.stderr
    assert run("check", "--handler", "tests.handlers:Noop").returncode == 0  # the handler alone is something


def test_read_follows_java_properties_syntax(tmp_path):
    path = tmp_path / "p.properties"
    path.write_text("# comment\n  ! also a comment\n\nstreamName=orders\napplicationName : app\n"
                    "regionName   us-east-1\nexecutableName = mldserver \\\n    connect 127.0.0.1:7070\n"
                    "a\\=b = \\u0041\\t\nempty\n")
    props = properties.read(path)
    assert [(e.key, e.value, e.line, e.last_line) for e in props.entries] == [
        ("streamName", "orders", 4, 4),
        ("applicationName", "app", 5, 5),
        ("regionName", "us-east-1", 6, 6),
        ("executableName", "mldserver connect 127.0.0.1:7070", 7, 8),
        ("a=b", "A\t", 9, 9),
        ("empty", "", 10, 10),
    ]


def test_a_case_slip_suggests_the_key_and_credentials_keys_are_known_in_any_case(tmp_path):
    found = findings(tmp_path, GOOD + "STREAMNAME = x\nawscredentialsproviderDynamoDB = Default\n")
    assert [(f.key, f.message.rsplit(": ", 1)[-1]) for f in found] == [("STREAMNAME", "did you mean streamName?")]
    assert properties.known("kinesisClient.endpointOverride") and properties.known("fanoutConfig.consumerArn")
    assert not properties.known("fanoutConfig.consumerArm")


def test_an_executable_that_does_not_reach_this_server_is_an_error(tmp_path):
    (found,) = findings(tmp_path, GOOD, port=7171)
    assert (found.key, found.line) == ("executableName", 1)
    assert "the relay reaches 127.0.0.1:7070 but this server listens on 127.0.0.1:7171" in found.message
    (found,) = findings(tmp_path, GOOD.replace("mldserver connect", "python3 relay.py"))
    assert "is not the relay" in found.message
    (found,) = findings(tmp_path, GOOD.replace("mldserver connect", "/nowhere/mldserver connect"))
    assert "is not a program the daemon can start" in found.message
    assert findings(tmp_path, GOOD.replace("127.0.0.1:7070", "unix:/run/m.sock"), unix="/run/m.sock") == []


def test_windows_need_empty_record_lists_and_grace_must_not_be_0(tmp_path):
    text = GOOD.replace("callProcessRecordsEvenForEmptyRecordList = true", "callProcessRecordsEvenForEmptyRecordList"
                        " = false").replace("shutdownGraceMillis = 30000", "shutdownGraceMillis = 0")
    assert [(f.key, f.line) for f in findings(tmp_path, text, sink=f"file:{tmp_path}")] == [
        ("shutdownGraceMillis", 7), ("callProcessRecordsEvenForEmptyRecordList", 8)]
    assert [f.key for f in findings(tmp_path, text)] == ["shutdownGraceMillis"]  # no windows: empty lists optional


def test_a_long_enough_timeout_is_accepted(tmp_path):
    assert findings(tmp_path, GOOD + "timeoutInSeconds = 191\n") == []
    (found,) = findings(tmp_path, GOOD + "timeoutInSeconds = 15\n", execution_timeout=3.0, handler_retries=1)
    assert "set it to at least 17" in found.message


def test_the_committed_key_list_is_what_the_jars_give():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "kcl-property-keys"), "--print"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == (ROOT / "mldserver" / "ops" / "kcl_keys.py").read_text()


def test_run_takes_the_stream_its_daemon_reads_where_the_settings_leave_it_unset(tmp_path):
    from mldserver.base.config import load
    from mldserver.ops.properties import stream_settings

    path = tmp_path / "app.properties"
    path.write_text("streamName = orders\nregionName = eu-west-1\nkinesisEndpoint = http://127.0.0.1:4567\n"
                    "executableName = mldserver connect 127.0.0.1:7070\n")
    s = load(defaults=stream_settings(path))
    assert (s.stream, s.aws_region, s.aws_endpoint_url) == ("orders", "eu-west-1", "http://127.0.0.1:4567")
    config = tmp_path / "mldserver.toml"
    config.write_text('stream = "arn:aws:kinesis:us-east-1:1:stream/clicks"\naws_region = "us-east-1"\n')
    s = load(str(config), defaults=stream_settings(path))
    assert (s.stream, s.aws_region) == ("arn:aws:kinesis:us-east-1:1:stream/clicks", "us-east-1")  # the server's own
    assert load(str(config), defaults=stream_settings(path), aws_region="us-west-2").aws_region == "us-west-2"
    path.write_text("streamArn = arn:aws:kinesis:us-east-1:1:stream/orders\n")
    assert load(defaults=stream_settings(path)).stream == "arn:aws:kinesis:us-east-1:1:stream/orders"


def test_run_and_check_with_the_table_sink_take_its_stream_from_the_properties_not_only_the_config(tmp_path):
    """The table sink keys positions by stream: under run it is the daemon's, so neither
    run nor check --for run asks for ``stream`` again (both once refused, exit 2, before
    the server read the properties). serve reads no properties: it (and check, for serve)
    asks for --stream."""
    path = tmp_path / "app.properties"
    path.write_text("streamName = orders\napplicationName = orders-app\nregionName = us-east-1\n"
                    "executableName = mldserver connect 127.0.0.1:7070\n")
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(PYTHONPATH=str(ROOT), PATH=str(tmp_path))  # run stops at "no Java", after its settings
    config = tmp_path / "mldserver.toml"
    config.write_text(f'sink = "iceberg:{tmp_path / "lake"}"\nstate_dir = "{tmp_path / "state"}"\n')
    said = {}
    for command in (["check", "--for", "run"], ["run"], ["check"], ["serve"]):
        done = subprocess.run(
            [MLDSERVER, *command, "--properties", str(path), "--handler", "tests.handlers:Noop", "--config", str(config)]
            if command != ["serve"] else
            [MLDSERVER, "serve", "--handler", "tests.handlers:Noop", "--config", str(config)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        said[" ".join(command)] = done.stderr
    assert said["check --for run"] == said["run"] and "needs Java 17 or later" in said["run"], said
    assert said["check"] == said["serve"] and "no stream is set: give --stream STREAM" in said["serve"], said