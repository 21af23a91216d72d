"""The container image (``deploy/Containerfile``), built and run here with podman
(``podman.py``), as an operator runs it:

1. ``run`` (the default target): ``mldserver run`` in the image, its daemon
   properties and a handler module as volumes, consumes a kinesis-local stream through
   the real KCL daemon inside the container; tini is PID 1, the user is not root, the
   admin endpoint answers; ``podman stop`` (SIGTERM to PID 1) stops the daemon first,
   so every shard's last position is stored in the lease table, and the container
   exits 0.
2. ``serve``: the JRE-free variant reads the stream itself (``--source kinesis:``)
   and stops the same way.
3. ``full``: ``run`` with the spark and iceberg extras runs ``mldserver demo`` (the
   pipeline in embedded Spark, on the image's JRE) to the end: every record in a
   committed window, none late.

Each image's size is printed (``pytest -s``) and written beside the test's files.
The first build of a machine takes minutes (the base from Debian's packages, the
wheels from PyPI, the JRE); later ones reuse podman's layers under .deps/podman, and
``full`` is ``run``'s layers and one more (the extras).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from mldserver.ops.emulators import deps_dir

from .components import AWS, KinesisLocal, free_port, wait_for, write_properties
from .podman import UID, Podman

pytestmark = [pytest.mark.realdaemon, pytest.mark.slow, pytest.mark.timeout(2700)]

HANDLER = '''
import json, os
import mldserver

class Seen(mldserver.Handler):
    """Each record's shard, sequence number and data, one JSON line each, in /state."""

    async def process_records(self, batch, checkpointer):
        with open("/state/seen.jsonl", "a") as f:
            for r in batch.records:
                f.write(json.dumps([batch.shard.shard_id, r.sequence_number, r.data.decode()]) + "\\n")
        await checkpointer.checkpoint()
