"""The admin token: read from a file or generated into the state directory
(mldserver.server.admin_token), required by POST /pause, /resume and /reload of a
``mldserver serve`` whose admin endpoint listens beyond loopback or was given a token
file, while the GETs stay open; sent by ``mldserver pause|resume|reload``; and a start
refused, in one line, when the token cannot be had."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
from pathlib import Path

import aiohttp
import pytest

from mldserver.server import admin_token
from mldserver.errors import ConfigError

from .harness import MLDSERVER, ROOT, ServerProcess, eventually, running

TOKEN = "0123456789abcdef0123456789abcdef"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=30)


def local(server: ServerProcess) -> str:
    """The admin URL over loopback (a 0.0.0.0 endpoint logs http://0.0.0.0:PORT)."""
    url = server.admin_url
    assert url is not None, server.stderr
    return url.replace("0.0.0.0", "127.0.0.1")


async def call(url: str, method: str = "GET", token: str | None = None, *,
               header: str | None = None) -> tuple[int, str, dict[str, str]]:
    headers = {"Authorization": header if header is not None else f"Bearer {token}"} \
        if header is not None or token is not None else {}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, headers=headers) as resp:
            return resp.status, await resp.text(), dict(resp.headers)


async def paused(admin: str) -> bool:
    status, text, _ = await call(f"{admin}/status")
    assert status == 200
    return json.loads(text)["paused"]


def write_token(path: Path, value: str = TOKEN) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


# -- the endpoint, beyond loopback --------------------------------------------------------

async def test_beyond_loopback_a_post_without_the_token_is_401_and_nothing_pauses(serve, tmp_path):
    server = serve("tests.handlers:Noop", "--admin", "0.0.0.0:0")
    admin = local(server)
    token_path = tmp_path / "state" / "admin-token"
    token = token_path.read_text().strip()
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600 and len(token) >= 40

    for path in ("/pause", "/resume", "/reload"):
        status, text, headers = await call(f"{admin}{path}", "POST")
        assert status == 401, text
        assert headers["WWW-Authenticate"] == 'Bearer realm="mldserver admin"'
        assert f"POST {path} needs the admin token" in json.loads(text)["error"]
        assert "Authorization: Bearer TOKEN" in json.loads(text)["error"]
    assert await paused(admin) is False
    for header in (f"Bearer {token[:-1]}x", f"Bearer {token}{token}", "Bearer", f"Basic {token}", token):
        status, text, headers = await call(f"{admin}/pause", "POST", header=header)
        assert status == 401, (header, text)
    assert headers["WWW-Authenticate"] == 'Bearer realm="mldserver admin"'  # (the bare token: no scheme)
    status, _, headers = await call(f"{admin}/pause", "POST", f"{token[:-1]}x")
    assert status == 401 and headers["WWW-Authenticate"].endswith(', error="invalid_token"')
    assert await paused(admin) is False
    status, text, _ = await call(f"{admin}/nowhere", "POST")  # nothing said about paths to a stranger
    assert status == 401

    status, text, _ = await call(f"{admin}/pause", "POST", token)
    assert status == 200 and json.loads(text) == {"paused": True, "changed": True}
    assert await paused(admin) is True
    status, text, _ = await call(f"{admin}/resume", "POST", header=f"bearer  {token} ")
    assert status == 200 and json.loads(text) == {"paused": False, "changed": True}
    status, text, _ = await call(f"{admin}/reload", "POST", token)
    assert status == 200 and json.loads(text) == {"reloaded": True}

    events = server.events()
    listening = next(e for e in events if e["event"] == "admin_listening")
    assert listening["host"] == "0.0.0.0" and listening["token_file"] == str(token_path)
    assert [e["file"] for e in events if e["event"] == "admin_token_generated"] == [str(token_path)]
    refused = [e for e in events if e["event"] == "admin_refused"]
    assert {e["reason"] for e in refused} == {"no token", "wrong token"} and len(refused) == 10
    assert refused[0]["method"] == "POST" and refused[0]["path"] == "/pause" and refused[0]["peer"] == "127.0.0.1"
    assert token not in server.log_path.read_text() + server.stderr  # only where it is, never what


async def test_beyond_loopback_the_reads_stay_open_without_the_token(serve):
    server = serve("tests.handlers:Noop", "--admin", "0.0.0.0:0")
    admin = local(server)
    for path in ("/metrics", "/healthz", "/readyz", "/status", "/"):
        status, text, _ = await call(f"{admin}{path}")
        assert status == 200, (path, text)
    status, text, _ = await call(f"{admin}/metrics", "HEAD")
    assert status == 200


