"""The AWS clients of the server, from one place: the timer store and the table
bindings (DynamoDB), and the shard lineage (Kinesis, DynamoDB Streams) all open
theirs here, with the usual AWS configuration (``AWS_ENDPOINT_URL_DYNAMODB`` or
``AWS_ENDPOINT_URL`` for a local endpoint, ``AWS_REGION``, the credential chain)::

    async with client("dynamodb", region="eu-west-1") as dynamodb:
        await dynamodb.get_item(TableName="orders", Key={"id": {"S": "7"}})

aioboto3 is imported on the first call: a server that uses none of these pays nothing.
Every client of the process shares one loader of botocore's service models (a client of
a new session would read and parse them again: some 80 ms of CPU, once per client
``mldserver.open_stream`` opens).
"""

from __future__ import annotations

import os
from typing import Any

import orjson

CONNECTIONS = 32  # requests in flight per client (the timer store keeps this many)


def client(service: str, region: str | None = None, *, connections: int = CONNECTIONS,
           endpoint_url: str | None = None, raw: bool = False) -> Any:
    """An aioboto3 client for ``service`` (an async context manager): ``region`` or
    ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``), standard retries, ``connections``
    requests at a time; ``endpoint_url`` overrides the configured endpoint.

    ``raw``: blobs stay the base64 text the service sent and timestamps its epoch
    seconds (botocore's own parsers decode every blob and make a datetime of every
    timestamp, most of the CPU a page of 10,000 Kinesis records costs; the daemon
    protocol wants base64 and milliseconds), and a page of records (``GetRecords``,
    Kinesis and DynamoDB Streams) is parsed by orjson, not walked shape by shape by
    botocore (a third of the CPU ``open_stream`` spends on a DynamoDB change: these
    services' JSON names its fields as their shapes do, so the two parse alike, but
    that a field sent as null is there as None)::

        page = await kinesis.get_records(ShardIterator=it)   # with raw=True
        page["Records"][0]["Data"], page["Records"][0]["ApproximateArrivalTimestamp"]
        # ('aGVsbG8=', 1769767200.123)
    """
    import aioboto3
    from botocore.config import Config

    session = aioboto3.Session()
    _share_models(session._session)
    if raw:
        session._session.get_component("response_parser_factory").set_parser_defaults(
            blob_parser=_as_sent, timestamp_parser=_as_sent)
        for event in RAW_PAGES:
            session._session.register(event, _page_as_sent)
    return session.client(
        service, region_name=region or os.environ.get("AWS_REGION"), endpoint_url=endpoint_url,
        config=Config(max_pool_connections=connections, retries={"mode": "standard", "max_attempts": 5}))


RAW_PAGES = ("before-parse.kinesis.GetRecords", "before-parse.dynamodb-streams.GetRecords")
_LOADER: Any = None  # botocore's loader of service models, shared by every session of the process


def _share_models(session: Any) -> None:
    global _LOADER
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)


def _as_sent(value: Any) -> Any:
    return value


def _page_as_sent(response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any) -> None:
    """A page's body parsed here, what botocore parses left empty (its answer is ours
    merged into the response metadata it adds); an error, or a body that is not a
    JSON object, is left to botocore's parser, which says what is wrong."""
    body = response_dict.get("body")
    if response_dict.get("status_code") != 200 or not isinstance(body, (bytes, bytearray)):
        return
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(page, dict):
        customized_response_dict.update(page)
        response_dict["body"] = b"{}"
