"""Shared fixtures: each test's event loops, ``serve`` (servers in subprocesses, the real
CLI, stopped when the test ends: ``harness.ServerProcess``), DynamoDB Local and
kinesis-local, ``sleepers`` (processes that stand for a daemon or a server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

# Every log event must be in the catalogue, mldserver/base/events.toml: checked in this process and in
# every server, handler process and Spark process the tests start (they inherit it). Set
# before anything of mldserver is imported: the logger reads it once.
os.environ["MLDSERVER_CHECK_EVENTS"] = "1"

import pytest
import uvloop
from hypothesis import HealthCheck, settings

from .harness import ROOT, ServerProcess

# Property tests judge what they find, not how fast: on a loaded machine (CI's, shared
# cores) generating one example may take seconds, which Hypothesis's too_slow health
# check and its deadline would fail. Every @settings in the suite inherits this profile.
settings.register_profile("mldserver", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("mldserver")

DATA = Path(__file__).resolve().parent / "data"  # conformance scenarios and KPL vectors, copied as they are


# Tests run what ships: the CLI serves on uvloop (``uvloop.run``), so does every test's
# loop. The pool's, the worker's and the fault tests run on the stock loop as well: a
# failure of a pipe or a socket is raised by one loop and logged and dropped by the other.
BOTH_LOOPS = ("tests/pool/", "tests/shard/", "tests/faults/")


def pytest_asyncio_loop_factories(config, item):
    path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
    if path.startswith(BOTH_LOOPS):
        return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
    return {"uvloop": uvloop.new_event_loop}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The real daemons one after the other, on one xdist worker (``--dist loadgroup``,
    as scripts/test runs): each is a daemon, kinesis-local, DynamoDB Local and a server,
    whose leases expire on time only if they do not also share the cores with another."""
    for item in items:
        if item.get_closest_marker("realdaemon"):
            item.add_marker(pytest.mark.xdist_group("realdaemon"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    # A test that failed before closing its shards leaves their relays running, and the
    # loop's close then waits on them while they wait on a server stopped only later.
    from mldserver.api import testing

    testing.kill_children()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the last lines of each server it started (their
    logs are in its temporary folder, gone with the machine CI ran on)."""
    if call.when == "setup":
        ServerProcess.started.clear()
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for server in ServerProcess.started:
            report.sections.append((f"server {' '.join(server.args[:2])} ({call.when})", server.tail()))


@pytest.fixture
def sleepers():
    """Start processes that sleep 300 s (a daemon, a server, a pid in use), each killed
    at the test's end: ``proc = sleepers()``."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def serve(tmp_path):
    servers: list[ServerProcess] = []

    def start(handler: str, *extra: str, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(handler, tmp_path, *extra, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# -- DynamoDB Local and kinesis-local, for the tests that need them (one per test module) ---

@pytest.fixture(scope="module")
def dynamodb(tmp_path_factory):
    """A DynamoDB Local of this test module's own (``integration/components.py``)."""
    from .integration.components import DynamoDBLocal

    yield from _running(DynamoDBLocal, tmp_path_factory.mktemp("dynamodb-local"))


@pytest.fixture(scope="module")
def kinesis(tmp_path_factory):
    """A kinesis-local of this test module's own (``integration/components.py``)."""
    from .integration.components import KinesisLocal

    yield from _running(KinesisLocal, tmp_path_factory.mktemp("kinesis-local"))


def _running(component, tmp):
    local = component(tmp)
    try:
        yield local
    finally:
        local.terminate()


@pytest.fixture
def aws(dynamodb, monkeypatch):
    """The usual AWS configuration, pointed at DynamoDB Local (handler processes inherit it)."""
    from .integration.components import AWS

    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_REGION", AWS["region_name"])
    return dynamodb


# -- what servers on many machines share: PostgreSQL (an Iceberg SQL catalog) and an S3 server --

@pytest.fixture(scope="module")
def postgresql():
    """A PostgreSQL server of this test module's own, on loopback, with the database
    ``lake`` and the user ``mldserver``, whose password (``.password``) is fresh and
    random, so a test can look for it in every output (``integration/components.py``)."""
    import secrets

    from .integration.components import PostgreSQL

    db = PostgreSQL(user="mldserver", password=f"pg-{secrets.token_hex(12)}", database="lake")
    try:
        yield db
    finally:
        db.stop()


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory):
    """moto's server of this test module's own, on loopback, with the bucket ``lake``
    (``integration/components.py``); it answers Kinesis too."""
    from .integration.components import MotoS3

    yield from _running(lambda tmp: MotoS3(tmp, "lake"), tmp_path_factory.mktemp("moto-s3"))
