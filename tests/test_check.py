"""``mldserver check``: the settings, the handler, the pipeline and the state directory
as ``serve`` would find them at start-up; exit 0 when clean, 2 with serve's own
one-line message when not."""

from __future__ import annotations

import io
import os
import subprocess

import pytest

from mldserver.ops import check
from mldserver.base.config import load
from mldserver.errors import ConfigError

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


def test_a_pipeline_that_cannot_be_imported_is_named(tmp_path):
    done = run("check", "--config", config(tmp_path), "--pipeline", "tests.nosuch:pipeline")
    assert done.returncode == 2
    assert done.stderr.startswith('mldserver: Could not import module "tests.nosuch" (pipeline tests.nosuch:pipeline)')


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
