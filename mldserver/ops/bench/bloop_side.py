"""Bloop's side of ``bench --part stream``, a script run in its own process with Bloop's
folder first on ``PYTHONPATH`` (its botocore, older than the server's): one read of the
table's stream from its trim horizon to its head, every change's new and old images
made model instances, and one JSON line of what it cost::

    python bloop_side.py http://127.0.0.1:8000 orders
    {"changes": 3000, "cpu_us": 150.2, "wall_s": 0.56}

It imports only Bloop, boto3 and the standard library, and those only when run (the
package's doctest collection imports it too). The head: Bloop's ``next()``
returns None when no shard has a record ready; three in a row end the read, as
``open_stream`` ends at DynamoDB's head.
"""

import json
import sys
import time


def main(endpoint: str, table: str) -> None:
    import boto3  # (Bloop's botocore, from its folder: imported only when run, never by the server's package)
    from bloop import BaseModel, Column, DynamicList, DynamicMap, Engine, Number, Set, String

    class Order(BaseModel):
        class Meta:
            table_name = table
            stream = {"include": ["new", "old"]}

        id = Column(String, hash_key=True)
        customer = Column(String)
        amount = Column(Number)
        version = Column(Number)
        note = Column(String)
        tags = Column(Set(String))
        lines = Column(DynamicList)
        address = Column(DynamicMap)

    wall, cpu = time.perf_counter(), time.process_time()
    local = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local",
                 aws_secret_access_key="local")
    dynamodb = boto3.client("dynamodb", **local)
    engine = Engine(dynamodb=dynamodb, dynamodbstreams=boto3.client("dynamodbstreams", **local))
    # (bind's table check calls DescribeContinuousBackups, which DynamoDB Local lacks: the
    # stream's ARN is set as bind would have found it)
    engine.bind(Order, skip_table_setup=True)
    Order.Meta.stream["arn"] = dynamodb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    stream = engine.stream(Order, "trim_horizon")
    changes = empty = 0
    while empty < 3:
        record = next(stream)
        if record is None:
            empty += 1
            continue
        record["new"], record["old"]
        changes, empty = changes + 1, 0
    print(json.dumps({"changes": changes, "cpu_us": (time.process_time() - cpu) / max(changes, 1) * 1e6,
                      "wall_s": time.perf_counter() - wall}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