async def test_a_restart_keeps_the_generated_token(serve, tmp_path):
    first = serve("tests.handlers:Noop", "--admin", "0.0.0.0:0")
    token = (tmp_path / "state" / "admin-token").read_text().strip()
    assert first.stop() == 0
    second = serve("tests.handlers:Noop", "--admin", "0.0.0.0:0")
    assert (tmp_path / "state" / "admin-token").read_text().strip() == token
    assert not [e for e in second.events() if e["event"] == "admin_token_generated"]
    status, _, _ = await call(f"{local(second)}/pause", "POST", token)
    assert status == 200


# -- the commands on the server's machine ------------------------------------------------------

async def test_mldserver_pause_on_the_servers_machine_sends_the_generated_token(serve, tmp_path):
    server = serve("tests.handlers:Noop", "--admin", "0.0.0.0:0")
    admin = local(server)
    state = tmp_path / "state"

    result = cli("pause", "--admin", admin, "--state-dir", str(state))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout) == {"paused": True, "changed": True}
    assert await paused(admin) is True

    result = cli("resume", "--admin", admin, cwd=tmp_path)  # ./mldserver-state: no token there
    assert result.returncode == 1 and result.stdout.count("\n") == 1
    assert "needs its token, and none was found: pass --state-dir DIR" in result.stdout
    assert await paused(admin) is True

    (tmp_path / "mldserver-state").mkdir()  # the default state dir, of another server: its token is wrong
    write_token(tmp_path / "mldserver-state" / "admin-token")
    result = cli("resume", "--admin", admin, cwd=tmp_path)
    assert result.returncode == 1 and "refused the token in mldserver-state/admin-token" in result.stdout
    assert await paused(admin) is True

    result = cli("resume", "--admin", admin, "--admin-token-file", str(state / "admin-token"), cwd=tmp_path)
    assert result.returncode == 0 and json.loads(result.stdout) == {"paused": False, "changed": True}
    result = cli("status", "--admin", admin, cwd=tmp_path)  # a read: no token
    server = next(line for line in result.stdout.splitlines() if line.startswith("server "))
    assert result.returncode == 0 and " running " in server


def test_a_token_file_the_command_cannot_read_is_one_line_and_exit_2(tmp_path):
    result = cli("pause", "--admin", "127.0.0.1:9", "--admin-token-file", str(tmp_path / "missing"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"mldserver pause: --admin-token-file {tmp_path / 'missing'}: cannot read it")


# -- a token file ----------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
async def test_a_token_file_is_required_wherever_the_endpoint_listens(serve, tmp_path, host):
    token = secrets.token_hex(32)
    token_file = write_token(tmp_path / "admin.token", token)
    server = serve("tests.handlers:Noop", "--admin", f"{host}:0", "--admin-token-file", str(token_file))
    admin = local(server)
    assert not (tmp_path / "state" / "admin-token").exists()  # the file's token is the one
    listening = next(e for e in server.events() if e["event"] == "admin_listening")
    assert listening["token_file"] == str(token_file)

    status, _, _ = await call(f"{admin}/pause", "POST")
    assert status == 401 and await paused(admin) is False
    result = cli("pause", "--admin", admin, "--state-dir", str(tmp_path / "state"))  # no token there
    assert result.returncode == 1 and await paused(admin) is False
    result = cli("pause", "--admin", admin, "--admin-token-file", str(token_file))
    assert result.returncode == 0 and await paused(admin) is True
    status, _, _ = await call(f"{admin}/resume", "POST", token)
    assert status == 200 and await paused(admin) is False


async def test_on_loopback_without_a_token_file_the_posts_stay_open(tmp_path):
    for host in ("127.0.0.1", "localhost"):
        async with running(tmp_path, "tests.handlers:Noop", workers=0, admin=f"{host}:0") as (server, _, _):
            assert server.admin.token is None
            port = server.admin.bound[1]
            status, text, _ = await call(f"http://127.0.0.1:{port}/pause", "POST")
            assert status == 200 and json.loads(text)["paused"] is True
        assert not (tmp_path / "state" / "admin-token").exists()


async def test_an_endpoint_beyond_loopback_in_an_embedded_server_generates_its_token(tmp_path):
    async with running(tmp_path, "tests.handlers:Noop", workers=0, admin="0.0.0.0:0") as (server, _, _):
        token = server.admin.token
        assert token.generated and token.path == tmp_path / "state" / "admin-token"
        port = server.admin.bound[1]
        status, _, _ = await call(f"http://127.0.0.1:{port}/pause", "POST")
        assert status == 401 and not server.paused
        status, _, _ = await call(f"http://127.0.0.1:{port}/pause", "POST", token.value)
        await eventually(lambda: server.paused, what="paused")
        assert status == 200


# -- refused starts ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, said", [
    ("missing", "cannot read it (No such file or directory)"),
    ("directory", "cannot read it (Is a directory)"),
    ("empty", "the file is empty"),
    ("short", "not a token (one line of 16 to 4096 visible ASCII characters, no spaces)"),
])
def test_beyond_loopback_a_token_file_that_cannot_be_read_refuses_to_start(tmp_path, kind, said):
    path = tmp_path / "admin.token"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_text("\n")
    elif kind == "short":
        path.write_text("hunter2\n")
    launch = ServerProcess(None, tmp_path, "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir",
                           str(tmp_path / "state"), "--admin", "0.0.0.0:0", "--admin-token-file", str(path))
    assert launch.code == 2, launch
    assert launch.stderr == (f"mldserver: --admin-token-file {path}: {said}: write the token there (one line, as "
                             f"from `openssl rand -hex 32 > {path}`), readable by its user\n")
    assert not (tmp_path / "state" / "admin-token").exists()


