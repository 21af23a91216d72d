import json

import pytest

from mldserver.protocol import (
    Checkpoint,
    CheckpointReply,
    Dialect,
    Initialize,
    LeaseLost,
    ProcessRecords,
    RemoteProtocolError,
    Shutdown,
    Status,
    UnknownAction,
)
from mldserver.protocol.messages import decode, encode


def test_initialize_with_sentinels_and_nulls():
    ev = decode(b'{"action":"initialize","shardId":"s","sequenceNumber":null,"subSequenceNumber":null}')
    assert ev == Initialize("s", None, None, True)
    ev = decode(b'{"action":"initialize","shardId":"s","sequenceNumber":"AT_TIMESTAMP","subSequenceNumber":0}')
    assert ev.sequence_number == "AT_TIMESTAMP"


def test_initialize_without_sequence_key_is_the_v1_dialect():
    assert decode(b'{"action":"initialize","shardId":"s"}').has_sequence_key is False


def test_key_order_and_unknown_keys_do_not_matter():
    ev = decode(b'{"millisBehindLatest":5,"x":{"y":1},"records":[],"action":"processRecords"}')
    assert ev == ProcessRecords([], 5)


def test_checkpoint_reply_forms():
    assert decode(b'{"action":"checkpoint","sequenceNumber":"1","subSequenceNumber":2,"error":null}') == CheckpointReply("1", 2, None)
    assert decode(b'{"action":"checkpoint","sequenceNumber":"1"}') == CheckpointReply("1", None, None)
    assert decode(b'{"action":"checkpoint","checkpoint":"7","error":"ThrottlingException"}') == CheckpointReply("7", None, "ThrottlingException")


def test_shutdown_reasons_and_unknown_actions():
    assert decode(b'{"action":"shutdown","reason":"TERMINATE"}').is_shard_end
    assert not decode(b'{"action":"shutdown","reason":"ZOMBIE"}').is_shard_end
    assert decode(b'{"action":"leaseLost"}') == LeaseLost()
    ev = decode(b'{"action":"somethingNew"}')
    assert isinstance(ev, UnknownAction) and ev.reply() == Status("somethingNew")


@pytest.mark.parametrize(
    "line, action",
    [
        (b"not json", None),
        (b"null", None),
        (b"[1,2]", None),
        (b'{"no":"action"}', None),
        (b'{"action":"processRecords","records":{"a":1}}', "processRecords"),
        (b'{"action":"initialize","shardId":"s","sequenceNumber":1.5}', "initialize"),
    ],
)
def test_malformed_lines_raise_remote_errors_naming_the_action(line, action):
    with pytest.raises(RemoteProtocolError) as info:
        decode(line)
    assert info.value.action == action
    assert info.value.line == line


def test_invalid_utf8_is_decoded_tolerantly():
    ev = decode(b'{"action":"initialize","shardId":"s\xff","sequenceNumber":null}')
    assert ev.shard_id == "s\ufffd"


def test_outgoing_messages_have_exactly_the_daemon_keys():
    status = json.loads(encode(Status("processRecords"), Dialect.SEQUENCE))
    assert status == {"action": "status", "responseFor": "processRecords"}
    cp = json.loads(encode(Checkpoint("12", 3), Dialect.SEQUENCE))
    assert cp == {"action": "checkpoint", "sequenceNumber": "12", "subSequenceNumber": 3}
    assert json.loads(encode(Checkpoint(None, None), Dialect.SEQUENCE))["sequenceNumber"] is None
    assert json.loads(encode(Checkpoint("12", 3), Dialect.V1)) == {"action": "checkpoint", "checkpoint": "12"}


def test_outgoing_is_ascii_one_line():
    data = encode(Status("caf\u00e9\u2028"), Dialect.SEQUENCE)
    assert data.isascii() and data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data)["responseFor"] == "caf\u00e9\u2028"
