"""``mldserver local``: kinesis-local and DynamoDB Local on loopback, a stream (and a
table with its stream on, if asked), and the daemon's properties file pointed at them,
to try ``mldserver run`` (or ``serve --source``) on one machine with no AWS account::

    $ mldserver local                                  # stream orders, 2 shards; Ctrl-C stops both
    kinesis-local   http://127.0.0.1:41231   stream orders (2 shards)
    DynamoDB Local  http://127.0.0.1:39677   the daemon's lease tables
    wrote local.properties (the KCL daemon's, pointed at both)
    ...the commands to run next...
    ready: Ctrl-C (or SIGTERM) stops both emulators

    $ mldserver local --put 100                        # another terminal: 100 orders on the stream

The emulators come from scripts/setup --test's ``.deps`` (or ``MLDSERVER_DEPS``), else
from ``emulators.cache_dir()``, installed there from the npm registry on first use. The
properties make the daemon quick and quiet on loopback (no CloudWatch metrics, polling
reads every 250 ms, shard sync every second, leases taken over after 10 s, worker
metrics reported every second and leases assigned every 2 s, its lease table made
ahead with its index: the first shard starts some 30 s after ``mldserver run`` does,
not 75). ``--put``
reads the properties file back for the stream and its endpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import TextIO

from ..errors import ConfigError
from . import emulators

APP = "mldserver-local"  # the daemon's applicationName: its lease tables (DynamoDB Local is in memory)
HANDLER = "mldserver.examples.quickstart:Orders"  # the quick start's handler, shipped with the package
ANY = "mldserver.examples.passthrough:Passthrough"  # one row per record, whatever it holds
CREDENTIALS = "AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_REGION=us-east-1"

# The daemon's settings for loopback, over emulators.daemon_properties' (which has metricsLevel
# NONE: CloudWatch is not there, and each failed publish is an error line).
QUICK = {
    "executableName": "mldserver connect 127.0.0.1:7070",  # `mldserver run` writes its own relay
    "shardSyncIntervalMillis": "1000",
    "failoverTimeMillis": "10000",
    "idleTimeBetweenReadsInMillis": "250",
    "retrievalMode": "POLLING",
    "metricsLevel": "NONE",
    # KCL 3 assigns leases only to workers that have reported their metrics (every 30 s by
    # default), on the leader's pass (every 2 x failoverTimeMillis): the first lease waited for both
    "workerMetricsReporterFreqInMillis": "1000",
    "leaseAssignmentIntervalMillis": "2000",
}


class _Stop(Exception):
    """SIGTERM or SIGINT arrived."""


def deps() -> Path:
    """The folder holding both emulators: scripts/setup's (or ``MLDSERVER_DEPS``), else the
    cache, installed there now if it is not yet (one line on stderr says so)."""
    if emulators.installed(emulators.deps_dir()):
        return emulators.deps_dir()
    cache = emulators.cache_dir()
    if not emulators.installed(cache):
        emulators.require_npm()
        sys.stderr.write(f"mldserver local: installing {emulators.KINESIS_LOCAL} and {emulators.DYNAMODB_LOCAL} "
                         f"(npm) into {cache}, once (about a minute)\n")
        sys.stderr.flush()
        emulators.install(cache)
    return cache


def main(args, out: TextIO) -> int:
    if args.shards < 1:
        raise ConfigError(f"--shards {args.shards}: a stream has at least 1 shard")
    if args.put is not None:
        return put(args, out)
    return serve(args, out)


def serve(args, out: TextIO) -> int:
    """Start both, make the stream (and table), write the properties, print what to run
    next, wait for SIGTERM/SIGINT or an emulator's death, stop both: 0, or 1 if one died."""
    stop = threading.Event()

    def stopping(signum, frame):
        stop.set()
        raise _Stop

    previous = {s: signal.signal(s, stopping) for s in (signal.SIGTERM, signal.SIGINT)}
    started: list[emulators.Process] = []
    try:
        os.environ["MLDSERVER_DEPS"] = str(deps())
        logs = Path(args.dir).resolve()
        logs.mkdir(parents=True, exist_ok=True)
        kinesis = emulators.KinesisLocal(logs, tethered=True)
        started.append(kinesis)
        dynamodb = emulators.DynamoDBLocal(logs, tethered=True)
        started.append(dynamodb)
        kinesis.create_stream(args.stream, args.shards)
        _lease_table(dynamodb, APP)
        if args.table:
            _create_table(dynamodb, args.table)
        path = Path(args.properties_out)
        emulators.daemon_properties(path, stream=args.stream, app=APP, kinesis=kinesis.endpoint,
                                    dynamodb=dynamodb.endpoint, extra=QUICK)
        path.write_text(f"# written by mldserver local: kinesis-local and DynamoDB Local on loopback, until it "
                        f"stops\n{path.read_text()}")
        out.write(_next_steps(args, kinesis.endpoint, dynamodb.endpoint, path, logs))
        out.flush()
        while not stop.is_set():
            for p in started:
                if p.proc.poll() is not None:
                    out.write(f"mldserver local: {type(p).__name__} exited ({p.proc.returncode}): see {p.log}; "
                              f"stopping\n")
                    out.flush()
                    return 1
            stop.wait(1)
        return 0
    except _Stop:
        return 0
    except (RuntimeError, TimeoutError) as exc:  # an emulator that would not start (its log named)
        raise ConfigError(f"local: {exc}") from None
    finally:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C does not cut the stop short
        for p in reversed(started):
            p.terminate(timeout=15)
        for s, handler in previous.items():
            signal.signal(s, handler)
        if started:
            out.write("mldserver local: stopped\n")
            out.flush()