def test_beyond_loopback_a_state_dir_token_that_cannot_be_read_refuses_to_start(tmp_path):
    (tmp_path / "state" / "admin-token").mkdir(parents=True)
    launch = ServerProcess(None, tmp_path, "--handler", "tests.handlers:Noop", "--port", "0", "--state-dir",
                           str(tmp_path / "state"), "--admin", "0.0.0.0:0")
    assert launch.code == 2, launch
    assert launch.stderr.count("\n") == 1 and launch.stderr.startswith(
        "mldserver: --admin 0.0.0.0:0 listens beyond loopback, where POST /pause, /resume and /reload need a "
        "token, and there is none: the admin token file")
    assert launch.stderr.rstrip().endswith("delete it (the next start writes a new one), or pass "
                                           "--admin-token-file FILE")


# -- the module -----------------------------------------------------------------------------

def test_a_token_is_the_files_one_line_of_visible_ascii(tmp_path):
    path = tmp_path / "t"
    path.write_text(f"  {TOKEN}\r\n")
    assert admin_token.read(path, "--admin-token-file") == TOKEN
    for bad in (f"{TOKEN} {TOKEN}", f"{TOKEN}\n{TOKEN}", "é" * 20, "x" * 15, "x" * 4097):
        path.write_text(bad)
        with pytest.raises(ConfigError, match=r"^--admin-token-file .*: not a token"):
            admin_token.read(path, "--admin-token-file")
    path.write_text("x" * 16)
    assert admin_token.read(path, "x") == "x" * 16


def test_the_state_dirs_token_is_generated_once_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        made = admin_token.in_state_dir(tmp_path)
    finally:
        os.umask(old)
    assert made.generated and made.path == tmp_path / "admin-token"
    assert stat.S_IMODE(made.path.stat().st_mode) == 0o600
    assert made.path.read_text() == made.value + "\n" and len(made.value) == 43
    again = admin_token.in_state_dir(tmp_path)
    assert again == admin_token.Token(made.value, made.path, generated=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin-token"]  # no temporary file left


def test_a_client_sends_the_flags_file_else_the_state_dirs_else_none(tmp_path):
    assert admin_token.for_client(None, str(tmp_path)) is None
    made = admin_token.in_state_dir(tmp_path)
    assert admin_token.for_client(None, str(tmp_path)) == admin_token.Token(made.value, made.path)
    other = write_token(tmp_path / "other")
    assert admin_token.for_client(str(other), str(tmp_path)) == admin_token.Token(TOKEN, other)


def test_only_a_bearer_header_with_the_token_matches():
    assert admin_token.matches(f"Bearer {TOKEN}", TOKEN)
    assert admin_token.matches(f"bearer   {TOKEN} ", TOKEN)
    for header in (None, "", "Bearer", "Bearer ", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}",
                   f"Bearer {TOKEN}x", "Bearer é"):
        assert not admin_token.matches(header, TOKEN), header
