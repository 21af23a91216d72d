"""The DynamoDB Streams adapter's record form (``mldserver.protocol.dynamodb_records``):
a change as boto3 parses it and the same change as the service sent it (a raw
client's page: binary as base64, times as epoch seconds) make the same record."""

from __future__ import annotations

import base64
from datetime import datetime, timezone

from mldserver.protocol.dynamodb_records import adapter_change, dynamodb_record

PARSED = {
    "eventID": "4bc5", "eventName": "MODIFY", "eventVersion": "1.1", "eventSource": "aws:dynamodb",
    "awsRegion": "us-east-1",
    "dynamodb": {"ApproximateCreationDateTime": datetime(2026, 1, 30, 10, 0, 1, tzinfo=timezone.utc),
                 "Keys": {"id": {"S": "o-17"}},
                 "NewImage": {"id": {"S": "o-17"}, "raw": {"B": b"\x00\xff"}, "set": {"BS": [b"\x01", b"\x02"]},
                              "m": {"M": {"l": {"L": [{"B": b"\x03"}, {"N": "1.5"}, {"NULL": True}]}}}},
                 "OldImage": {"id": {"S": "o-17"}, "raw": {"B": b""}},
                 "SequenceNumber": "000000000000000000002", "SizeBytes": 24, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    "userIdentity": {"PrincipalId": "dynamodb.amazonaws.com", "Type": "Service"},
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


AS_SENT = dict(PARSED, dynamodb=dict(
    PARSED["dynamodb"], ApproximateCreationDateTime=1769767201.0,
    NewImage={"id": {"S": "o-17"}, "raw": {"B": b64(b"\x00\xff")}, "set": {"BS": [b64(b"\x01"), b64(b"\x02")]},
              "m": {"M": {"l": {"L": [{"B": b64(b"\x03")}, {"N": "1.5"}, {"NULL": True}]}}}},
    OldImage={"id": {"S": "o-17"}, "raw": {"B": ""}}))


def test_a_change_as_sent_makes_the_record_a_parsed_one_makes():
    parsed = adapter_change(PARSED)
    assert parsed["dynamodb"]["NewImage"]["raw"] == {"B": "AP8="}
    assert parsed["dynamodb"]["ApproximateCreationDateTime"] == 1769767201000
    assert adapter_change(AS_SENT, as_sent=True) == parsed
    assert adapter_change(AS_SENT) == parsed  # (walked, base64 text stays as it is)
    assert dynamodb_record(adapter_change(AS_SENT, as_sent=True)) == dynamodb_record(parsed)


def test_as_sent_takes_the_images_as_they_are():
    change = adapter_change(AS_SENT, as_sent=True)
    assert change["dynamodb"]["NewImage"] is AS_SENT["dynamodb"]["NewImage"]  # not copied value by value
