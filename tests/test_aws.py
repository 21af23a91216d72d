"""The AWS clients' shared pieces (``mldserver.base.aws``): a page of records parsed
by orjson is what botocore's own parser makes of the same body."""

from __future__ import annotations

import botocore.session
import orjson
import pytest
from botocore.parsers import JSONParser

from mldserver.base import aws

KINESIS_PAGE = {
    "Records": [
        {"SequenceNumber": "49590338271490256608559692538361571095921575989136588898",
         "ApproximateArrivalTimestamp": 1769767200.123, "Data": "aGVsbG8=", "PartitionKey": "k",
         "EncryptionType": "NONE"},
        {"SequenceNumber": "49590338271490256608559692538361571095921575989136588899",
         "ApproximateArrivalTimestamp": 1769767201, "Data": "", "PartitionKey": "k2"},
    ],
    "NextShardIterator": "AAAAAAAAAAE=", "MillisBehindLatest": 0,
    "ChildShards": [{"ShardId": "shardId-000000000002", "ParentShards": ["shardId-000000000000"],
                     "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "170141183460469231731687303715884105727"}}],
}
DYNAMODB_PAGE = {
    "Records": [
        {"eventID": "1", "eventName": "MODIFY", "eventVersion": "1.1", "eventSource": "aws:dynamodb",
         "awsRegion": "us-east-1",
         "dynamodb": {"ApproximateCreationDateTime": 1769767200, "SequenceNumber": "000000000000000000017",
                      "SizeBytes": 59, "StreamViewType": "NEW_AND_OLD_IMAGES",
                      "Keys": {"id": {"S": "7"}},
                      "NewImage": {"id": {"S": "7"}, "n": {"N": "1.5"}, "b": {"B": "AAE="}, "bs": {"BS": ["AAE=", "Ag=="]},
                                   "m": {"M": {"l": {"L": [{"NULL": True}, {"BOOL": False}, {"SS": ["a"]}]}}}},
                      "OldImage": {"id": {"S": "7"}}},
         "userIdentity": {"PrincipalId": "dynamodb.amazonaws.com", "Type": "Service"}},
    ],
    "NextShardIterator": None,
}


@pytest.mark.parametrize("service, page", [("kinesis", KINESIS_PAGE), ("dynamodbstreams", DYNAMODB_PAGE)])
def test_a_page_parsed_by_orjson_is_what_botocore_makes_of_it(service, page):
    body = orjson.dumps(page)
    shape = botocore.session.get_session().get_service_model(service).operation_model("GetRecords").output_shape
    parser = JSONParser(timestamp_parser=aws._as_sent, blob_parser=aws._as_sent)  # a raw client's botocore parse
    botocores = parser.parse({"status_code": 200, "headers": {}, "body": body, "context": {}}, shape)
    response = {"status_code": 200, "headers": {}, "body": body}
    ours: dict = {}
    aws._page_as_sent(response, ours)
    assert response["body"] == b"{}"  # what botocore's parser is left with
    botocores.pop("ResponseMetadata")
    # the same but for a field sent as null (botocore leaves it out, ours keeps it as None)
    assert ours == dict(botocores, NextShardIterator=page["NextShardIterator"])


def test_an_error_or_a_body_that_is_no_object_is_left_to_botocore():
    for status, body in ((400, b'{"__type": "ExpiredIteratorException"}'), (200, b"not json"), (200, b"[1]")):
        response = {"status_code": status, "headers": {}, "body": body}
        ours: dict = {}
        aws._page_as_sent(response, ours)
        assert ours == {} and response["body"] == body


def test_raw_clients_parse_their_pages_themselves():
    # (registered for the pages of both services, by the event names botocore emits)
    session = botocore.session.get_session()
    for service in ("kinesis", "dynamodbstreams"):
        service_id = session.get_service_model(service).service_id.hyphenize()
        assert f"before-parse.{service_id}.GetRecords" in aws.RAW_PAGES
