"""DynamoDB stream records as the KCL's DynamoDB Streams adapter hands them to the
MultiLangDaemon, from the Streams API's own (``GetRecords``, as boto3 or aioboto3
return them: binary as bytes, times as datetime; or as the service sent them: base64 and
epoch seconds, as the source reader's client keeps them). The source reader
(``mldserver.sources``) feeds a shard's pages to the server in this form, and the fake
daemon's tests build theirs with it, so a ``ChangeHandler`` sees one format whoever
read the stream::

    api = {"eventID": "4bc5", "eventName": "INSERT", "eventSource": "aws:dynamodb",
           "dynamodb": {"ApproximateCreationDateTime": datetime(2026, 1, 30, tzinfo=UTC),
                        "Keys": {"id": {"S": "o-17"}}, "NewImage": {"raw": {"B": b"\\x00"}},
                        "SequenceNumber": "000000000000000000002", "SizeBytes": 24,
                        "StreamViewType": "NEW_AND_OLD_IMAGES"}}
    change = adapter_change(api)
    # {"eventID": "4bc5", ..., "dynamodb": {"ApproximateCreationDateTime": 1769731200000,
    #   "Keys": {"id": {"S": "o-17"}}, "NewImage": {"raw": {"B": "AA=="}}, ...}}
    dynamodb_record(change)
    # {"action": "record", "data": "<base64 of the change's JSON>", "partitionKey": "000000000000000000002",
    #  "sequenceNumber": "000000000000000000002", "subSequenceNumber": 0,
    #  "approximateArrivalTimestamp": 1769731200000}
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

def adapter_change(api_record: dict[str, Any], *, as_sent: bool = False) -> dict[str, Any]:
    """A DynamoDB Streams API ``Record`` (as boto3's ``dynamodbstreams`` client returns
    it from ``get_records``: binary as bytes, times as datetime) as the KCL's DynamoDB
    Streams adapter writes it into a record's data (its ``RecordObjectMapper``): binary
    as base64, ``ApproximateCreationDateTime`` as epoch milliseconds, ``userIdentity``
    as ``principalId`` and ``type``; absent fields left out. ``as_sent``: the record is
    as the service sent it (a raw client's: binary already base64), so its images are
    taken as they are, not walked value by value (the same dicts, not copies)."""
    out: dict[str, Any] = {}
    for key in ("awsRegion", "eventID", "eventName", "eventSource", "eventVersion"):
        if api_record.get(key) is not None:
            out[key] = api_record[key]
    stream = api_record.get("dynamodb")
    if stream is not None:
        change: dict[str, Any] = {}
        created = stream.get("ApproximateCreationDateTime")
        if created is not None:
            seconds = created.timestamp() if hasattr(created, "timestamp") else float(created)
            change["ApproximateCreationDateTime"] = round(seconds * 1000)
        for key in ("Keys", "NewImage", "OldImage"):
            image = stream.get(key)
            if image is not None:
                change[key] = image if as_sent else {name: _adapter_value(v) for name, v in image.items()}
        for key in ("SequenceNumber", "SizeBytes", "StreamViewType"):
            if stream.get(key) is not None:
                change[key] = stream[key]
        out["dynamodb"] = change
    who = api_record.get("userIdentity")
    if who is not None:
        out["userIdentity"] = {k: v for k, v in (("principalId", who.get("PrincipalId", who.get("principalId"))),
                                                  ("type", who.get("Type", who.get("type")))) if v is not None}
    return out


def _adapter_value(av: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for tag, v in av.items():
        if tag == "B":
            v = base64.b64encode(v).decode("ascii") if isinstance(v, (bytes, bytearray)) else v
        elif tag == "BS":
            v = [base64.b64encode(b).decode("ascii") if isinstance(b, (bytes, bytearray)) else b for b in v]
        elif tag == "M":
            v = {k: _adapter_value(x) for k, x in v.items()}
        elif tag == "L":
            v = [_adapter_value(x) for x in v]
        out[tag] = v
    return out


def dynamodb_record(change: dict[str, Any], *, v1: bool = False) -> dict[str, Any]:
    """The daemon's record for one DynamoDB stream change (``adapter_change``'s form):
    what the KCL 3.x adapter hands the MultiLangDaemon (``partitionKey`` is the stream
    sequence number; with ``v1``, the KCL 1.x adapter's null), the data the change's
    JSON, ``approximateArrivalTimestamp`` its creation time."""
    stream = change.get("dynamodb") or {}
    seq = stream.get("SequenceNumber")
    return {
        "action": "record",
        "data": base64.b64encode(orjson.dumps(change)).decode("ascii"),
        "partitionKey": None if v1 else seq,
        "sequenceNumber": seq,
        "subSequenceNumber": 0,
        "approximateArrivalTimestamp": stream.get("ApproximateCreationDateTime"),
    }
