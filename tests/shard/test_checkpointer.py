"""Checkpoint error policy (docs/protocol.md, section 5), with plain calls and a fake clock."""

import pytest

from mldserver.base.backoff import Backoff
from mldserver.api.checkpointer import Checkpointer
from mldserver.errors import CheckpointError
from mldserver.base.positions import Position
from mldserver.protocol import CheckpointReply
from mldserver.api.records import Record
from mldserver.shard.progress import ShardProgress


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
    progress = ShardProgress()
    progress.batch([Record({"sequenceNumber": "7", "subSequenceNumber": sub}) for sub in range(5)])
    cp, _ = make(daemon, progress=progress)
    await cp.checkpoint("7")
    await cp.checkpoint("8")
    await cp.checkpoint(None, 3)
    assert daemon.requests == [("7", 4), ("8", 0), (None, None)]
    assert progress.stored == Position(8, 0, "8")


async def test_with_a_safe_position_a_checkpoint_goes_no_further_and_never_back():
    daemon = Daemon()
    progress = ShardProgress()
    progress.initialized(Position.parse("3"))
    progress.batch([Record({"sequenceNumber": str(seq)}) for seq in range(4, 10)])
    safe = Position(6, 0, "6")
    cp, _ = make(daemon, progress=progress, safe=lambda: safe)
    await cp.checkpoint()  # everything: what is safe
    await cp.checkpoint("9", 0)  # past what is safe: kept to it, nothing new, nothing sent
    safe = Position(8, 0, "8")
    await cp.checkpoint("7", 0)  # short of what is safe: as asked
    assert daemon.requests == [("6", 0), ("7", 0)]
    assert progress.stored == Position(7, 0, "7")


async def test_every_refusal_is_reported_once_with_its_delay_or_none_when_given_up():
    reports = []
    cp, _ = make(Daemon("ThrottlingException", "InvalidStateException"),
                 on_refused=lambda error, delay: reports.append((error.error, delay)))
    with pytest.raises(CheckpointError):
        await cp.checkpoint("5", 0)
    assert reports == [("ThrottlingException", 0.1), ("InvalidStateException", None)]


async def test_null_checkpoint_success_is_remembered():
    cp, _ = make(Daemon())
    await cp.checkpoint()
    assert cp.stored_all


async def test_a_closed_checkpointer_raises_without_asking_the_daemon():
    daemon = Daemon()
    cp, _ = make(daemon)
    await cp.checkpoint("1", 0)
    cp.close()
    with pytest.raises(CheckpointError, match="outside its action") as caught:
        await cp.checkpoint("2", 0)
    assert caught.value.error == "InvalidStateException"
    assert daemon.requests == [("1", 0)]


@pytest.mark.parametrize("args", [({"x": 1}, 0), ("5", "x"), ("5", True), (1.5, None)],
                         ids=["sequence_object", "sub_text", "sub_bool", "sequence_float"])
async def test_arguments_of_the_wrong_type_raise_without_asking_the_daemon(args):
    daemon = Daemon()
    refused = []
    cp, _ = make(daemon, on_refused=lambda error, delay: refused.append((error.error, delay)))
    with pytest.raises(CheckpointError) as caught:
        await cp.checkpoint(*args)
    assert caught.value.error == "IllegalArgumentException"
    assert daemon.requests == [] and refused == [("IllegalArgumentException", None)]
