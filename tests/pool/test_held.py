"""A held call (``pool/frames.py``): the handler process waits for the server's ``go``
before it calls the handler; when the server's check said no, no attempt of that action
calls it, whatever ends the attempt that was told so. The process that dies before it
answers is the one fault here that a real process cannot be made to show on cue: a
stand-in plays it."""

from __future__ import annotations

import itertools
import types

from mldserver.api.records import Batch, ShardInfo
from mldserver.base.backoff import Backoff
from mldserver.base.logs import get_logger
from mldserver.pool.calls import ProcessCalls
from mldserver.pool.process import ProcessDied
from mldserver.shard.calls import SKIPPED

SHARD = ShardInfo("shardId-000000000001", "TRIM_HORIZON", 0)


class DiesAfterGo:
    """A handler process that is told ``go: false`` (it runs the check) and dies before
    its ``skipped`` answer: not blamed, so the action is redone."""

    alive, pid = True, 7

    def __init__(self) -> None:
        self.frames: list[dict] = []
        self.life = types.SimpleNamespace(acting=set())

    async def call(self, frame, body, requests, what, check=None):
        self.frames.append(frame)
        if check is not None:
            check()
        raise ProcessDied("signal SIGKILL", blamed=False)


class Pool:
    def __init__(self, proc) -> None:
        self.proc, self.call_ids = proc, itertools.count(1)

    async def assign(self, key, shard_id):
        return self.proc

    def fits(self, proc, quarantine) -> bool:
        return proc.alive and not quarantine

    def isolates(self, proc) -> bool:
        return False

    def release(self, proc, key) -> None:
        pass


async def test_a_call_the_check_refused_is_not_made_by_a_redone_attempt():
    proc = DiesAfterGo()
    calls = ProcessCalls(Pool(proc), None, retries=2, timeout=5, backoff=Backoff(), log=get_logger("t"))
    calls.shard, calls.proc = SHARD, proc
    batch = Batch([], 0, SHARD)
    batch.line = b'{"action":"processRecords","records":[]}'
    checks = []
    outcome = await calls.call("process_records", batch, lambda: None, collect_rows=True,
                               check=lambda: checks.append(1) or False)
    assert outcome.result == SKIPPED
    assert checks == [1] and [f.get("held") for f in proc.frames] == [True]  # one attempt: the held one
