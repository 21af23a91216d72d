"""SIGHUP while the fake daemon drives 8 shards: new processes import the handler
afresh, each shard moves over between two actions, no action is lost or answered
twice, no relay exits; a module that fails to import leaves the running code serving."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import Counter

from mldserver.base.config import Settings
from mldserver.server.server import Server
from mldserver.api.testing import FakeDaemon

from ..harness import eventually, relay_command, running
from ..helpers import FakeClock
from .serving import T0, MemorySink, batch, events

SHARDS = 8
MODULE = '''
import os
import mldserver

VERSION = {version}


class Versioned(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            batch.emit(record, {{"shard": batch.shard.shard_id, "seq": record.sequence_number,
                                "version": VERSION, "pid": os.getpid()}})
'''


def versioned(tmp_path, monkeypatch):
    """The module ``versioned_handler`` at version 1, importable: its file, to change."""
    code = tmp_path / "code"
    code.mkdir()
    module = code / "versioned_handler.py"
    module.write_text(MODULE.format(version=1))
    monkeypatch.syspath_prepend(str(code))
    return module


async def test_sighup_reloads_the_handler_while_shards_are_driven(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="mldserver")
    module = versioned(tmp_path, monkeypatch)
    settings = Settings(handler="versioned_handler:Versioned", port=0, state_dir=str(tmp_path / "state"),
                        handler_backoff=0.01, window=60.0, workers=2)
    sink = MemorySink()
    server = Server(settings, clock=FakeClock(T0 + 3_600_000), sink=sink)
    serving = asyncio.ensure_future(server.serve())
    await eventually(lambda: server.address or serving.done(), what="the server listening")
    daemon = FakeDaemon(relay_command(server.address[1]))
    shards = await asyncio.gather(*(daemon.shard(f"shardId-{s:012d}") for s in range(SHARDS)))
    loop = asyncio.get_running_loop()
    sent: dict[tuple[str, str], float] = {}  # (shard, first sequence number of a batch) -> when it was sent
    stop = asyncio.Event()

    async def one(s: int, shard) -> int:
        n = 0
        while not stop.is_set():
            first = 1000 * (n + 1)
            sent[(shard.shard_id, str(first))] = loop.time()
            await shard.process_records(batch(s, n, first, at=T0 + n * 1000), millis_behind_latest=1000)
            n += 1
            await asyncio.sleep(0.01)
        return n

    driving = asyncio.gather(*(one(s, shard) for s, shard in enumerate(shards)))
    await eventually(lambda: len(sent) >= 5 * SHARDS, timeout=20, what="some batches before the reload")
    module.write_text(MODULE.format(version=2) + "\n# version 2\n")
    os.kill(os.getpid(), signal.SIGHUP)
    await eventually(lambda: events(caplog, "reloaded"), timeout=20, what="the reload")
    reloaded_at = loop.time()
    await eventually(lambda: len(events(caplog, "handler_process_retired")) == 2, timeout=20,
                     what="the old processes retired once their shards moved")
    module.write_text("raise ImportError('a broken deploy')\n")
    os.kill(os.getpid(), signal.SIGHUP)
    [failed] = await eventually(lambda: events(caplog, "reload_failed"), timeout=20, what="the failed reload")
    count = len(sent)
    await eventually(lambda: len(sent) >= count + 3 * SHARDS, timeout=20, what="batches after the failed reload")
    stop.set()
    batches = await driving
    # The last batch, hours later in event time, closes every window before it: it is
    # each shard's next batch. Its sequence numbers must be above every one the shard sent:
    # a fixed 99_000 was, until a loaded machine made the reload take long enough for a
    # shard to send 99 batches; then the coordinator rightly dropped it as a replay
    # (``duplicates_dropped``), its event time never counted and the last window never
    # closed ("every row in the sink not reached").
    await asyncio.gather(*(shard.process_records(batch(s, n, 1000 * (n + 1), at=T0 + 600 * 60_000),
                                                 millis_behind_latest=1000)
                           for s, (shard, n) in enumerate(zip(shards, batches))))
    want = sum(batches) * 5
    await eventually(lambda: len(sink.rows) >= want, timeout=20, what="every row in the sink")
    for shard in shards:  # every relay is up; the conversation goes on
        await shard.shard_ended()
        assert await shard.close() == 0
    server.stop()
    await serving

    assert failed["error"] == ('Importing module "versioned_handler" (handler) failed: '
                               'ImportError: a broken deploy')
    counts = Counter((r["shard"], r["seq"]) for r in sink.rows)
    assert len(counts) == want and set(counts.values()) == {1}  # no action lost or answered twice
    for shard in shards:
        rows = sorted((r for r in sink.rows if r["shard"] == shard.shard_id), key=lambda r: int(r["seq"]))
        versions = [r["version"] for r in rows]
        assert versions == sorted(versions) and versions[0] == 1 and versions[-1] == 2, shard.shard_id
        for r in rows:  # a batch sent after the reload is handled by the new code
            first = str(int(r["seq"]) // 1000 * 1000)
            if sent[(shard.shard_id, first)] > reloaded_at:
                assert r["version"] == 2, (shard.shard_id, r)
    assert len(events(caplog, "shard_moved")) == SHARDS
    assert not events(caplog, "handler_failed") and not events(caplog, "handler_process_died")
    assert not events(caplog, "duplicates_dropped")  # nothing was delivered twice, so nothing dropped


async def test_idle_shards_do_not_keep_the_old_generation_running_after_a_reload(tmp_path, caplog, monkeypatch):
    """Two shards handle a batch each, then have nothing to read (the daemon sends no
    action to an empty shard): a reload still retires both old processes, with no
    action, and lists the idle shards; each shard's next action initializes a fresh
    instance in the new generation and runs the new code."""
    caplog.set_level(logging.INFO, logger="mldserver")
    module = versioned(tmp_path, monkeypatch)
    async with running(tmp_path, "versioned_handler:Versioned", sink=MemorySink(), clock=FakeClock(T0 + 3_600_000),
                       window=60.0, workers=2) as (server, sink, daemon):
        shards = await asyncio.gather(*(daemon.shard(f"shardId-{s:012d}") for s in range(2)))
        for s, shard in enumerate(shards):
            await shard.process_records(batch(s, 0, 1000), millis_behind_latest=1000)
        old = {p.pid for p in server.pool.serving()}
        module.write_text(MODULE.format(version=2) + "\n# version 2\n")
        assert await server.pool.reload()
        retired = await eventually(lambda: len(events(caplog, "handler_process_retired")) == 2
                                   and events(caplog, "handler_process_retired"), timeout=20,
                                   what="both old processes retired though their shards had no action")
        assert {r["pid"] for r in retired} == old
        assert sorted(s for r in retired for s in r["idle_shards"]) == sorted(shard.shard_id for shard in shards)
        for s, shard in enumerate(shards):
            await shard.process_records(batch(s, 1, 2000), millis_behind_latest=1000)
            await shard.process_records(batch(s, 2, 3000, at=T0 + 600 * 60_000), millis_behind_latest=1000)
        await eventually(lambda: len(sink.rows) >= 2 * 2 * 5, what="both shards' first two batches committed")
        for shard in shards:
            await shard.shard_ended()
            assert await shard.close() == 0
    assert len(events(caplog, "shard_moved")) == 2
    assert not events(caplog, "handler_failed") and not events(caplog, "handler_process_died")
    assert {(r["version"], r["pid"] in old) for r in sink.rows if int(r["seq"]) < 2000} == {(1, True)}
    later = [r for r in sink.rows if int(r["seq"]) >= 2000]
    assert later and all(r["version"] == 2 and r["pid"] not in old for r in later), later
