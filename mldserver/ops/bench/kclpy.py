"""``mldserver bench --part kclpy``: an amazon_kclpy application's processor behind
mldserver, against the same class under amazon_kclpy's ``KCLProcess``, one child
process per shard as the MultiLangDaemon runs it today, in one run::

    mldserver bench --part kclpy                     # 1 and 32 shards, 10,000 x 100 B and 1,000 x 1 KiB
    mldserver bench --part kclpy --shards 32 --load 10000x100 --workers 2

The processor is amazon_kclpy's own sample with its log turned off through its own
``log`` method (``kclpy_sample.py``): the same class, unchanged otherwise, on both
sides. The measuring is the relay part's (``relay.py``): the fake daemon drives K
shards in lock-step; records/s over the timed part; CPU per record of every process of
a side (the server, its handler processes and the relays, against the amazon_kclpy
children); memory per shard, the peak PSS of a side over K.
"""

from __future__ import annotations

import os

from .relay import HEADER, batches_for, run_variant

SAMPLE = "mldserver.ops.bench.kclpy_sample:QuietSample"
CHILD = """
from amazon_kclpy import kcl
from samples.sample_kclpy_app import RecordProcessor

class QuietSample(RecordProcessor):
    def log(self, message):
        pass

kcl.KCLProcess(QuietSample()).run()
"""


def available() -> str | None:
    """Why this part cannot run here, or None."""
    try:
        import samples.sample_kclpy_app  # noqa: F401
    except ImportError as exc:
        return (f"amazon_kclpy's sample app does not import ({exc}): pip install 'mldserver[kclpy]' "
                f"(kclpy-ext installs it as samples/sample_kclpy_app.py)")
    return None


async def run(args, shard_counts: list[int], tmp: str) -> None:
    missing = available()
    if missing is not None:
        print(f"\nkclpy: skipped: {missing}")
        return
    loads = [tuple(int(x) for x in spec.split("x")) for spec in args.load]
    print("\nkclpy: amazon_kclpy's sample processor (its log off) behind mldserver vs under amazon_kclpy's "
          "KCLProcess, one child per shard")
    for records, size in loads:
        print(f"\nload: batches of {records:,} records x {size} B (lock-step per shard)")
        print(HEADER)
        for k in shard_counts:
            batches = args.batches or batches_for(k, records, size, args.quick)
            base = await run_variant("amazon_kclpy", k, records, size, batches, tmp, kclpy_child=CHILD)
            ours = [await run_variant("mldserver", k, records, size, batches, os.path.join(tmp, "kclpy"), w,
                                      handler=SAMPLE) for w in args.workers]
            for result in (base, *ours):
                print(result.row(base))
                _check(result, k, records)
            for w, result in zip(args.workers, ours):
                print(f"  --workers {w}, K={k}: {_times(result.rate, base.rate)} amazon_kclpy's records/s, "
                      f"{_times(result.cpu_s / result.records, base.cpu_s / base.records)} its CPU per record, "
                      f"{_times(result.per_shard_pss_kb, base.per_shard_pss_kb)} its memory per shard "
                      f"({result.per_shard_pss_kb / 1024:.1f} vs {base.per_shard_pss_kb / 1024:.1f} MiB)")


def _times(ours: float, theirs: float) -> str:
    """``ours`` as a multiple of ``theirs`` ("-" when a run was too short to measure it:
    CPU time is counted in ticks of 10 ms)."""
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def _check(result, k: int, records: int) -> None:
    """Each shard's first batch checkpointed at its largest sequence number, as the sample
    does: its processor ran on every shard (with its log off, its errors are silent)."""
    largest = (str(10**50 + records - 1), 0)  # relay.batch_line's last record
    if result.checkpoints != {f"shardId-{i:012d}": largest for i in range(k)}:
        raise RuntimeError(f"{result.name}, K={k}: the sample did not checkpoint every shard at {largest}: "
                           f"{result.checkpoints}")
