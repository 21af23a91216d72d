"""``MLDSERVER_NO_EXTENSIONS=1`` (``mldserver/native.py``): every place that picks a native
part picks its Python path instead; without it, the native parts are the ones in use
(this checkout builds them: ``scripts/setup``). Each side is checked in a fresh process,
since the choice is made once, at import (the relay's, when ``mldserver connect`` starts)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mldserver import native

from .harness import MLDSERVER

# What each place chose, as the process importing it sees it (True: the native part).
PROBE = """
import json
from mldserver.protocol import lazy
from mldserver.pool import frames
from mldserver.rows import emitted
from mldserver.coordinator import merge
print(json.dumps({
    "protocol/_scan.c": lazy._sequence_numbers is not None,
    "pool/_b64.c": frames._datas is not None,
    "rows/_emitted.c": emitted.Collector is not emitted.PyCollector,
    "coordinator/_gather.c": merge.native_gather is not None,
}))
"""


def environment(value: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (native.VARIABLE, "MLDSERVER_RELAY")}
    if value is not None:
        env[native.VARIABLE] = value
    return env


def chosen(value: str | None) -> dict[str, bool]:
    out = subprocess.run([sys.executable, "-c", PROBE], env=environment(value), capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def relay_argv(value: str | None) -> list[str]:
    """The command line of the process ``mldserver connect`` became, read once it has
    connected (so once it has executed the relay it chose)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(30)
        port = listener.getsockname()[1]
        child = subprocess.Popen([MLDSERVER, "connect", f"127.0.0.1:{port}"], env=environment(value),
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            connection, _ = listener.accept()
            argv = Path(f"/proc/{child.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            child.stdin.close()  # the daemon lets go: the relay half-closes, then the server does
            connection.settimeout(30)
            assert connection.recv(1) == b""
            connection.close()
            assert child.wait(30) == 0, child.stderr.read()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stderr.close()
    return [part.decode() for part in argv]


@pytest.mark.parametrize("value", ["1", "yes"])
def test_with_the_variable_set_every_place_takes_its_python_path(value):
    places = chosen(value)
    assert places == dict.fromkeys(places, False) and len(places) == 4
    argv = relay_argv(value)
    assert argv[1:3] == ["-I", "-S"] and argv[3].endswith("mldserver/ops/relay.py"), argv


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_it_the_native_parts_built_here_are_the_ones_in_use(value):
    places = chosen(value)
    assert places == dict.fromkeys(places, True), "setup.py did not build them all: scripts/setup"
    assert relay_argv(value)[0].endswith("mldserver/ops/mldserver-relay")


def test_allowed_reads_the_variable_each_time_it_is_asked(monkeypatch):
    monkeypatch.delenv(native.VARIABLE, raising=False)
    for name in ("mldserver.protocol._scan", "mldserver.pool._b64"):
        assert native.native_allowed() and native.load_native(name) is not None
    monkeypatch.setenv(native.VARIABLE, "1")
    for name in ("mldserver.protocol._scan", "mldserver.pool._b64"):
        assert not native.native_allowed() and native.load_native(name) is None
    monkeypatch.setenv(native.VARIABLE, "0")
    assert native.native_allowed() and native.load_native("mldserver.no_such_part") is None  # not built: the Python path
