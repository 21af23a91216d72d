"""The command line: ``mldserver serve``, ``mldserver run``, ``mldserver check``, ``mldserver connect``,
``mldserver bench``, ``mldserver demo``, ``mldserver local`` (the emulators, to try ``run``), ``mldserver
positions`` (a source's saved positions), and ``mldserver status|pause|resume|reload|redrive`` (clients of the
admin endpoint). The only module that exits the process or configures logging. A mistake in the arguments or
the settings is one line on stderr and exit status 2.

``connect`` is dispatched before anything else is imported: the daemon starts one
relay per shard and each must start fast and stay small.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["connect"]:
        from .ops import relay

        relay.exec_lean(argv[1:])
    _main(argv)


CHECK_HELP = ("everything serve (or, with --for run, run) checks at start-up, without "
              "serving: the settings, the handler and the pipeline loaded, the state "
              "directory probed, the daemon's properties file checked; prints what was "
              "found (exit 1 on an error in the properties, 2 on the mistake the "
              "command would stop on, with its line). Takes every flag of serve and "
              "run: --host, --port, --unix and --admin are checked as values, never "
              "bound (check runs beside a live server); --reset-positions deletes "
              "nothing")


def _parser():
    import argparse

    from . import __version__

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # one line, as every other mistake (not usage + error)
            self.exit(2, f"{self.prog}: {message}{_nearest(message, self)} (see {self.prog} --help)\n")

    p = Parser(prog="mldserver", description="Serve KCL MultiLangDaemon shards over TCP.")
    p.add_argument("--version", action="version", version=f"mldserver {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    serve = sub.add_parser("serve", help="run the server until SIGTERM/SIGINT")
    _serving_flags(serve)
    run = sub.add_parser("run", help="run the server, then the real KCL MultiLangDaemon as its supervised child")
    _serving_flags(run)
    run.add_argument("--properties", required=True, help="the KCL MultiLangDaemon's properties file (its stream, "
                                                         "region and endpoint are the server's too, unless set here "
                                                         "or in --config)")

    for name, what in (("status", "the server's shards, coordinator and Spark as a table (GET /status)"),
                       ("pause", "hold every shard before its next handler call (POST /pause)"),
                       ("resume", "go on from where the pause stopped (POST /resume)"),
                       ("reload", "reload the handler module, as SIGHUP does (POST /reload)")):
        admin = sub.add_parser(name, help=what)
        admin.add_argument("--admin", help="the admin endpoint's URL (default http://127.0.0.1:7071)")
        if name != "status":
            admin.add_argument("--admin-token-file",
                               help="the file holding the server's admin token (default: the state directory's "
                                    "admin-token, if there is one)")
            admin.add_argument("--state-dir", default="./mldserver-state",
                               help="the server's state directory, where it wrote admin-token "
                                    "(default ./mldserver-state)")
        if name == "status":
            admin.add_argument("--watch", action="store_true", help="redraw every --interval seconds")
            admin.add_argument("--interval", type=float, default=1.0, help="seconds between redraws (default 1)")

    maintain = sub.add_parser("table", help="the Iceberg table sink's table: maintain (expire snapshots past "
                                             "table_snapshots_kept, remove files no snapshot names, older than "
                                             "table_orphan_age)")
    maintain.add_argument("table_command", choices=["maintain"], metavar="maintain",
                          help="expire old snapshots and remove orphan files")
    maintain.add_argument("--config", help="the servers' TOML file (sink, table, [table_catalog])")
    maintain.add_argument("--sink", help="iceberg:DIR (or iceberg: with a [table_catalog] warehouse)")
    maintain.add_argument("--stream", help="as the servers have it (default: --config's)")
    maintain.add_argument("--older-than", dest="table_orphan_age", type=float, metavar="SECONDS",
                          help="a file named by nothing goes once this old (default 3600: a commit under way is "
                               "never that old)")
    maintain.add_argument("--dry-run", action="store_true", help="list what would go, change nothing")

    redrive = sub.add_parser("redrive", help="send the dead-lettered records through the server's current handler, "
                                              "into its sink (POST /redrive): redriven N, failed again M, left K")
    redrive.add_argument("--admin", help="the admin endpoint's URL (default: --config's admin, else "
                                         "http://127.0.0.1:7071)")
    redrive.add_argument("--state-dir", help="the server's state directory, where it wrote admin-token (default: "
                                             "--config's state_dir, else ./mldserver-state)")
    redrive.add_argument("--admin-token-file", help="the file holding the server's admin token (default: --config's "
                                                    "admin_token_file, else the state directory's admin-token)")
    redrive.add_argument("--config", help="the server's TOML file of settings: its admin, state_dir and "
                                          "admin_token_file, for what the flags do not give")
    redrive.add_argument("--timeout", type=float, default=300.0,
                         help="seconds the server waits for the redriven rows to be committed (default 300; "
                              "more than the window and its watermark margin)")
    redrive.add_argument("--json", action="store_true", help="print the server's whole answer, as JSON")

    positions = sub.add_parser("positions", help="where each shard of a --source resumes: its saved positions "
                                                 "(<state-dir>/sources/), one line a shard")
    positions.add_argument("--source", action="append", required=True,
                           help="dynamodb:TABLE, dynamodb:STREAM_ARN, kinesis:STREAM or kinesis:STREAM_ARN, as "
                                "given to serve (repeatable)")
    positions.add_argument("--state-dir", help="the server's state directory (default ./mldserver-state)")
    positions.add_argument("--lease-table", help="read the positions from this lease table (serve --lease-table), "
                                                 "each shard with the server leasing it")
    positions.add_argument("--json", action="store_true", help="one JSON object per source")

    check = sub.add_parser("check", help=CHECK_HELP, description=CHECK_HELP)
    _serving_flags(check)
    check.add_argument("--properties", help="the KCL MultiLangDaemon's properties file: checked as the daemon "
                                            "reads it (with --for run, as mldserver run starts it)")
    check.add_argument("--for", dest="target", choices=["serve", "run"], default="serve",
                       help="the command the arguments are for: serve (the default: the daemon, started by you, "
                            "runs on --properties as written, its executableName the relay to this server) or "
                            "run (mldserver run sets executableName itself, takes the stream, region and endpoint "
                            "from --properties, needs --handler, Java and the daemon's jars): check ARGS --for run "
                            "passes when run ARGS starts")

    connect = sub.add_parser("connect", help="the relay the daemon launches: HOST:PORT or unix:PATH")
    connect.add_argument("target")
    connect.add_argument("--connect-timeout", type=float)

    bench = sub.add_parser("bench", help="throughput and memory against amazon_kclpy, in one run")
    bench.add_argument("--shards", type=int, nargs="+", default=[1, 32],
                       help="relay and kclpy parts: shard counts to run, each a row (default 1 32); "
                            "source part: the stream's shards (default 2)")
    bench.add_argument("--batches", type=int, default=None, help="batches per shard (default: by load)")
    bench.add_argument("--load", nargs="+", default=["10000x100", "1000x1024"], help="RECORDSxBYTES per batch")
    bench.add_argument("--quick", action="store_true", help="a short run (for tests)")
    bench.add_argument("--no-kclpy", action="store_true", help="skip the amazon_kclpy baseline")
    bench.add_argument("--scrape", type=float, metavar="SECONDS",
                       help="relay part: also run the server with its /metrics scraped every SECONDS, side by side")
    bench.add_argument("--workers", type=int, nargs="+", default=None,
                       help="handler processes of the servers measured, side by side (default: the default and 0)")
    bench.add_argument("--part", choices=["all", "relay", "coordinator", "spark", "changes", "timers", "table",
                                          "kclpy", "chaos", "source", "stream", "scale"],
                       default="all",
                       help="relay: against amazon_kclpy; kclpy: amazon_kclpy's sample processor behind "
                            "mldserver against the same class under KCLProcess; "
                            "coordinator: with a sink against none; "
                            "spark: end to end into Spark against the bare handoff; "
                            "changes: a ChangeHandler against a batch Handler decoding by hand; "
                            "timers: durable timers created and fired per second, and the store's memory; "
                            "table: the iceberg sink against the parquet sink, and reading a position back; "
                            "chaos (not part of all): 24 shards with poisoned batches and handler processes "
                            "SIGKILLed, rarely (chaos) and often (storm), against an undisturbed run, and the "
                            "checks (no connection closed, every record handled or dead-lettered); "
                            "source (not part of all): a Kinesis stream on kinesis-local read by serve --source "
                            "against the real KCL daemon through the relay (mldserver run): records/s, CPU per "
                            "record, put to handler p50/p99 (needs scripts/setup --test's emulators); "
                            "stream (not part of all): DynamoDB changes on DynamoDB Local read by "
                            "mldserver.open_stream against Bloop's Stream: CPU per change, beside the floor "
                            "(needs scripts/setup --test's DynamoDB Local and Bloop); "
                            "scale (not part of all): mldserver run servers with their real KCL daemons joining "
                            "and dying on one stream into one Iceberg table: time to balance, rows/s per server, "
                            "commit conflicts and latency, every record once (the leader's death left out with "
                            "--quick)")
    bench.add_argument("--commits", type=int, default=None,
                       help="table part: commits in the table a position is read back from (default 10,000)")
    bench.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                       help="chaos part: seconds of each chaos run (default 300; 20 with --quick), after an "
                            "undisturbed run of a tenth of that (5 to 30 s)")
    bench.add_argument("--seed", type=int, default=None,
                       help="chaos part: the campaign's seed: its batches, faults and kill intervals "
                            "(default: a random one, printed)")

    demo = sub.add_parser("demo", help="run the server on an example handler, driven by the fake daemon")
    demo.add_argument("--shards", type=int, default=4,
                      help="shards the fake daemon drives, one of which splits in two (default 4)")
    demo.add_argument("--records", type=int, default=300_000,
                      help="DynamoDB-stream order records in all (default 300,000)")
    demo.add_argument("--dir", default="./mldserver-demo",
                      help="where the output, the state and the logs go (default ./mldserver-demo)")
    demo.add_argument("--admin", default="127.0.0.1:7071",
                      help="the demo server's admin endpoint (default 127.0.0.1:7071; off disables it)")

    local = sub.add_parser("local", help="try mldserver run on one machine: kinesis-local and DynamoDB Local on "
                                         "loopback, a stream, the daemon's properties file pointed at them, and "
                                         "the commands to run next; until Ctrl-C, then both stop")
    local.add_argument("--stream", default="orders", help="the Kinesis stream to create (default orders)")
    local.add_argument("--shards", type=int, default=2, help="its shards (default 2)")
    local.add_argument("--table", help="also create this DynamoDB table, its stream on (for serve --source "
                                       "dynamodb:TABLE)")
    local.add_argument("--properties-out", default="local.properties",
                       help="where to write the daemon's properties file, for mldserver run --properties "
                            "(default ./local.properties; --put reads it back)")
    local.add_argument("--dir", default="./mldserver-local",
                       help="where the emulators' logs go (default ./mldserver-local)")
    local.add_argument("--put", type=int, metavar="N",
                       help="instead: put N example orders on the stream of a running mldserver local (and in "
                            "--table's table), then exit")

    return p


def _serving_flags(parser) -> None:
    """The flags ``serve``, ``run`` and ``check`` share: one list, so the three cannot drift
    (``check`` takes each to check it as the server would, binding nothing)."""
    parser.add_argument("--handler", help="the handler factory, MODULE:ATTR")
    parser.add_argument("--host", help="bind address (default 127.0.0.1: the protocol has no authentication)")
    parser.add_argument("--port", type=int, help="TCP port (default 7070; 0 picks a free one)")
    parser.add_argument("--unix", help="also (or only, without --port) listen on this unix socket")
    parser.add_argument("--config", help="TOML file of settings (see mldserver.base.config)")
    parser.add_argument("--log-format", choices=["json", "console"])
    parser.add_argument("--log-file", help="append logs here instead of stderr")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--state-dir", help="spool, commit log, dead letters (default ./mldserver-state)")
    parser.add_argument("--execution-timeout", type=float, help="seconds per handler call (default 60)")
    parser.add_argument("--workers", type=int,
                        help="handler processes (default 2; 0: handlers run in the server's own loop)")
    parser.add_argument("--max-line-size", type=int, help="largest daemon line in bytes (default 256 MiB)")
    parser.add_argument("--window", type=float, help="window size in seconds (default 60; tumbling unless --slide)")
    parser.add_argument("--slide", type=float,
                        help="hopping windows: a new window every SLIDE seconds (a divisor of --window)")
    parser.add_argument("--session", dest="session_gap", type=float, metavar="GAP",
                        help="session windows: a key's rows less than GAP seconds apart are one session "
                             "(with --session-key)")
    parser.add_argument("--session-key", metavar="FIELD",
                        help="session windows: the field of each row that names its session's key")
    parser.add_argument("--allowed-lateness", type=float, metavar="SECONDS",
                        help="a closed window takes late rows this long after its end (the sink replaces it, "
                             "amended); default 0")
    parser.add_argument("--max-out-of-orderness", type=float, metavar="SECONDS",
                        help="rows of a shard this much out of event-time order still land in their own window "
                             "(a shard's watermark is its largest event time minus it); default 0")
    parser.add_argument("--late-policy", choices=["next", "drop", "dead-letter"],
                        help="a row whose window has closed: committed with the next window (next, the default), "
                             "dropped and counted (drop), or kept with its data in the dead letters (dead-letter)")
    parser.add_argument("--sink", help="file:DIR, parquet:DIR or iceberg:DIR (iceberg: alone when [table_catalog] "
                                       "names the warehouse)")
    parser.add_argument("--stream", help="the stream every position is keyed by (the Kinesis stream name or ARN, "
                                         "the DynamoDB stream ARN): the same on every server sharing a table (the "
                                         "setting stream; under run, by default, the properties file's streamArn "
                                         "or streamName)")
    parser.add_argument("--server-id", help="this server's name in the table's commits (default: host and state "
                                            "dir, stable across restarts)")
    parser.add_argument("--pipeline", help="Spark pipeline, MODULE:ATTR")
    parser.add_argument("--spark-master", help="Spark master URL (default local[*])")
    parser.add_argument("--spark-remote", help="Spark Connect URL sc://host:port")
    parser.add_argument("--timer-store", help="where durable timers are kept: sqlite (the state dir's, default), "
                                              "sqlite:PATH or dynamodb:TABLE (shared by servers)")
    parser.add_argument("--source", action="append",
                        help="read a stream directly, into the same handlers: dynamodb:TABLE, dynamodb:STREAM_ARN, "
                             "kinesis:STREAM or kinesis:STREAM_ARN "
                             "(repeatable; positions saved in the state dir, <state-dir>/sources/, or with "
                             "--lease-table in that table)")
    parser.add_argument("--from", dest="source_from",
                        help="where a --source with no saved position starts: trim_horizon (default), latest, or "
                             "an ISO-8601 time with its zone (2026-01-30T10:00:00Z)")
    parser.add_argument("--reset-positions", action="store_true",
                        help="delete the saved positions of every --source before starting (then --from applies)")
    parser.add_argument("--lease-table",
                        help="spread each --source's shards over the servers sharing it: a DynamoDB table (created "
                             "if absent) of the shards' leases, which also keeps their positions")
    parser.add_argument("--lease-period", type=float,
                        help="seconds a shard's lease lasts unrenewed (default 10): the other servers take a dead "
                             "server's shards over after about one")
    parser.add_argument("--admin", help="admin endpoint HOST:PORT: /metrics, /healthz, /readyz, /status, "
                                        "POST /pause /resume /reload (default 127.0.0.1:7071; off disables it)")
    parser.add_argument("--admin-token-file",
                        help="a file holding the token POST /pause, /resume, /reload then need (Authorization: "
                             "Bearer TOKEN; GETs stay open); beyond loopback without it, <state-dir>/admin-token "
                             "is generated and required")


def _nearest(message: str, parser) -> str:
    """"; did you mean --port?" for an argparse error about an unknown flag or command."""
    import argparse
    import difflib
    import re

    known: list[str] = list(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            known += list(action.choices)
            for subparser in action.choices.values():
                known += list(subparser._option_string_actions)
    wrong = re.findall(r"(?:unrecognized arguments: |invalid choice: ')(\S+?)'?(?:\s|$)", message)
    wrong += re.findall(r"unrecognized arguments: .*?\s(--?\S+)", message)
    for word in wrong:
        near = difflib.get_close_matches(word.partition("=")[0], sorted(set(known)), n=1, cutoff=0.6)
        if near:
            return f"; did you mean {near[0]}?"
    return ""


def _main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    from .base import logs
    from .base.secrets import scrub
    from .errors import ConfigError, ServerCrashed

    if args.command in ("status", "pause", "resume", "reload"):
        from .ops import status

        try:
            sys.exit(status.main(args))
        except status.AdminUnreachable as exc:
            sys.stderr.write(f"mldserver {args.command}: {scrub(str(exc))}\n")
            sys.exit(1)
        except ConfigError as exc:  # a token file that cannot be read
            sys.stderr.write(f"mldserver {args.command}: {scrub(str(exc))}\n")
            sys.exit(2)
    if args.command == "redrive":
        sys.exit(_redrive(args))
    try:
        if args.command in ("serve", "run"):
            _serve(args, logs)
        elif args.command == "check":
            _check(args)
        elif args.command == "table":
            from .ops import table

            logs.configure("console", "warning")
            sys.exit(table.main(_settings(args, need_handler=False), args.dry_run, sys.stdout))
        elif args.command == "positions":
            from .base.config import Settings
            from .ops import positions

            state_dir = args.state_dir or Settings().state_dir
            sys.exit(positions.main(args.source, state_dir, args.json, sys.stdout, sys.stderr,
                                    lease_table=args.lease_table))
        elif args.command == "bench":
            from .ops import bench

            logs.configure("console", "warning")
            bench.main(args)
        elif args.command == "local":
            from .ops import local

            sys.exit(local.main(args, sys.stdout))
        elif args.command == "demo":
            from .ops import demo

            logs.configure("console", "warning")
            demo.main(args)
    except ConfigError as exc:
        sys.stderr.write(f"mldserver: {scrub(str(exc))}\n")
        sys.exit(2)
    except ServerCrashed as exc:  # logged (task_crashed) and shut down in order
        sys.stderr.write(f"mldserver: {scrub(str(exc))}\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


def _redrive(args) -> int:
    """``mldserver redrive``: its exit status (one line on stderr and 2 when it cannot run)."""
    from .base.config import admin_address, load
    from .errors import ConfigError
    from .ops import redrive, status

    try:
        if not 0 < args.timeout <= 86_400:
            raise ConfigError(f"--timeout {args.timeout:g}: seconds, more than 0 and at most 86400")
        admin, state_dir, token_file = args.admin, args.state_dir, args.admin_token_file
        if args.config:
            settings = load(args.config)
            if admin is None and settings.admin is not None:
                if admin_address(settings.admin) is None:
                    raise ConfigError(f"{args.config}: admin = {settings.admin!r}: the server has no admin endpoint "
                                      f"to redrive through: give it one (admin = \"127.0.0.1:7071\"), restart it")
                admin = settings.admin
            state_dir = state_dir or settings.state_dir
            token_file = token_file or settings.admin_token_file
        target = redrive.Target(admin, state_dir or "./mldserver-state", token_file)
        return redrive.run(target, args.timeout, sys.stdout, sys.stderr, as_json=args.json)
    except (redrive.Failed, status.AdminUnreachable, ConfigError) as exc:
        sys.stderr.write(f"mldserver redrive: {exc}\n")
        return 2


def _settings(args, need_handler: bool = True):
    """The settings from ``--config`` and the flags the command has (one code path for
    ``serve``, ``run`` and ``check``: every value checked against its Rule in config.load).
    For ``run`` (and ``check --for run``) the daemon's properties give the stream, its
    region and endpoint, beneath the config file and the flags."""
    from .base import config
    from .errors import ConfigError

    flags = {name: getattr(args, name) for name in config.RULES if hasattr(args, name)}
    defaults = None
    if _runs_daemon(args):
        from .ops.properties import stream_settings

        defaults = stream_settings(args.properties)
    settings = config.load(args.config, defaults=defaults, **flags)
    if need_handler and not settings.handler:
        raise ConfigError("no handler: pass --handler MODULE:ATTR (or set handler in --config)")
    return settings


def _runs_daemon(args) -> bool:
    """``run``, or ``check --for run``: the daemon is started by mldserver, on ``--properties``."""
    return args.command == "run" or (args.command == "check" and args.target == "run" and bool(args.properties))


def _check(args) -> None:
    """``mldserver check``: exit 0 (all is well), 1 (an error in the properties), or a
    ConfigError (the line serve or run would stop on; exit 2)."""
    from .errors import ConfigError
    from .ops import check

    if args.target == "run" and not args.properties:
        raise ConfigError("check --for run: run needs --properties FILE (the daemon's properties file): give the "
                          "one you give run")
    if not (args.config or args.properties or args.handler):
        raise ConfigError("nothing to check: give --config FILE, --properties FILE, --handler MODULE:ATTR "
                          "or several")
    # run needs a handler, whatever else it has; serve's daemon file can be checked alone
    settings = _settings(args, need_handler=args.target == "run" or not args.properties)
    _importable_cwd()
    given = check.Given(settings, args.config, args.properties, command=args.target,
                        reset_positions=args.reset_positions)
    if check.run(given, sys.stdout):
        sys.exit(1)


def _importable_cwd() -> None:
    """Handlers named relative to where the server starts, as `python -m` would find them."""
    import os

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _serve(args, logs) -> None:
    import faulthandler

    # A fatal signal (a crash in native code: the sink's, a library's, while they load
    # or while serving) writes every thread's stack to stderr before the process dies.
    faulthandler.enable(all_threads=True)
    from .server import server

    from .base.config import DEFAULT_ADMIN

    settings = _settings(args)
    if settings.admin is None:
        settings = settings.replace(admin=DEFAULT_ADMIN)  # on by default for `serve` (an embedded Server: off)
    logs.configure(settings.log_format, settings.log_level, settings.log_file)
    _importable_cwd()
    if args.reset_positions:
        _reset_positions(settings, logs)
    serving = server.Server(settings)
    if args.command == "run":
        from .ops.daemon import Daemon

        daemon = Daemon(settings, args.properties)  # no file, no Java, no jars: exit 2 before anything starts
        daemon.report()
        daemon.clear_leftover()  # before listening: a leftover daemon's next relay would reach this server
        serving.companions.append(daemon)
    tune(sink=serving.coordinator is not None)
    server.run(serving)


def _reset_positions(settings, logs) -> None:
    """``--reset-positions``: the saved positions of every ``--source`` deleted, before
    the server reads them."""
    from .sources import reset_positions, resettable

    resettable(settings)
    for source in reset_positions(settings):
        logs.get_logger("mldserver.sources").info("positions_reset", source=source)


def tune(*, sink: bool) -> None:
    """Configure the process for serving (only the CLI does), once the handler and
    the sink are loaded.

    The soft limit on open files is raised to the hard one.

    Fewer, larger young-generation collections: a 10,000-record batch decodes into
    some 60,000 objects; with CPython's default gen0 threshold (700) that is ~90
    collections per batch, each walking the young objects: about a third of the
    decode time. Long-lived start-up objects are frozen out of collection altogether.
    """
    import resource

    from .pool.malloc import collect_less, reuse_large_buffers

    # Every shard is a connection (and a relay's pipe to the daemon under `run`): use all
    # the file handles the hard limit allows, not the soft 1,024 most shells start with.
    # The admin endpoint keeps to its own cap (mldserver.server.admission) within them.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an unlimited hard limit past the kernel's nr_open: keep the soft one
            pass
    collect_less()
    reuse_large_buffers()  # a batch's megabyte buffers reused, not faulted in each time; trimmed every 10 s
    if sink:
        # Sink commits run in a thread that needs the GIL between its system calls;
        # with the loop decoding batches, the default 5 ms hand-over made each commit
        # wait some 80 ms in all. 0.5 ms keeps commits ahead of the batches.
        sys.setswitchinterval(0.0005)
