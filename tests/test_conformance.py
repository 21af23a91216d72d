"""Every scenario of tests/data/conformance/scenarios.json, through the real relay
(spawned as the daemon spawns it) against the real server (``mldserver serve``)."""

from __future__ import annotations

import base64
import json

import pytest

from mldserver.api.testing import CHECKPOINT_KEYS, STATUS_KEYS, Child

from .conftest import DATA
from .handlers import HANDLER_KINDS
from .harness import relay_command

SCENARIOS = json.loads((DATA / "conformance" / "scenarios.json").read_text())["scenarios"]


def generated_line(spec: dict) -> bytes:
    first = int(spec["first_sequence_number"])
    data = base64.b64encode(b"x" * spec["data_bytes"]).decode()
    records = [
        {
            "action": "record",
            "data": data,
            "partitionKey": spec["partition_key"].format(i=i),
            "sequenceNumber": str(first + i),
            "subSequenceNumber": 0,
            "approximateArrivalTimestamp": spec.get("approximate_arrival_timestamp"),
        }
        for i in range(spec["records"])
    ]
    message = {"action": "processRecords", "records": records, "millisBehindLatest": 0}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def normalise(message: dict) -> dict:
    if message.get("action") == "checkpoint":
        return {"action": "checkpoint", "sequenceNumber": message.get("sequenceNumber"),
                "subSequenceNumber": message.get("subSequenceNumber")}
    return message


async def expect(child: Child, expected: dict) -> None:
    line = await child.read_line(timeout=10)
    assert line is not None, f"the child's output ended; expected {expected}"
    message = json.loads(line)
    assert isinstance(message, dict), line
    allowed = STATUS_KEYS if message.get("action") == "status" else CHECKPOINT_KEYS
    assert set(message) <= allowed and (message.get("action") != "status" or set(message) == STATUS_KEYS), (
        f"keys the daemon does not accept: {line!r}"
    )
    assert line.isascii()
    assert normalise(message) == normalise(expected)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from .harness import ServerProcess

    started: dict[str, ServerProcess] = {}
    tmp = tmp_path_factory.mktemp("conformance")

    def get(kind: str) -> ServerProcess:
        if kind not in started:
            started[kind] = ServerProcess(HANDLER_KINDS[kind], tmp)
        return started[kind]

    yield get
    for server in started.values():
        server.stop()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
async def test_scenario(scenario, servers):
    server = servers(scenario["handler"])
    child = await Child.spawn(relay_command(server.port))
    try:
        for step in scenario["steps"]:
            kind = step[0]
            if kind == "send":
                await child.send(step[1])
            elif kind == "send_raw":
                await child.write(step[1].encode("utf-8"))
            elif kind == "send_generated":
                await child.write(generated_line(step[1]))
            elif kind == "expect":
                await expect(child, step[1])
            elif kind == "close_stdin":
                await child.close_stdin()
            elif kind == "expect_exit":
                assert await child.read_line(timeout=5) is None, "the child wrote more before exiting"
                assert await child.wait_exit(5) == 0
            else:
                raise AssertionError(f"unknown step {kind}")
    finally:
        await child.kill()
    assert not child.stderr, child.stderr.decode()
    errors = [e for e in server.events() if e["level"] == "error" and e["event"] == "driver_crashed"]
    assert not errors
