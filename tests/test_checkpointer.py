"""Checkpoint error policy (PROTOCOL.md section 5), with plain calls and a fake clock."""

import pytest

from mldserver.backoff import Backoff
from mldserver.checkpointer import Checkpointer
from mldserver.errors import CheckpointError
from mldserver.protocol import CheckpointReply


class Daemon:
    """Replies with the given errors in turn, then success; records what was asked."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.requests = []

    async def __call__(self, request):
        self.requests.append((request.sequence_number, request.sub_sequence_number))
        error = self.errors.pop(0) if self.errors else None
        return CheckpointReply(request.sequence_number, request.sub_sequence_number, error)


def make(daemon, **kw):
    sleeps = []

    async def sleep(s):
        sleeps.append(s)

    kw.setdefault("retries", 6)
    cp = Checkpointer(daemon, backoff=Backoff(first=0.1, cap=2.0, rng=lambda: 1.0), sleep=sleep, **kw)
    return cp, sleeps


@pytest.mark.parametrize("error", ["ThrottlingException", "KinesisClientLibDependencyException"])
async def test_retriable_errors_are_retried_with_growing_backoff(error):
    daemon = Daemon(error, error, error)
    cp, sleeps = make(daemon)
    await cp.checkpoint("5", 0)
    assert len(daemon.requests) == 4
    assert sleeps == [0.1, 0.2, 0.4]


def test_backoff_is_jittered_and_starts_at_most_200ms():
    b = Backoff(first=0.1, cap=2.0)
    delays = [b.delay(0) for _ in range(200)]
    assert max(delays) <= 0.2 and min(delays) >= 0.05 and len(set(delays)) > 1
    assert Backoff(first=0.1, cap=2.0, rng=lambda: 1.0).delay(10) == 2.0


@pytest.mark.parametrize(
    "error", ["ShutdownException", "IllegalArgumentException", "InvalidStateException", "Throwable", "Whatever"]
)
async def test_other_errors_are_never_retried(error):
    daemon = Daemon(error)
    cp, sleeps = make(daemon)
    with pytest.raises(CheckpointError) as info:
        await cp.checkpoint("5", 0)
    assert info.value.error == error and not info.value.retriable
    assert len(daemon.requests) == 1 and sleeps == []


async def test_retries_are_bounded():
    daemon = Daemon(*["ThrottlingException"] * 50)
    cp, _ = make(daemon, retries=3)
    with pytest.raises(CheckpointError) as info:
        await cp.checkpoint()
    assert info.value.retriable and len(daemon.requests) == 4


async def test_time_budget_bounds_shard_end_retries():
    daemon = Daemon(*["ThrottlingException"] * 1000)
    now = [0.0]

    async def sleep(s):
        now[0] += s

    cp = Checkpointer(daemon, backoff=Backoff(first=0.1, cap=2.0, rng=lambda: 1.0), retries=0, budget=30.0,
                      sleep=sleep, clock=lambda: now[0])
    with pytest.raises(CheckpointError):
        await cp.checkpoint()
    assert 25.0 <= now[0] <= 30.0 and len(daemon.requests) > 10


async def test_after_shutdown_exception_no_more_requests_are_sent():
    daemon = Daemon("ShutdownException")
    cp, _ = make(daemon)
    with pytest.raises(CheckpointError):
        await cp.checkpoint("5", 0)
    with pytest.raises(CheckpointError) as info:
        await cp.checkpoint("6", 0)
    assert info.value.error == "ShutdownException" and len(daemon.requests) == 1


async def test_explicit_sequence_gets_the_delivered_sub_sequence_never_null():
    daemon = Daemon()
    cp, _ = make(daemon, delivered_sub=lambda seq: {"7": 4}.get(seq, 0))
    await cp.checkpoint("7")
    await cp.checkpoint("8")
    await cp.checkpoint(None, 3)
    assert daemon.requests == [("7", 4), ("8", 0), (None, None)]


async def test_null_checkpoint_success_is_remembered():
    cp, _ = make(Daemon())
    await cp.checkpoint()
    assert cp.stored_all
