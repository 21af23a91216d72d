"""``mldserver bench --part kclpy``: amazon_kclpy's sample processor behind mldserver and
under KCLProcess, side by side in one run (each side's processor checked to have
checkpointed every shard, so a broken side cannot pass for a fast one)."""

from __future__ import annotations

import os
import re
import subprocess

from .harness import MLDSERVER, ROOT


def test_the_kclpy_part_prints_the_sample_behind_mldserver_beside_kclprocess(tmp_path):
    out = subprocess.run([MLDSERVER, "bench", "--part", "kclpy", "--quick", "--load", "1000x100", "--shards", "1", "2"],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "amazon_kclpy's sample processor (its log off) behind mldserver vs under amazon_kclpy's KCLProcess" in \
        out.stdout
    for k in (1, 2):
        for variant in ("amazon_kclpy", "mldserver w2", "mldserver w0"):
            assert re.search(rf"^\s+{variant}\s+{k}\s+[\d,]+\s+[\d.]+x", out.stdout, re.M), (variant, out.stdout)
        for workers in (2, 0):
            # (CPU is counted in 10 ms ticks: a quick run may be too short to measure it, "-")
            assert re.search(rf"--workers {workers}, K={k}: [\d.]+x amazon_kclpy's records/s, ([\d.]+x|-) its CPU "
                             rf"per record, [\d.]+x its memory per shard \([\d.]+ vs [\d.]+ MiB\)", out.stdout), \
                out.stdout
