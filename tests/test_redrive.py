"""``mldserver redrive`` as an operator runs it: a ``mldserver serve`` process with a
file sink, whose handler fails on one record of a batch of 200 until a fix is deployed
(``mldserver reload``); the redrive, run through the CLI, sends the dead letter
through the current handler into the sink and removes it, or reports it failed again
and keeps it; a token-guarded endpoint refuses it without the token, changing nothing;
and the dead-letter files' part of it (which entries are redrivable, a removal that
keeps what was appended meanwhile) on plain objects."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import orjson

from mldserver.api.testing import FakeDaemon, make_records
from mldserver.base.deadletters import DeadLetters, redrivable
from mldserver.server.redrive import read_letters

from .harness import MLDSERVER, ROOT, eventually, relay_command

SHARD = "shardId-000000000001"
N, POISON = 200, 57
TOKEN = "0123456789abcdef0123456789abcdef"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLDSERVER, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)


def config(tmp_path: Path, **extra: str) -> Path:
    """Windows of a second, a shard idle after one: rows are committed within seconds."""
    lines = ["window = 1.0", "watermark_margin = 0.5", "idle_timeout = 1.0", "handler_retries = 1",
             "handler_backoff = 0.01", *(f'{k} = "{v}"' for k, v in extra.items())]
    path = tmp_path / "mldserver.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("[!_]*.jsonl")) for line in f.read_text().splitlines()]


def letters(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "dead-letters" / f"{SHARD}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def batch(poisoned: dict[int, str]) -> list[dict]:
    records = make_records(1000, N)
    for i, key in poisoned.items():
        records[i]["partitionKey"] = key
    return records


async def test_a_dead_letter_fails_again_until_the_fix_is_reloaded_then_is_redriven_into_the_sink(serve, tmp_path):
    out, fix, state = tmp_path / "out", tmp_path / "fixed", str(tmp_path / "state")
    server = serve("tests.redrive_handlers:FailPoison", "--sink", f"file:{out}", "--config", str(config(tmp_path)),
                   env={"MLDSERVER_TEST_FIX": str(fix)})
    admin = await eventually(lambda: server.admin_url, what="admin_listening logged")
    daemon = FakeDaemon(relay_command(server.port))
    shard = await daemon.shard(SHARD)
    sent = batch({POISON: "poison"})
    await shard.process_records(sent, millis_behind_latest=0)
    more = make_records(5000, 2)
    more[0]["sequenceNumber"] = "5000x"  # malformed: dead-lettered, never redrivable
    await shard.process_records(more, millis_behind_latest=0)
    await eventually(lambda: len(rows(out)) == N - 1 + 1, timeout=60, what="199 rows committed, and 5001's")
    [letter, malformed] = letters(tmp_path)
    assert (letter["reason"], letter["sequence_number"], letter["data"]) == \
        ("record failed", sent[POISON]["sequenceNumber"], sent[POISON]["data"])
    assert malformed["reason"] == "malformed records"
    file = tmp_path / "state" / "dead-letters" / f"{SHARD}.jsonl"
    before = file.read_bytes()

    # not fixed yet: the record fails again, is named, and its dead letter stays as it was
    done = await asyncio.to_thread(cli, "redrive", "--admin", admin, "--state-dir", state, "--timeout", "60")
    assert done.returncode == 1, done.stderr
    assert done.stdout == "redriven 0, failed again 1, left 1\n"
    assert done.stderr == f"mldserver redrive: failed again: {SHARD} 1057:0 ValueError: cannot take poison 1057\n"
    assert file.read_bytes() == before and len(rows(out)) == N

    # the fix deployed, the handler reloaded: the record's row is committed, its dead letter removed
    fix.touch()
    assert cli("reload", "--admin", admin).returncode == 0
    done = await asyncio.to_thread(cli, "redrive", "--admin", admin, "--state-dir", state, "--timeout", "60")
    assert (done.returncode, done.stdout, done.stderr) == (0, "redriven 1, failed again 0, left 1\n", "")
    assert letters(tmp_path) == [malformed]  # the one no fix can redrive is left
    committed = rows(out)
    assert sorted(int(r["seq"]) for r in committed) == [*range(1000, 1000 + N), 5001]  # each record once
    [redriven] = [r for r in committed if r["seq"] == "1057"]
    assert redriven["fixed"] is True and redriven["shard"].startswith("redrive-")
    assert redriven["shard"].endswith(f":{SHARD}")
    events = server.events()
    [event] = [e for e in events if e["event"] == "redriven"]
    assert (event["shard_id"], event["records"], event["dead_letters"], event["redrive_shard"]) == \
        (SHARD, 1, 1, redriven["shard"])
    started = max(i for i, e in enumerate(events) if e["event"] == "redrive_started")
    assert any(e["event"] == "window_committed" for e in events[started:events.index(event)])  # removed once committed

    # nothing left to redrive: nothing happens, exit 0
    done = await asyncio.to_thread(cli, "redrive", "--admin", admin, "--state-dir", state, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["redriven"] == 0
    await shard.shutdown_requested()  # the server checkpoints what is committed of the shard: its own rows only
    assert daemon.checkpoints[SHARD] == ("5001", 0)
    await shard.lease_lost()
    assert await shard.close() == 0


async def test_a_guarded_endpoint_refuses_a_redrive_without_its_token_and_nothing_changes(serve, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    wrong = tmp_path / "wrong"
    wrong.write_text("f" * 32 + "\n")
    out, state = tmp_path / "out", str(tmp_path / "state")
    settings = config(tmp_path, sink=f"file:{out}", admin_token_file=str(token_file))  # the token: in the config
    server = serve("tests.redrive_handlers:FailPoison", "--config", str(settings),
                   env={"MLDSERVER_TEST_FIX": str(tmp_path / "fixed")})
    admin = await eventually(lambda: server.admin_url, what="admin_listening logged")
    daemon = FakeDaemon(relay_command(server.port))
    shard = await daemon.shard(SHARD)
    await shard.process_records(batch({3: "doomed"}), millis_behind_latest=0)
    await eventually(lambda: len(rows(out)) == N - 1, timeout=60, what="199 rows committed")
    file = tmp_path / "state" / "dead-letters" / f"{SHARD}.jsonl"
    before = file.read_bytes()

    done = await asyncio.to_thread(cli, "redrive", "--admin", admin, "--state-dir", state)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "mldserver redrive: the admin endpoint needs its token, and none was found: pass " \
                          "--state-dir DIR (the server's, where it wrote admin-token) or --admin-token-file FILE\n"
    done = await asyncio.to_thread(cli, "redrive", "--admin", admin, "--admin-token-file", str(wrong))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"refused the token in {wrong}" in done.stderr
    assert file.read_bytes() == before
    assert not [e for e in server.events() if e["event"] == "redrive_started"]

    # the token from the server's own config (--config): it runs; the record fails again, kept
    done = await asyncio.to_thread(cli, "redrive", "--admin", admin, "--config", str(settings))
    assert (done.returncode, done.stdout) == (1, "redriven 0, failed again 1, left 0\n"), done.stderr
    assert "ValueError: cannot take doomed 1003" in done.stderr
    assert file.read_bytes() == before
    await shard.lease_lost()
    assert await shard.close() == 0


def test_with_no_server_the_redrive_is_one_line_and_exit_2(tmp_path):
    done = cli("redrive", "--admin", "127.0.0.1:9", "--state-dir", str(tmp_path))  # the discard port
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("mldserver redrive: no mldserver admin endpoint answers at http://127.0.0.1:9/")
    assert "Traceback" not in done.stderr


# -- the dead-letter files' part, on plain objects ----------------------------------------

def entry(seq: str, reason: str = "record failed", **extra) -> dict:
    return {"ts": "2026-11-21T10:00:00.123Z", "shard_id": SHARD, "reason": reason, "error": "ValueError: x",
            "sequence_number": seq, "sub_sequence_number": 0, "partition_key": "k", "data": "bWVvdw==", **extra}


def test_only_records_with_data_a_position_and_a_curable_reason_are_redrivable():
    assert redrivable(entry("7")) == (7, 0, "7")
    assert redrivable(entry("7", "bad row")) == (7, 0, "7")
    assert redrivable(entry("7", "malformed records")) is None
    assert redrivable(entry("7", "invalid KPL aggregate")) is None
    assert redrivable(entry("7", data=None, value=[1])) is None  # not an object: the handler never had it
    assert redrivable(entry("7x")) is None
    assert redrivable({"ts": "...", "shard_id": SHARD, "reason": "bad line", "line": "{"}) is None


def test_read_letters_groups_a_shards_records_by_position_and_counts_the_rest(tmp_path):
    shard = tmp_path / f"{SHARD}.jsonl"
    lines = [entry("9"), entry("7"), entry("9", ts="later"), entry("8", "malformed records")]
    shard.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines) + b'{"torn')
    (tmp_path / "rows.jsonl").write_text('{"row":"{}"}\n{"row":"{}"}\n')
    [found], others = read_letters([shard], [tmp_path / "rows.jsonl"])
    assert others == 2 + 1 + 1  # rows, the malformed record, the torn line
    assert [p.text for p in sorted(found.entries)] == ["7", "9"] and len(found.lines[(9, 0, "9")]) == 2
    assert [r["sequenceNumber"] for r in found.records(123)] == ["7", "9"]
    assert found.records(123)[0]["approximateArrivalTimestamp"] == 123


async def test_a_removal_keeps_the_lines_appended_meanwhile_and_deletes_an_emptied_file(tmp_path):
    dead = DeadLetters(tmp_path)
    await dead.records(SHARD, [{"sequenceNumber": "1", "data": "YQ=="}, {"sequenceNumber": "2", "data": "Yg=="}],
                       "record failed", "ValueError: x")
    path = dead.path_for(SHARD)
    first, second = path.read_bytes().splitlines()
    removing = asyncio.ensure_future(dead.remove(path, {first}))
    appending = asyncio.ensure_future(dead.records(SHARD, [{"sequenceNumber": "3", "data": "Yw=="}],
                                                   "record failed", "ValueError: y"))
    assert await removing == 1
    await appending
    assert [json.loads(line)["sequence_number"] for line in path.read_bytes().splitlines()] == ["2", "3"]
    assert await dead.remove(path, {first}) == 0  # gone already
    assert await dead.remove(path, set(path.read_bytes().splitlines())) == 2
    assert not path.exists()
