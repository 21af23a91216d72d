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
           endpoint_url: str | None = None) -> Any:
    """An aioboto3 client for ``service`` (an async context manager): ``region`` or
    ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``), standard retries, ``connections``
    requests at a time; ``endpoint_url`` overrides the configured endpoint."""
    import aioboto3
    from botocore.config import Config

    return aioboto3.Session().client(
        service, region_name=region or os.environ.get("AWS_REGION"), endpoint_url=endpoint_url,
        config=Config(max_pool_connections=connections, retries={"mode": "standard", "max_attempts": 5}))
