"""``mldserver demo`` and ``mldserver bench`` run end to end and report what they say."""

from __future__ import annotations

import re
import subprocess

from .conftest import MLDSERVER


def test_demo_processes_every_record_and_ends_the_split_parent(tmp_path):
    out = subprocess.run([MLDSERVER, "demo", "--records", "20000", "--shards", "3", "--dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "records in          20,000 over 5 shards" in out.stdout
    assert "shardId-000000000000 -> SHARD_END" in out.stdout
    assert (tmp_path / "d" / "server.log").exists()


def test_bench_prints_every_variant_side_by_side(tmp_path):
    out = subprocess.run([MLDSERVER, "bench", "--quick", "--load", "1000x100", "--shards", "1", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for variant in ("amazon_kclpy", "mldserver", "direct", "ceiling"):
        assert re.search(rf"^\s+{variant}\s+\d+\s+[\d,]+", out.stdout, re.M), (variant, out.stdout)
    assert "relay cost at K=2" in out.stdout and "memory per shard at K=2" in out.stdout
    assert re.search(r"relay start-up: \d+ ms", out.stdout)
