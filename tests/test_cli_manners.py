"""What a command line is judged by: ``--version``, every ``--help`` exits 0, and a
misspelt flag, command or setting gets the nearest one ("did you mean")."""

from __future__ import annotations

import subprocess

import pytest

from mldserver import __version__

from .harness import MLDSERVER

COMMANDS = ["serve", "run", "check", "connect", "bench", "demo", "status", "pause", "resume", "reload", "redrive",
            "positions"]


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_version():
    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"mldserver {__version__}\n")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_help_exits_0_and_says_what_it_takes(command):
    done = cli(command, "--help")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"usage: mldserver {command}")


@pytest.mark.parametrize("args, near", [
    (["serve", "--porte", "7070"], "--port"),
    (["serve", "--handler", "x:y", "--executon-timeout", "3"], "--execution-timeout"),
    (["serv", "--handler", "x:y"], "serve"),
])
def test_a_misspelt_flag_or_command_gets_the_nearest_one_in_one_line(args, near):
    done = cli(*args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"did you mean {near}?" in done.stderr, done.stderr


def test_a_misspelt_setting_gets_the_nearest_one_not_every_key(tmp_path):
    (tmp_path / "mld.toml").write_text('handler = "x:y"\nexecution_timout = 3\n')
    done = cli("serve", "--config", str(tmp_path / "mld.toml"))
    assert done.returncode == 2
    assert done.stderr == f"mldserver: {tmp_path / 'mld.toml'}: unknown setting 'execution_timout': did you mean " \
                          f"'execution_timeout'?\n"
