"""The README's handler, as written there, served by ``mldserver serve``: its orders
become rows in a committed window, and a record it cannot read is dead-lettered alone
(``batch.fail``) while the batch goes on."""

from __future__ import annotations

import base64
import json
import os
import re

from mldserver.api.testing import FakeDaemon, make_records

from .harness import ROOT, ServerProcess, eventually, relay_command


def readme_handler() -> str:
    """The first python block under ``## A handler`` in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A handler"):]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


async def test_the_readmes_handler_emits_each_order_and_fails_only_the_record_it_cannot_read(tmp_path):
    (tmp_path / "readme_orders.py").write_text(readme_handler())
    out = tmp_path / "windows"
    server = ServerProcess("readme_orders:Orders", tmp_path, "--sink", f"file:{out}", "--window", "60",
                           env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"})
    try:
        orders = {1: b'{"customer": "c-7", "amount": 12.5}', 2: b"not json", 3: b'{"customer": "c-9"}',
                  4: b'{"customer": "c-7", "amount": 3}'}
        daemon = FakeDaemon(relay_command(server.port))
        shard = await daemon.shard("shardId-000000000000")
        await shard.process_records(make_records(1, 4, data=orders.__getitem__), millis_behind_latest=0)
        letters = tmp_path / "state" / "dead-letters" / "shardId-000000000000.jsonl"
        failed = [json.loads(line) for line in letters.read_text().splitlines()]  # written before the status
        assert [(f["sequence_number"], f["reason"]) for f in failed] == [("2", "record failed"), ("3", "record failed")]
        assert failed[0]["error"].startswith("JSONDecodeError: ") and failed[1]["error"] == "KeyError: 'amount'"
        assert base64.b64decode(failed[0]["data"]) == b"not json"  # kept with its data, for a redrive
        # One call did it: the batch never failed, so the server had nothing to retry or bisect.
        events = [json.loads(line)["event"] for line in server.log_path.read_text().splitlines()]
        assert "record_failed" in events or "dead_lettered" in events, events
        assert not {"handler_failed", "batch_bisected"} & set(events), events
        # The window closes once the wall clock passes it (the shard is caught up): the two good orders.
        committed = await eventually(lambda: list(out.glob("*.jsonl")), 30, what="a committed window")
        rows = [json.loads(line) for line in committed[0].read_text().splitlines()]
        assert [{k: r[k] for k in ("customer", "amount")} for r in rows] == [
            {"customer": "c-7", "amount": 12.5}, {"customer": "c-7", "amount": 3}]
        await shard.close()
        await daemon.close()
    finally:
        server.stop()