'''


@pytest.fixture(scope="module")
def podman():
    return Podman(deps_dir() / "podman")


def volumes(root: Path) -> Path:
    """/handlers (the Seen handler), /config, /state (the image's user owns it)."""
    (root / "handlers").mkdir(parents=True)
    (root / "handlers" / "seen.py").write_text(HANDLER)
    (root / "config").mkdir()
    state = root / "state"
    state.mkdir()
    os.chown(state, UID, UID)
    return root


def seen(volumes: Path) -> list[list[str]]:
    path = volumes / "state" / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def put(kinesis: KinesisLocal, stream: str, n: int) -> list[list[str]]:
    out = []
    for i in range(n):  # one at a time: their order in a shard is the order put
        data = f"record-{i}"
        r = kinesis.client.put_record(StreamName=stream, Data=data.encode(), PartitionKey=f"pk-{i}",
                                      ExplicitHashKey=str((i % 2) * 2**127 + i))
        out.append([r["ShardId"], r["SequenceNumber"], data])
    return out


def events(podman: Podman, container: str) -> list[dict]:
    """The server's log (JSON lines on stderr: what ``podman logs`` shows of it)."""
    logs = podman("logs", container)
    return [json.loads(line) for line in (logs.stdout + logs.stderr).splitlines() if line.startswith("{")]


def answers(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


def report(volumes: Path, podman: Podman, image: str) -> int:
    size = podman.size(image)
    print(f"\n{image}: {size / 2**20:.0f} MiB")
    (volumes / "image-size.txt").write_text(f"{image} {size}\n")
    return size


def test_both_images_consume_a_stream_and_stop_cleanly_on_podman_stop(podman, kinesis, dynamodb, tmp_path):
    """One test, the two variants one after the other: they share podman's store (its
    base, its layers), which two xdist workers must not fill at once (pytest 9's node
    ids left xdist's loadgroup without effect: the two ran side by side and one's
    debootstrap removed the other's)."""
    the_run_image(podman, kinesis, dynamodb, volumes(tmp_path / "run"))
    the_serve_image(podman, kinesis, volumes(tmp_path / "serve"))


def the_run_image(podman: Podman, kinesis: KinesisLocal, dynamodb, volumes: Path) -> None:
    image = podman.build("run")
    report(volumes, podman, image)
    assert "healthz" in podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image).stdout
    stream, app = f"orders-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(stream, 2)
    expected = put(kinesis, stream, 20)
    assert len({shard for shard, _, _ in expected}) == 2
    write_properties(volumes / "config", "app", stream=stream, app=app, kinesis=kinesis, dynamodb=dynamodb)
    admin = free_port()
    name = f"mldserver-{uuid.uuid4().hex[:8]}"
    podman.run("-d", "--name", name, "-e", f"AWS_ACCESS_KEY_ID={AWS['aws_access_key_id']}",
               "-e", f"AWS_SECRET_ACCESS_KEY={AWS['aws_secret_access_key']}", "-e", "AWS_REGION=us-east-1",
               "-v", f"{volumes / 'config'}:/config:ro", "-v", f"{volumes / 'handlers'}:/handlers:ro",
               "-v", f"{volumes / 'state'}:/state", image,
               "run", "--properties", "/config/app.properties", "--handler", "seen:Seen", "--port", "0",
               "--admin", f"127.0.0.1:{admin}")
    try:
        podman.wait_running(name)
        wait_for(lambda: len(seen(volumes)) >= len(expected), 300, "every record at the handler in the container",
                 interval=1)
        assert sorted(map(tuple, seen(volumes))) == sorted(map(tuple, expected))  # each once
        assert answers(f"http://127.0.0.1:{admin}/healthz") == 200
        assert podman("exec", name, "cat", "/proc/1/cmdline").stdout.split("\0")[:2] == ["tini", "--"]
        assert podman("exec", name, "id", "-u").stdout.strip() == str(UID)
        assert podman.stop(name, 120) == 0
        log = events(podman, name)
        order = [e["event"] for e in log]
        assert order.index("daemon_stopping") < order.index("daemon_stopped") < order.index("stopped"), order
        (stopped,) = [e for e in log if e["event"] == "daemon_stopped"]
        assert stopped["clean"] is True, stopped
        last = {}
        for shard, seq, _ in expected:
            last[shard] = seq
        leases = dynamodb.leases(app)
        assert {shard: leases[shard][0] for shard in last} == last  # each shard's last record checkpointed
    finally:
        podman("rm", "-f", name, check=False)


def the_serve_image(podman: Podman, kinesis: KinesisLocal, volumes: Path) -> None:
    """The JRE-free variant reads the stream itself (--source kinesis:)."""
    image = podman.build("serve")
    report(volumes, podman, image)
    assert podman.run("--rm", "--entrypoint", "sh", image, "-c", "command -v java || echo none").stdout.strip() \
        == "none"
    stream = f"clicks-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(stream, 2)
    expected = put(kinesis, stream, 10)
    admin = free_port()
    name = f"mldserver-{uuid.uuid4().hex[:8]}"
    podman.run("-d", "--name", name, "-e", f"AWS_ACCESS_KEY_ID={AWS['aws_access_key_id']}",
               "-e", f"AWS_SECRET_ACCESS_KEY={AWS['aws_secret_access_key']}", "-e", "AWS_REGION=us-east-1",
               "-e", f"AWS_ENDPOINT_URL_KINESIS={kinesis.endpoint}",
               "-v", f"{volumes / 'handlers'}:/handlers:ro", "-v", f"{volumes / 'state'}:/state", image,
               "serve", "--source", f"kinesis:{stream}", "--handler", "seen:Seen", "--port", "0",
               "--admin", f"127.0.0.1:{admin}")
    try:
        podman.wait_running(name)
        wait_for(lambda: len(seen(volumes)) >= len(expected), 120, "every record at the handler", interval=0.5)
        assert sorted(map(tuple, seen(volumes))) == sorted(map(tuple, expected))
        assert answers(f"http://127.0.0.1:{admin}/readyz") == 200
        assert podman.stop(name, 60) == 0
        assert [e["event"] for e in events(podman, name)][-1] == "stopped"
    finally:
        podman("rm", "-f", name, check=False)


@pytest.mark.spark
def test_the_full_image_runs_the_demo_through_embedded_spark(podman, tmp_path):
    """``full`` is ``run`` and the pipeline: ``mldserver demo`` in it hands every window to
    embedded Spark (local[*], on the image's JRE 17) and commits each exactly once. After
    the other test, its build is one layer over ``run``'s (the extras' wheels)."""
    started = time.monotonic()
    image = podman.build("full")
    built = time.monotonic() - started
    root = volumes(tmp_path)
    report(root, podman, image)
    found = podman.run("--rm", "--entrypoint", "sh", image, "-c",
                       "java -version 2>&1 | head -1; id -u; "
                       "python3 -c 'import pyspark, pyiceberg.catalog.sql, psycopg2; print(pyspark.__version__)'")
    java, uid, pyspark = found.stdout.split("\n")[:3]
    assert re.search(r'version "17\.', java) and uid == str(UID) and pyspark.startswith("4."), found.stdout
    records = 20_000
    demo = podman.run("--rm", "-v", f"{root / 'state'}:/state", image, "demo", "--records", str(records),
                      "--shards", "3", "--dir", "/state/demo", "--admin", "off", timeout=900, check=False)
    print(f"\n{image}: built in {built:.0f} s, the demo ran in {time.monotonic() - started - built:.0f} s")
    out = root / "state" / "demo"
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-4000:]
    assert re.search(rf"windows committed +[1-9]\d* .*{records:,} rows in", demo.stdout), demo.stdout
    assert re.search(r"late rows +0$", demo.stdout, re.M), demo.stdout
    commits = [json.loads(p.read_text()) for p in (out / "output" / "_commits").glob("*.json")]
    assert sum(c["rows"] for c in commits) == records  # every record, in exactly one committed window
    [stopped] = [json.loads(line) for line in (out / "server.log").read_text().splitlines()
                 if '"coordinator_stopped"' in line]
    assert stopped["late"] == 0, stopped
    assert {f"window={c['window']}" for c in commits} == {p.name for p in (out / "output").glob("window=*")}
