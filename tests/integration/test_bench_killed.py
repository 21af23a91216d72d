"""The chaos bench's ``run`` phase (``mldserver.ops.bench.killed``), with the real KCL
daemon, kinesis-local and DynamoDB Local: ``mldserver run`` SIGKILLed twice at seeded
moments and run again each time on the same state dir. Every check holds: each shard
resumes at the checkpoint stored at the kill and nothing it covered is read again;
every record's row is in the file sink, those checkpointed at a kill once; the daemon
and every process of a killed run are gone within seconds, nothing is left after the
final stop; ``/readyz`` is never ready while the server is down and ready once it
serves again. ``MLDSERVER_CHAOS_SEED=N`` runs another seed."""

from __future__ import annotations

import os

import pytest

from mldserver.ops.bench.killed import run_phase

pytestmark = pytest.mark.realdaemon

SEED = int(os.environ.get("MLDSERVER_CHAOS_SEED") or 20261127)


@pytest.mark.timeout(900)
async def test_a_run_sigkilled_twice_loses_nothing_leaves_nothing_running_and_health_tells_the_truth(tmp_path):
    killed = await run_phase(tmp_path, seed=SEED, kills=2, shards=2)
    print("\n".join(killed.table()))  # shown with a failure
    assert len(killed.kills) == 2 and all(k.covered for k in killed.kills), "each kill found records checkpointed"
    failed = [f"{c.name}: {c.detail}" for c in killed.checks() if not c.ok]
    assert not failed, f"seed {SEED} (MLDSERVER_CHAOS_SEED={SEED} runs it again): " + " | ".join(failed)
