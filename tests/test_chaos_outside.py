"""Chaos from outside the handler: the campaign of ``mldserver.ops.bench.chaos`` (poisoned
batches, handler processes SIGKILLed) against ``mldserver serve`` with a file sink on a
disk of its own, while ``mldserver.ops.bench.outside`` replaces the sink's folder by a
file, fills its disk and floods the admin port, each in turn. Seeded like the pool's
chaos test (``MLDSERVER_CHAOS_SEED=N`` runs another)."""

from __future__ import annotations

import os

import pytest

from mldserver.ops.bench import chaos

from .helpers import small_tmpfs

pytestmark = pytest.mark.slow  # some 90 s: a campaign, and each sink break held until /readyz says so

SEED = int(os.environ.get("MLDSERVER_CHAOS_SEED") or 20261127)


@pytest.mark.timeout(420)
async def test_a_chaos_campaign_with_the_sink_broken_and_the_admin_port_flooded_loses_nothing_and_tells_the_truth(
        tmp_path):
    """The campaign against ``mldserver serve`` with a file sink on a disk of its own:
    meanwhile the sink's folder is replaced by a file, its disk filled, the admin port
    flooded, each in turn. Every checkpointed record's row is committed (or spooled at its shard's end) once, /readyz says
    not ready while the sink is broken (and ready once mended), no shard is refused,
    and no handler process outlives the server."""
    from tests.helpers import small_tmpfs

    with small_tmpfs(tmp_path / "disk", "256m") as disk:
        run = await chaos.served(str(tmp_path), "outside", SEED, 75.0, 0.05, 3.0, sink_dir=disk / "out",
                                 outside_faults=("file", "full", "flood"), shards=8)
    print(chaos.summary(run.report, run.results))  # shown with a failure
    names = {c.name for c in run.results}
    assert "every checkpointed record's row committed or spooled, once" in names
    assert any(name.startswith("/readyz not ready") for name in names)
    failed = [f"{c.name}: {c.detail}" for c in run.results if not c.ok]
    assert not failed, f"seed {SEED} (MLDSERVER_CHAOS_SEED={SEED} runs it again): " + " | ".join(failed)
