"""The AWS clients of the server, from one place: the timer store and the table
bindings (DynamoDB), and the shard lineage (Kinesis, DynamoDB Streams) all open
theirs here, with the usual AWS configuration (``AWS_ENDPOINT_URL_DYNAMODB`` or
``AWS_ENDPOINT_URL`` for a local endpoint, ``AWS_REGION``, the credential chain)::

    async with client("dynamodb", region="eu-west-1") as dynamodb:
        await dynamodb.get_item(TableName="orders", Key={"id": {"S": "7"}})

aioboto3 is imported on the first call: a server that uses none of these pays nothing.
"""

from __future__ import annotations

import os
from typing import Any

CONNECTIONS = 32  # requests in flight per client (the timer store keeps this many)


def client(service: str, region: str | None = None, *, connections: int = CONNECTIONS,
           endpoint_url: str | None = None, raw: bool = False) -> Any:
    """An aioboto3 client for ``service`` (an async context manager): ``region`` or
    ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``), standard retries, ``connections``
    requests at a time; ``endpoint_url`` overrides the configured endpoint.

    ``raw``: blobs stay the base64 text the service sent and timestamps its epoch
    seconds (botocore's own parsers decode every blob and make a datetime of every
    timestamp, most of the CPU a page of 10,000 Kinesis records costs; the daemon
    protocol wants base64 and milliseconds)::

        page = await kinesis.get_records(ShardIterator=it)   # with raw=True
        page["Records"][0]["Data"], page["Records"][0]["ApproximateArrivalTimestamp"]
        # ('aGVsbG8=', 1769767200.123)
    """
    import aioboto3
    from botocore.config import Config

    session = aioboto3.Session()
    if raw:
        session._session.get_component("response_parser_factory").set_parser_defaults(
            blob_parser=_as_sent, timestamp_parser=_as_sent)
    return session.client(
        service, region_name=region or os.environ.get("AWS_REGION"), endpoint_url=endpoint_url,
        config=Config(max_pool_connections=connections, retries={"mode": "standard", "max_attempts": 5}))


def _as_sent(value: Any) -> Any:
    return value
