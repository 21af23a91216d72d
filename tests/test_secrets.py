"""No secret in any output: the passwords and keys of ``[table_catalog]`` and
``[spark_conf]`` fed through every error path a user meets (``check``, ``serve``'s exit-2
line, its log, a driver's error quoting its URI) never appear in what is printed."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from pathlib import Path

import pytest

from mldserver.base import logs, secrets
from mldserver.base.config import Settings

from .harness import MLDSERVER, ROOT

PASSWORD = "Zx9-pw-SECRET-4471"
S3_SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSECRET"
SPARK_SECRET = "spark-s3a-SECRET-9932"
TOKEN = "rest-token-SECRET-1234"
ALL = (PASSWORD, S3_SECRET, SPARK_SECRET, TOKEN)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: connection refused


def config(tmp_path, catalog: str) -> str:
    path = tmp_path / "mldserver.toml"
    path.write_text(f"""
handler = "tests.handlers:Noop"
stream = "orders"
sink = "iceberg:"
state_dir = "{tmp_path / 'state'}"
[spark_conf]
"spark.hadoop.fs.s3a.secret.key" = "{SPARK_SECRET}"
[table_catalog]
{catalog}
"s3.secret-access-key" = "{S3_SECRET}"
token = "{TOKEN}"
warehouse = "file://{tmp_path / 'lake'}"
""")
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in ALL:
            assert secret not in text, f"{secret!r} printed in: {text[:2000]}"


@pytest.fixture(autouse=True)
def fresh_secrets(monkeypatch):
    monkeypatch.setattr(secrets, "_known", set())
    monkeypatch.setattr(secrets, "_ordered", [])


def test_scrub_stars_what_was_learnt_and_any_uris_password():
    secrets.learn(Settings(table_catalog={"uri": f"postgresql+psycopg2://app:{PASSWORD}@db:5432/lake",
                                          "s3.secret-access-key": S3_SECRET, "type": "sql"},
                           spark_conf={"spark.hadoop.fs.s3a.secret.key": SPARK_SECRET}))
    said = secrets.scrub(f"cannot connect to postgresql+psycopg2://app:{PASSWORD}@db:5432/lake with {S3_SECRET}, "
                         f"{SPARK_SECRET}; and https://u:never-seen-pw@host/x")
    assert said == ("cannot connect to postgresql+psycopg2://app:***@db:5432/lake with ***, ***; "
                    "and https://u:***@host/x")
    assert secrets.redacted({"uri": f"postgresql://app:{PASSWORD}@db/lake", "type": "sql", "token": "abcdef",
                             "nested": {"password": "x"}}) == {
        "uri": "postgresql://app:***@db/lake", "type": "sql", "token": "***", "nested": {"password": "***"}}


def test_a_log_line_quoting_a_secret_prints_it_starred(tmp_path):
    secrets.learn(Settings(table_catalog={"s3.secret-access-key": S3_SECRET}))
    path = tmp_path / "server.log"
    root = logging.getLogger("mldserver")
    saved = list(root.handlers), root.level, root.propagate
    logs.configure("json", "info", str(path))
    try:
        logs.get_logger("mldserver.sink").error("sink_commit_failed", error=f"OSError: signature {S3_SECRET} refused")
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level, root.propagate = saved
    text = path.read_text()
    assert "sink_commit_failed" in text and "***" in text
    assert_no_secret(text)


def test_check_and_serve_with_an_unreachable_catalog_print_no_secret(tmp_path):
    """A PostgreSQL catalog on a closed port: check and serve each say so in one line,
    exit 2, and neither that line nor the log holds a password or a key."""
    catalog = f'type = "sql"\nuri = "postgresql+psycopg2://app:{PASSWORD}@127.0.0.1:{closed_port()}/lake"'
    path = config(tmp_path, catalog)
    checked = run("check", "--config", path)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "cannot reach the catalog" in checked.stderr and "app:***@127.0.0.1" in checked.stderr
    log = tmp_path / "server.log"
    served = run("serve", "--config", path, "--port", "0", "--admin", "off", "--log-file", str(log))
    assert served.returncode == 2, served.stdout + served.stderr
    assert "cannot open the table" in served.stderr
    assert_no_secret(checked.stdout, checked.stderr, served.stdout, served.stderr, log.read_text())


def test_check_reaches_the_catalog_and_writes_to_the_warehouse(tmp_path):
    """A SQLite catalog named like another engine names it: check opens it, finds no
    table yet, puts a file in the warehouse and deletes it; the secrets stay out."""
    catalog = f'type = "sql"\nname = "lake"\nuri = "sqlite:///{tmp_path}/catalog.db"'
    path = config(tmp_path, catalog)
    (tmp_path / "lake").mkdir()
    checked = run("check", "--config", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "catalog reached, table mldserver.windows made at the first window" in checked.stdout
    assert f"warehouse file://{tmp_path / 'lake'} writable" in checked.stdout
    assert list((tmp_path / "lake").iterdir()) == []  # the probe deleted
    assert_no_secret(checked.stdout, checked.stderr)


def test_a_warehouse_that_cannot_be_written_is_one_line_from_check(tmp_path):
    catalog = f'type = "sql"\nuri = "sqlite:///{tmp_path}/catalog.db"'
    path = config(tmp_path, catalog)
    (tmp_path / "lake").write_text("a file where the warehouse should be")
    checked = run("check", "--config", path)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert checked.stderr.count("\n") == 1 and "cannot be written" in checked.stderr
    assert_no_secret(checked.stdout, checked.stderr)


def test_iceberg_without_a_folder_needs_a_warehouse(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('handler = "tests.handlers:Noop"\nstream = "orders"\nsink = "iceberg:"\n'
                    '[table_catalog]\ntype = "sql"\nuri = "sqlite:///x.db"\n')
    checked = run("check", "--config", str(path))
    assert checked.returncode == 2
    assert "names no warehouse" in checked.stderr


# -- an Iceberg REST catalog ([table_catalog] type = "rest"): its credential and token ------

CLIENT_SECRET = "rest-client-SECRET-5521"


def rest_config(tmp_path, uri: str, *, sink: str = "iceberg:", warehouse: str | None = "lake") -> str:
    """A REST catalog as the docs write it: OAuth client credentials, a token, S3 keys."""
    path = tmp_path / "rest.toml"
    path.write_text(f"""