def _lease_table(dynamodb: emulators.DynamoDBLocal, name: str) -> None:
    """The daemon's lease table made ahead, as KCL 3 makes it, with the index it adds (its
    owner to its lease keys): the daemon, finding the index there and ACTIVE, does not
    wait 10 s for it (it checks once right after creating it, then every 10 s)."""
    dynamodb.client.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"},
                              {"AttributeName": "leaseOwner", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[{
            "IndexName": "LeaseOwnerToLeaseKeyIndex", "Projection": {"ProjectionType": "KEYS_ONLY"},
            "KeySchema": [{"AttributeName": "leaseOwner", "KeyType": "HASH"},
                          {"AttributeName": "leaseKey", "KeyType": "RANGE"}]}])


def _create_table(dynamodb: emulators.DynamoDBLocal, name: str) -> None:
    """A table keyed by ``id`` (a string), its stream on with new and old images."""
    dynamodb.client.create_table(
        TableName=name, AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"})
    emulators.until(lambda: dynamodb.client.describe_table(TableName=name)["Table"]["TableStatus"] == "ACTIVE",
                    30, f"table {name}")


def _shown(path: Path) -> str:
    """The path as typed in this folder: relative below it, else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _next_steps(args, kinesis: str, dynamodb: str, path: Path, logs: Path) -> str:
    props = _shown(path)
    again = "" if props == "local.properties" else f" --properties-out {props}"
    table = f"                                         table {args.table}, its stream on\n" if args.table else ""
    lines = [
        f"kinesis-local   {kinesis}   stream {args.stream} ({args.shards} shards)\n",
        f"DynamoDB Local  {dynamodb}   the daemon's lease tables\n",
        table,
        f"wrote {props} (the KCL daemon's properties, pointed at both); logs in {_shown(logs)}\n",
        "\n",
        "Next, in another terminal, in this folder:\n",
        f"  export {CREDENTIALS}\n",
        f"  mldserver run --properties {props} --handler {HANDLER} --sink file:./windows --window 10\n",
        f"  mldserver local --put 100{again}" + (f" --table {args.table}" if args.table else "")
        + f"      # 100 orders on stream {args.stream}" + (f" and in table {args.table}" if args.table else "") + "\n",
        "\n",
        "Or read the stream with no daemon:\n",
        f"  AWS_ENDPOINT_URL_KINESIS={kinesis} mldserver serve --source kinesis:{args.stream} "
        f"--handler {HANDLER} --sink file:./windows --window 10\n",
    ]
    if args.table:
        lines.append(f"  AWS_ENDPOINT_URL_DYNAMODB={dynamodb} mldserver serve --source dynamodb:{args.table} "
                     f"--handler {ANY} --sink file:./table-windows --window 10\n")
    lines.append("\nready: Ctrl-C (or SIGTERM) stops both emulators\n")
    return "".join(lines)


def put(args, out: TextIO) -> int:
    """``--put N``: N JSON orders (the quick start's handler reads them:
    ``examples.quickstart.order``) on the stream the properties file names, and with
    ``--table``, N order items in that table too."""
    import boto3

    from ..examples.quickstart import order
    from .properties import read

    if args.put < 1:
        raise ConfigError(f"--put {args.put}: the number of records to put, at least 1")
    path = Path(args.properties_out)
    if not path.is_file():
        raise ConfigError(f"--put: no {path}: start `mldserver local` first (it writes that file), or give the "
                          f"file it wrote with --properties-out")
    props = read(path)
    stream, kinesis, dynamodb = (props.value(k) for k in ("streamName", "kinesisEndpoint", "dynamoDBEndpoint"))
    if not (stream and kinesis and dynamodb):
        raise ConfigError(f"--put: {path} names no streamName, kinesisEndpoint and dynamoDBEndpoint: give the file "
                          f"mldserver local wrote")
    try:
        client = boto3.client("kinesis", endpoint_url=kinesis, **emulators.AWS)
        for start in range(0, args.put, 500):
            entries = [{"Data": order(i), "PartitionKey": f"o-{i}"}
                       for i in range(start, min(start + 500, args.put))]
            failed = client.put_records(StreamName=stream, Records=entries)["FailedRecordCount"]
            if failed:
                raise ConfigError(f"--put: {failed} of {len(entries)} records refused by {kinesis}")
        out.write(f"put {args.put} orders on stream {stream} ({kinesis})\n")
        if args.table:
            table = boto3.resource("dynamodb", endpoint_url=dynamodb, **emulators.AWS).Table(args.table)
            with table.batch_writer() as batch:
                for i in range(args.put):
                    batch.put_item(Item={"id": f"o-{i}", "customer": f"c-{i % 7}", "amount": 10 + i % 50})
            out.write(f"put {args.put} items in table {args.table} ({dynamodb})\n")
    except ConfigError:
        raise
    except Exception as exc:  # botocore's: the emulators are not there
        raise ConfigError(f"--put: cannot reach the emulators of {path} ({exc}): is `mldserver local` running?")
    return 0
