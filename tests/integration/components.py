"""The real components (from PyPI, npm and Debian: scripts/setup --test), started on loopback for a test: kinesis-local,
DynamoDB Local, ``mldserver run``, which starts the KCL 3.x MultiLangDaemon (Java)
as its child, and what servers on many machines share for the table sink: a
PostgreSQL server (the Iceberg SQL catalog; Debian's postgresql) and moto's S3 server
(the warehouse). scripts/setup --test installs them under .deps/, .venv/ and from
Debian; nothing here is a mock, and a component that cannot start fails its test
saying why. The emulators themselves are ``mldserver.ops.emulators``'s (``bench --part
source`` starts them too)."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mldserver.ops.emulators import (AWS, STARTS, DynamoDBLocal, KinesisLocal, Process, daemon_properties,  # noqa: F401
                                     free_port)

from ..harness import MLDSERVER, ROOT, eventually


def wait_for(check, timeout: float, what: str, interval: float = 0.25):
    """``eventually`` for these synchronous tests; a check that raises is not up yet."""
    errors: list[Exception] = []

    def up():
        try:
            return check()
        except Exception as exc:
            errors[:] = [exc]
            return False

    try:
        return asyncio.run(eventually(up, timeout, what=what, interval=interval))
    except AssertionError as exc:
        raise TimeoutError(f"{exc} (last error: {errors[0] if errors else None})") from None


def write_properties(tmp: Path, name: str, *, stream: str, app: str, kinesis: KinesisLocal, dynamodb: DynamoDBLocal,
                     extra: dict[str, str] | None = None) -> Path:
    """The daemon's properties file for these emulators (``ops.emulators.daemon_properties``)."""
    return daemon_properties(tmp / f"{name}.properties", stream=stream, app=app, kinesis=kinesis.endpoint,
                             dynamodb=dynamodb.endpoint, extra=extra)


class Run:
    """``mldserver run``: the server, then the real KCL 3.x MultiLangDaemon as its child
    (jars from kclpy-ext, JAXB from Debian), in its own session; ``port`` read from
    its ``listening`` event, the daemon's pid from ``daemon_started``."""

    def __init__(self, tmp: Path, handler: str, properties: Path, *extra: str, run: int = 1,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = tmp / f"run-{run}.log"
        self.stderr_path = tmp / f"run-{run}.stderr"
        self.state_dir = tmp / "state"
        self.daemon_log = self.state_dir / "daemon" / "daemon.log"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [MLDSERVER, "run", "--properties", str(properties), "--handler", handler, "--port", "0",
                 "--state-dir", str(self.state_dir), "--log-file", str(self.log_path), "--admin", "127.0.0.1:0",
                 *extra],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "local",
                     "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1", **(env or {})},
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            )  # fmt: skip
        started = wait_for(lambda: self._event("daemon_started") or self._exited(), 240, "mldserver run started")
        self.port = self._event("listening")["port"]
        self.daemon_pid = started["pid"]

    def _exited(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"mldserver run exited {self.proc.returncode}: {self.stderr_path.read_text()}")

    def _event(self, name: str) -> dict | None:
        return next((e for e in self.events() if e["event"] == name), None)

    def events(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM (the daemon stops first, then the server): the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def kcl_shutdown_timeout(event: dict) -> bool:
    """KCL 3.1.3's graceful shutdown can wait for its record processors "to complete
    final shutdown" until shutdownGraceMillis runs out, after every shard's child has
    answered leaseLost and exited 0, then log this error (and still exit cleanly, every
    live shard checkpointed): the daemon's, reported as it is. Seen after a split
    (``test_real_daemon.after_split_shutdown``) and without one."""
    return event["event"] == "daemon_error" and (
        "Encountered an error during shutdown" in event["line"]
        or event["line"].startswith("java.util.concurrent.TimeoutException"))



# -- many machines' shared parts: a PostgreSQL server (the Iceberg SQL catalog) and an
# S3-compatible server (moto's, the warehouse), both on loopback ------------------------

class PostgreSQL:
    """A private PostgreSQL cluster (Debian's ``postgresql`` package: scripts/setup --test)
    in a temporary folder, on a free loopback port, with a database and a user of its own
    that logs in over TCP with a password (scram-sha-256; only the cluster's superuser,
    on its Unix socket, needs none). PostgreSQL refuses to run as root: as root, every
    command runs as the ``postgres`` user the package made, which owns the folder::

        db = PostgreSQL(user="mldserver", password="...", database="lake")
        db.uri      # postgresql+psycopg2://mldserver:...@127.0.0.1:PORT/lake
        db.stop()
    """

    def __init__(self, *, user: str, password: str, database: str) -> None:
        self.bin = self._bin()
        self.user, self.password, self.database = user, password, database
        self.as_postgres: list[str] = []
        # a folder of its own outside the test's (pytest's folders are root's alone, 0700)
        self.dir = Path(tempfile.mkdtemp(prefix="mldserver-postgres-"))
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("PostgreSQL refuses to run as root and there is no postgres user to run it as: "
                                   "run scripts/setup --test (Debian's postgresql package makes it)") from None
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self.as_postgres = ["runuser", "-u", "postgres", "--"]
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        self.port = 0
        for _ in range(STARTS):  # a port free_port gave can be taken before the server binds it
            self.port = free_port()
            started = self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log),
                                "-o", f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                                      f"-c unix_socket_directories={self.dir} -c fsync=off", check=False)
            if started.returncode == 0:
                break
        else:
            raise RuntimeError(f"PostgreSQL did not start, {STARTS} times: {self._log_tail()}")
        self._sql(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        self._sql(f"CREATE DATABASE {database} OWNER {user}")
        self.uri = f"postgresql+psycopg2://{user}:{password}@127.0.0.1:{self.port}/{database}"

    @staticmethod
    def _bin() -> Path:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
        if not found:
            raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): run "
                               "scripts/setup --test (Debian's postgresql package)")
        return Path(found[-1]).parent

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.as_postgres, str(self.bin / tool), *args], cwd=self.dir, capture_output=True,
                              text=True, timeout=120)
        if check and done.returncode:
            raise RuntimeError(f"PostgreSQL's {tool} exited {done.returncode}: {done.stderr or done.stdout} "
                               f"{self._log_tail()}")
        return done

    def _sql(self, statement: str) -> None:
        self._run("psql", "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                  "-v", "ON_ERROR_STOP=1", "-q", "-c", statement)

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def stop(self) -> None:
        """Stopped (fast: open sessions cut) and its folder removed."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data), check=False)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class MotoS3(Process):
    """moto's server (``moto[server]``, the test extra) as an S3-compatible endpoint on a
    free loopback port, in a process of its own, with ``bucket`` made. It takes any
    credentials: the test gives its own, to see that they never reach an output."""

    def __init__(self, tmp: Path, bucket: str) -> None:
        import boto3

        server = Path(sys.executable).parent / "moto_server"
        if not server.exists():
            raise RuntimeError(f"moto's server is not installed ({server}): run scripts/setup --test "
                               f"(moto[server] is in mldserver[test])")

        def launch(port: int) -> None:
            self._spawn([str(server), "-H", "127.0.0.1", "-p", str(port)], tmp / "moto-s3.log")
            self.client = boto3.client("s3", endpoint_url=self.endpoint, **AWS)

        self._start("moto's S3 server", launch, lambda: "Buckets" in self.client.list_buckets())
        self.client.create_bucket(Bucket=bucket)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def terminate(self, timeout: float = 60) -> int:
        self.client.close()
        return super().terminate(timeout)