handler = "tests.handlers:Noop"
stream = "orders"
sink = "{sink}"
state_dir = "{tmp_path / 'state'}"
[table_catalog]
type = "rest"
uri = "{uri}"
credential = "mldserver:{CLIENT_SECRET}"
"s3.secret-access-key" = "{S3_SECRET}"
""" + (f'warehouse = "{warehouse}"\n' if warehouse else ""))
    return str(path)


def assert_no_rest_secret(*texts: str) -> None:
    assert_no_secret(*texts)
    for text in texts:
        assert CLIENT_SECRET not in text, f"the client secret printed in: {text[:2000]}"


@pytest.fixture
def web_server(tmp_path):
    """A real web server that is no Iceberg catalog (the standard library's, serving an
    empty folder on a loopback port of its own): what a wrong ``uri`` reaches. Its
    ``requests`` are the request lines it was sent."""
    import functools
    import http.server
    import threading

    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_request(self, code="-", size="-"):
            requests.append(self.requestline)

        def log_message(self, format, *args):
            pass

    (tmp_path / "www").mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Handler, directory=str(tmp_path / "www")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.requests = requests  # type: ignore[attr-defined]
    server.uri = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_secret_half_of_a_rest_credential_is_starred_alone():
    secrets.learn(Settings(table_catalog={"type": "rest", "credential": f"mldserver:{CLIENT_SECRET}"}))
    assert secrets.scrub(f"invalid_client: client_secret={CLIENT_SECRET}") == "invalid_client: client_secret=***"
    assert secrets.scrub(f"credential mldserver:{CLIENT_SECRET}") == "credential ***"


def test_check_and_serve_with_a_rest_catalog_on_a_closed_port_say_so_in_one_line(tmp_path):
    """A REST catalog nobody listens at: check and serve each exit 2 with one line naming
    the catalog (its credential starred), and no secret in anything printed or logged."""
    path = rest_config(tmp_path, f"http://127.0.0.1:{closed_port()}")
    checked = run("check", "--config", path)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert checked.stderr.count("\n") == 1, checked.stderr
    assert "cannot reach the catalog" in checked.stderr and "'credential': '***'" in checked.stderr, checked.stderr
    assert "Connection refused" in checked.stderr, checked.stderr
    log = tmp_path / "server.log"
    served = run("serve", "--config", path, "--port", "0", "--admin", "off", "--log-file", str(log))
    assert served.returncode == 2, served.stdout + served.stderr
    assert served.stderr.count("\n") == 1 and "cannot open the table" in served.stderr, served.stderr
    assert_no_rest_secret(checked.stdout, checked.stderr, served.stdout, served.stderr, log.read_text())


def test_a_rest_uri_that_reaches_a_web_server_but_no_catalog_is_one_line_from_check(tmp_path, web_server):
    """A wrong ``uri`` that some web server answers (with a page of HTML): one line, the
    server's answer in it; and the OAuth request that carried the client secret is the
    catalog's (POST /v1/oauth/tokens), never printed."""
    checked = run("check", "--config", rest_config(tmp_path, web_server.uri))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert checked.stderr.count("\n") == 1, checked.stderr
    assert "cannot reach the catalog" in checked.stderr and "501" in checked.stderr, checked.stderr
    assert web_server.requests == ["POST /v1/oauth/tokens HTTP/1.1"], web_server.requests
    assert_no_rest_secret(checked.stdout, checked.stderr)


def test_a_rest_catalog_is_sent_its_own_warehouse_never_the_sinks_folder(tmp_path, web_server):
    """A REST server names by ``warehouse`` what it decides (a catalog, a table bucket):
    it is asked for the configured one as it is, and for none when only DIR is given."""
    given = rest_config(tmp_path, web_server.uri, warehouse="lake")
    Path(given).write_text(Path(given).read_text().replace(f'credential = "mldserver:{CLIENT_SECRET}"\n', ""))
    checked = run("check", "--config", given)
    assert checked.returncode == 2 and "404" in checked.stderr, checked.stdout + checked.stderr
    folder = rest_config(tmp_path, web_server.uri, sink=f"iceberg:{tmp_path / 'lake'}", warehouse=None)
    Path(folder).write_text(Path(folder).read_text().replace(f'credential = "mldserver:{CLIENT_SECRET}"\n', ""))
    checked = run("check", "--config", folder)
    assert checked.returncode == 2 and "404" in checked.stderr, checked.stdout + checked.stderr
    assert web_server.requests == ["GET /v1/config?warehouse=lake HTTP/1.1", "GET /v1/config HTTP/1.1"]
