"""The Spark sink end to end: ``mldserver serve`` (a real process) with the passthrough
handler and ``--sink parquet:DIR``, its Spark process running embedded Spark, driven
through the relay by the fake daemon. Output is read back with pyarrow, as a user's
reader would (names starting with ``_`` skipped)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import orjson
import pyarrow.dataset as ds
import pytest

from mldserver.api.testing import FakeDaemon

from ..harness import eventually, relay_command
from ..test_pipeline import CONFIG, Stream, until_killed

pytestmark = pytest.mark.spark

PASSTHROUGH = "handlers.passthrough:Passthrough"


def committed_rows(out) -> Counter:
    """(shard, sequence number) -> how many times it is in the committed output. Only
    the published windows are read (each renamed into place whole): a listing of the
    whole folder raced with Spark deleting its staging folders."""
    counts: Counter = Counter()
    for window in [p for p in out.iterdir() if p.name.startswith("window=")] if out.exists() else []:
        table = ds.dataset(window, format="parquet").to_table(columns=["shard_id", "sequence_number"])
        counts.update(zip(table.column("shard_id").to_pylist(), table.column("sequence_number").to_pylist()))
    return counts


def put_keys(model: Stream, shard_ids=None) -> set[tuple[str, str]]:
    return {
        (shard_id, r["sequenceNumber"])
        for shard_id, records in model.records.items()
        if shard_ids is None or shard_id in shard_ids
        for r in records
    }


async def committed_once(server, out) -> None:
    """Two shards of the pipeline tests' stream through ``server``: every record of
    theirs in the committed output, once."""
    model = Stream()
    ids = sorted(model.records)[1:3]
    daemon = FakeDaemon(relay_command(server.port))
    shards = {i: await daemon.shard(i) for i in ids}
    await model.finish(shards)
    put = put_keys(model, ids)
    await eventually(lambda: put <= set(committed_rows(out)), timeout=180, interval=0.25, what="every record committed")
    counts = committed_rows(out)
    assert set(counts) == put and max(counts.values()) == 1
    await model.shut_down(daemon, shards)


def config_file(tmp_path, checkpoint_interval: float | None = None) -> str:
    path = tmp_path / "mldserver.toml"
    config = CONFIG
    if checkpoint_interval is not None:
        assert "checkpoint_interval = 0.0" in config
        config = config.replace("checkpoint_interval = 0.0", f"checkpoint_interval = {checkpoint_interval}")
    path.write_text(config)
    return str(path)


async def test_every_record_is_committed_exactly_once_across_a_split_and_a_server_sigkill(serve, tmp_path):
    out = tmp_path / "out"
    # No checkpoint on a batch before the SIGKILL (SHARD_END's is stored all the same):
    # every committed row is delivered again after it, and must be dropped. With a
    # checkpoint on every batch, whether any committed row was still unchecked at the
    # kill was up to timing (the shards' statuses wait for the sink: none, mostly).
    args = ("--sink", f"parquet:{out}", "--config", config_file(tmp_path, checkpoint_interval=3600.0))
    model = Stream()
    ids = sorted(model.records)

    server = serve(PASSTHROUGH, *args)
    daemon = FakeDaemon(relay_command(server.port))
    parents = {i: await daemon.shard(i) for i in ids[:3]}
    await asyncio.gather(*(model.feed(s, batches=6) for s in parents.values()))
    await parents[ids[0]].shard_ended()  # the split: SHARD_END after the spool
    children = {i: await daemon.shard(i) for i in ids[3:]}
    live = {**children, ids[1]: parents[ids[1]], ids[2]: parents[ids[2]]}
    await asyncio.gather(*(model.feed(s, batches=3) for s in live.values()))
    await eventually(lambda: committed_rows(out), timeout=90, interval=0.25, what="a first committed window")
    feeders = [asyncio.ensure_future(model.feed(s)) for s in live.values()]
    await asyncio.sleep(0.3)
    os.kill(server.proc.pid, signal.SIGKILL)  # mid-stream; the Spark process dies with it
    await asyncio.gather(*(until_killed(f) for f in feeders))
    for s in [*parents.values(), *children.values()]:
        await s.child.kill()
    server.proc.wait()
    before = committed_rows(out)
    assert before and max(before.values()) == 1

    server = serve(PASSTHROUGH, *args)
    assert "commit_log_read" in [e["event"] for e in server.events()]
    restarted, shards = await model.restart(daemon.checkpoints, server.port)

    put = put_keys(model)
    await eventually(lambda: put <= set(committed_rows(out)), timeout=90, interval=0.25, what="every record committed")
    counts = committed_rows(out)
    assert set(counts) == put
    assert [key for key, n in counts.items() if n > 1] == []  # exactly once, though records were re-delivered
    events = [e["event"] for e in server.events()]
    assert "duplicates_dropped" in events  # re-delivered rows were filtered by the commit log

    await model.shut_down(restarted, shards)
    assert not list((tmp_path / "state" / "spool").glob("*.jsonl"))
    assert not [p for p in out.iterdir() if p.name.startswith("window=") and not (out / "_commits" / f"{p.name[7:]}.json").exists()]


async def test_a_spark_worker_killed_during_a_commit_is_restarted_and_the_window_committed_once(serve, tmp_path):
    out, marks = tmp_path / "out", tmp_path / "marks"
    server = serve(
        PASSTHROUGH,
        "--sink", f"parquet:{out}", "--pipeline", "tests.spark.pipelines:slow", "--config", config_file(tmp_path),
        env={"MLDSERVER_TEST_MARKS": str(marks), "MLDSERVER_TEST_SLEEP": "1.5"},
    )  # fmt: skip
    model = Stream()
    ids = sorted(model.records)[1:3]
    daemon = FakeDaemon(relay_command(server.port))
    shards = {i: await daemon.shard(i) for i in ids}
    # Killed as soon as the first window's pipeline marks it, while the feed goes on: the
    # shards' statuses wait for the sink, so after the whole feed the kill could land
    # between two windows, with the one in flight not yet marked.
    feeding = asyncio.gather(*(model.feed(s, batches=4) for s in shards.values()))
    await eventually(lambda: marks.exists() and any(marks.iterdir()), timeout=90, what="a commit under way")
    [started] = [e for e in server.events() if e["event"] == "spark_started"]
    os.kill(started["pid"], signal.SIGKILL)
    await feeding

    await model.finish(shards)
    put = put_keys(model, ids)
    await eventually(lambda: put <= set(committed_rows(out)), timeout=150, interval=0.25,
                     what="every record committed")
    counts = committed_rows(out)
    assert set(counts) == put and max(counts.values()) == 1
    events = server.events()
    exited = [e for e in events if e["event"] == "spark_process_exited"]
    assert exited and exited[0]["returncode"] == -signal.SIGKILL
    assert len([e for e in events if e["event"] == "spark_started"]) == 2
    by_killed = [m for m in marks.iterdir() if m.name.endswith(f"-{started['pid']}")]
    killed_window = max(by_killed, key=lambda m: m.stat().st_mtime).name.rsplit("-", 1)[0]
    again = [m for m in marks.iterdir() if m.name.startswith(killed_window) and m not in by_killed]
    assert len(again) == 1  # the window in flight was handed over again, to the new Spark process
    await model.shut_down(daemon, shards)


async def test_a_pipeline_that_raises_is_retried_and_reported_and_no_checkpoint_passes_its_window(serve, tmp_path):
    out, flag = tmp_path / "out", tmp_path / "fail"
    flag.touch()
    server = serve(
        PASSTHROUGH,
        "--sink", f"parquet:{out}", "--pipeline", "tests.spark.pipelines:fails_while_flagged",
        "--config", config_file(tmp_path),
        env={"MLDSERVER_TEST_FLAG": str(flag)},
    )  # fmt: skip
    model = Stream()
    shard_id = sorted(model.records)[1]
    daemon = FakeDaemon(relay_command(server.port))
    shard = await daemon.shard(shard_id)

    async def feed() -> None:
        await model.feed(shard, batches=5)
        await shard.process_records([], millis_behind_latest=0)  # caught up: the windows close

    # The batches' statuses wait while the sink is behind (the window in front fails):
    # fed meanwhile, answered once the pipeline works again. A checkpoint the server
    # made before would reach the daemon during them.
    feeding = asyncio.ensure_future(feed())

    def failures():
        return [e for e in server.events() if e["event"] == "sink_commit_failed"]

    await eventually(lambda: len(failures()) >= 2, timeout=90, interval=0.25, what="the window retried")
    first = failures()[0]
    assert "ValueError: bad window" in first["error"] and first["window"] in first["error"]
    assert "fails_while_flagged" in first["traceback"] and first["what_to_do"]
    assert daemon.checkpoints.get(shard_id) is None  # nothing committed, nothing checkpointed
    assert committed_rows(out) == Counter()

    flag.unlink()
    await feeding
    put = put_keys(model, [shard_id]) & {(shard_id, r["sequenceNumber"]) for r in model.records[shard_id][:500]}
    await eventually(lambda: put <= set(committed_rows(out)), timeout=90, interval=0.25,
                     what="the window committed once the pipeline works")
    # (published windows show before the commit log's entry and the server's word of it:
    # the checkpoint comes with the first action after the server knows)
    last = model.records[shard_id][499]["sequenceNumber"]
    await eventually(lambda: sum(e.get("rows", 0) for e in server.events() if e["event"] == "window_committed")
                     >= 500, timeout=90, interval=0.25, what="the server told of every commit")
    await shard.process_records([], millis_behind_latest=0)
    assert daemon.checkpoints[shard_id] == (last, 0)
    await shard.close()


async def test_a_spark_process_that_cannot_start_again_shuts_the_server_down_in_order_with_exit_1(serve, tmp_path):
    flag = tmp_path / "broken"
    server = serve(
        PASSTHROUGH,
        "--sink", f"parquet:{tmp_path / 'out'}", "--pipeline", "tests.spark.deployable:pipeline",
        "--config", config_file(tmp_path),
        env={"MLDSERVER_TEST_FLAG": str(flag)},
    )  # fmt: skip
    [started] = [e for e in server.events() if e["event"] == "spark_started"]
    flag.touch()  # from now on its pipeline does not import
    os.kill(started["pid"], signal.SIGKILL)
    assert await asyncio.to_thread(server.proc.wait, 120) == 1
    events = server.events()
    names = [e["event"] for e in events]
    [failed] = [e for e in events if e["event"] == "spark_restart_failed"]  # not retried: it would fail again
    assert "a broken deploy of the pipeline" in failed["error"] and failed["retrying"] is False
    [crashed] = [e for e in events if e["event"] == "task_crashed"]
    assert crashed["task"] == "spark-supervisor" and "a broken deploy of the pipeline" in crashed["error"]
    assert crashed["traceback"].startswith("Traceback") and crashed["what_to_do"]
    order = ["spark_process_exited", "spark_restart_failed", "task_crashed", "shutting_down", "coordinator_stopped",
             "spark_stopped", "stopped"]
    assert [names.index(name) for name in order] == sorted(names.index(name) for name in order)
    assert "broken deploy" in server.stderr_path.read_text()  # the CLI's one line


def slow_sink(tmp_path, monkeypatch, seconds: float):
    """A Spark sink whose pipeline (``pipelines.slow``) marks each commit under way in
    ``marks`` and then takes ``seconds``; not started."""
    from mldserver.base.config import Settings
    from mldserver.base.deadletters import DeadLetters
    from mldserver.sinks.parquet import SparkSink
    from mldserver.spark.process import SparkProcess

    marks, out = tmp_path / "marks", tmp_path / "out"
    monkeypatch.setenv("MLDSERVER_TEST_MARKS", str(marks))
    monkeypatch.setenv("MLDSERVER_TEST_SLEEP", str(seconds))
    settings = Settings(handler="x:y", state_dir=str(tmp_path / "state"), pipeline="tests.spark.pipelines:slow")
    spark = SparkProcess(settings, sink_dir=out)
    return spark, SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters")), marks, out


async def test_windows_prepared_ahead_commit_once_in_window_order_across_spark_process_sigkills(tmp_path, monkeypatch):
    """The coordinator's way with windows closed at once: ``prepare`` the next, commit
    one at a time in order, retry a retriable failure. The next window's file is
    written while the one in front commits; the Spark process is SIGKILLed in the
    middle of two commits (one with a prepared window behind it): every window is
    committed once, in window order, with all its rows."""
    from mldserver.spark.commitlog import CommitLog
    from mldserver.base.handoff import JsonLines, Window
    from mldserver.base.positions import Position
    from mldserver.errors import retriable
    from mldserver.spark.process import SparkError

    spark, sink, marks, out = slow_sink(tmp_path, monkeypatch, 1.5)

    def window(n: int) -> Window:
        seqs = range(n * 100, n * 100 + 25 + n)
        rows = [b'{"shard_id":"s0","sequence_number":"%d","n":%d}' % (s, n) for s in seqs]
        return Window(n * 1000, (n + 1) * 1000, JsonLines.of(rows), 0, {"s0": Position(seqs[-1], 0, str(seqs[-1]))})

    windows = [window(n) for n in range(1, 6)]

    async def committer() -> None:
        for i, w in enumerate(windows):
            if i + 1 < len(windows):
                sink.prepare(windows[i + 1])
            while True:
                try:
                    await sink.commit(w)
                    break
                except SparkError as exc:
                    assert retriable(exc)
                    await asyncio.sleep(0.1)

    def commits_under_way(w: Window, pid: int) -> bool:
        return (marks / f"{w.id}-{pid}").exists()

    await spark.start()
    try:
        await sink.start()
        task = asyncio.ensure_future(committer())
        pid = spark._proc.pid
        await eventually(lambda: commits_under_way(windows[0], pid), timeout=60, what="window 1 in Spark")
        # window 2's file is written while window 1 is still in Spark
        await eventually(lambda: (sink.inputs / f"{windows[1].id}.parquet").exists(), timeout=10,
                         what="window 2's file, prepared ahead")
        assert not CommitLog(out).path(windows[0].id).exists()
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: spark.state == "up" and spark._proc.pid != pid, timeout=90, what="a new Spark process")
        pid = spark._proc.pid
        await eventually(lambda: commits_under_way(windows[2], pid), timeout=60, what="window 3 in Spark")
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(task, 180)
    finally:
        await spark.stop()

    log = CommitLog(out)
    entries = [orjson.loads(log.path(w.id).read_bytes()) for w in windows]
    assert [e["window"] for e in sorted(entries, key=lambda e: e["committed_at"])] == [w.id for w in windows]
    assert sorted(p.name for p in log.directory.iterdir()) == sorted(f"{w.id}.json" for w in windows)
    counts = committed_rows(out)
    assert max(counts.values()) == 1
    assert set(counts) == {("s0", str(s)) for w in windows for s in range(w.start // 10, w.start // 10 + len(w))}
    assert [e["rows_out"] for e in entries] == [len(w) for w in windows]
    assert len([m for m in marks.iterdir() if m.name.startswith(windows[0].id)]) == 2  # killed, then again
    assert not any(sink.inputs.iterdir())  # every input file removed once its window committed


async def test_a_window_prepared_while_the_one_in_front_is_in_spark_has_its_file_written_at_once(tmp_path, monkeypatch):
    """A window that closes while another commits (the coordinator seals it then and
    calls ``prepare``) has its Spark input written while that one is in Spark, not
    after: the file is there before the window in front is committed."""
    from mldserver.spark.commitlog import CommitLog
    from mldserver.base.handoff import JsonLines, Window
    from mldserver.base.positions import Position

    spark, sink, marks, out = slow_sink(tmp_path, monkeypatch, 3)

    def window(n: int) -> Window:
        rows = [b'{"shard_id":"s0","sequence_number":"%d","n":%d}' % (n * 100 + i, n) for i in range(10)]
        return Window(n * 1000, (n + 1) * 1000, JsonLines.of(rows), 0, {"s0": Position(n * 100 + 9, 0, str(n * 100 + 9))})

    first, second = window(1), window(2)
    await spark.start()
    try:
        await sink.start()
        committing = asyncio.ensure_future(sink.commit(first))
        await eventually(lambda: any(marks.glob(f"{first.id}-*")), timeout=60, what="window 1 in Spark")
        sink.prepare(second)
        await eventually(lambda: (sink.inputs / f"{second.id}.parquet").exists(), timeout=10,
                         what="window 2's file, begun while window 1 is in Spark")
        assert not CommitLog(out).path(first.id).exists() and not committing.done()
        await asyncio.wait_for(committing, 60)
        await asyncio.wait_for(sink.commit(second), 60)
    finally:
        await spark.stop()
    assert committed_rows(out) == Counter({("s0", str(n * 100 + i)): 1 for n in (1, 2) for i in range(10)})


async def test_rows_parsed_as_they_arrive_are_committed_once_and_a_row_that_does_not_fit_is_dead_lettered(tmp_path):
    """The Spark sink told each batch's rows as the coordinator keeps them (a real
    ``Ordering``, two shards interleaving): a window's table is made from them, and
    Spark commits every row once, in merged order; a window with a row that does not
    fit the declared schema is parsed the usual way, that row dead-lettered, the rest
    committed."""
    import pyarrow.parquet as pq

    from mldserver.base.config import Settings
    from mldserver.base.deadletters import DeadLetters
    from mldserver.base.positions import Position
    from mldserver.coordinator.merge import seal
    from mldserver.coordinator.ordering import Ordering
    from mldserver.rows.batch import Item, RowBatch
    from mldserver.sinks.parquet import SparkSink
    from mldserver.spark.process import SparkProcess

    out = tmp_path / "out"
    settings = Settings(handler="x:y", state_dir=str(tmp_path / "state"), schema={"shard_id": "string", "n": "int64"})
    spark = SparkProcess(settings, sink_dir=out)
    sink = SparkSink(settings, spark, out, DeadLetters(tmp_path / "dead-letters"))
    ordering = Ordering(window_ms=60_000, blocks=lambda s, now: False, parents_of=lambda s: ())

    def arrive(shard_id: str, first: int, times: list[int], odd: bool = False) -> None:
        rows = RowBatch.of(Item(t, Position(first + i, 0, str(first + i)),
                                orjson.dumps({"shard_id": shard_id, "n": "odd" if odd and i == 0 else t}))
                           for i, t in enumerate(times))
        sink.arrived(ordering.add(shard_id, rows, rows.position(-1), now=0))

    await spark.start()
    try:
        await sink.start()
        arrive("s0", 1, [1_000, 20_000, 40_000, 61_000])
        arrive("s1", 1, [500, 30_000, 59_999, 70_000])
        [first] = ordering.close(until=60_000)
        window, _ = seal(first)
        await asyncio.wait_for(sink.commit(window), 120)
        arrive("s0", 5, [90_000, 100_000], odd=True)  # its first row's n is not an int64
        arrive("s1", 5, [121_000])
        [second] = ordering.close(until=120_000)
        window2, _ = seal(second)
        await asyncio.wait_for(sink.commit(window2), 120)
    finally:
        await spark.stop()
    assert sink.ahead.made == 1  # the first window from the tables made ahead; the second parsed as before
    [part] = (out / f"window={window.id}").glob("*.parquet")
    assert pq.read_table(part).to_pylist() == [
        {"shard_id": s, "n": t} for t, s in sorted([(500, "s1"), (1_000, "s0"), (20_000, "s0"), (30_000, "s1"),
                                                    (40_000, "s0"), (59_999, "s1")])]
    [part2] = (out / f"window={window2.id}").glob("*.parquet")
    assert pq.read_table(part2).to_pylist() == [{"shard_id": "s0", "n": 61_000}, {"shard_id": "s1", "n": 70_000},
                                                {"shard_id": "s0", "n": 100_000}]
    [letter] = [orjson.loads(line) for line in (tmp_path / "dead-letters" / "rows.jsonl").read_bytes().splitlines()]
    assert orjson.loads(letter["row"]) == {"shard_id": "s0", "n": "odd"} and letter["window"] == window2.id
