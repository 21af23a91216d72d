"""Every log event mldserver can emit, with its level and what it means: the one
catalogue the logger checks names against and the documentation's log-event reference
is generated from::

    EVENTS["window_committed"]  ->  LogEvent(area="coordinator", levels=("info",),
                                          meaning="A closed window was committed to the sink ...")
    EVENTS["sink_commit_failed"].todo  ->  "Read `error`: ... fix the sink; the window is retried ..."

With ``MLDSERVER_CHECK_EVENTS=1`` in the environment (the tests set it, for their own
process and every server they start), ``logs.EventLogger`` raises ``UncataloguedEvent``
for an event, or a level of it, that is not here; without it nothing is looked up.
``emitted()`` reads the package's source for the events its log calls name, so a test
compares the two both ways: an event the code logs and this table lacks, or an entry no
code logs, fails. Every warning and error says what to do about it (``todo``): the
documentation's "Warnings and errors" page is generated from it.

Not here: what a handler logs through ``context.log`` (its own events, under its own
names) and the JSON lines of the Spark process's and the daemon's own logs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

LEVELS = ("debug", "info", "warning", "error")


class LogEvent(NamedTuple):
    area: str  # the part of the server that logs it (a heading of the reference)
    levels: tuple[str, ...]  # the levels it is logged at
    meaning: str  # one line: what happened
    todo: str = ""  # what to do about it: every warning and error has one (the troubleshooting reference)


def _area(area: str, entries: dict[str, tuple[str, ...]]) -> dict[str, LogEvent]:
    """An area's entries, ``name: (levels, meaning)`` or, for a warning or an error,
    ``name: (levels, meaning, what to do)``."""
    return {name: LogEvent(area, tuple(entry[0].split()), *entry[1:]) for name, entry in entries.items()}


EVENTS: dict[str, LogEvent] = {
    **_area("server", {
        "listening": ("info", "The server accepts connections: `host` and `port` (or `unix`), the `handler`, "
                              "the `pid`, the `open_files_limit` it runs under."),
        "listening_beyond_loopback": ("warning", "`--host` is not loopback: the shard protocol has no "
                                                 "authentication; firewall the port.",
                                                 "If other machines need not reach the port, serve on "
                                                 "`127.0.0.1` (the default); else let only the daemon's hosts"
                                                 " reach it (a firewall, a security group)."),
        "connected": ("debug", "A peer (a relay, a source's feed) opened a shard connection."),
        "shard_refused": ("warning", "A shard connection was closed unserved (`peer`, `reason`): its relay "
                                     "says so on the daemon's stderr and exits 2.",
                                     "Nothing: the server is shutting down. The daemon starts the shard "
                                     "again, and it is served once a server listens."),
        "driver_crashed": ("error", "A bug of ours ended one shard's connection (with the traceback); the "
                                    "other shards go on.",
                                    "Report it with the traceback and the lines of that `shard_id` before it."
                                    " The daemon starts the shard again from its last checkpoint: nothing is "
                                    "lost."),
        "emit_without_sink": ("warning", "The handler emits rows but no `--sink` keeps them: they are "
                                         "discarded (said once at start-up).",
                                         "Give `--sink` (e.g. `--sink file:./windows`) to keep the rows, or "
                                         "stop emitting them."),
        "signal_received": ("info", "SIGTERM or SIGINT (shut down in order) or SIGHUP (reload) arrived."),
        "reload_skipped": ("warning", "A reload was asked for with `--workers 0`: nothing can be imported "
                                      "again in the server's own loop.",
                                      "Reload needs handler processes: run with `--workers 1` or more, or "
                                      "restart the server to load new code."),
        "paused": ("info", "`POST /pause`: every shard waits before its next handler call."),
        "resumed": ("info", "`POST /resume`: every waiting action goes on where it stopped."),
        "resumed_for_shutdown": ("info", "The server was paused when asked to shut down: it resumes so "
                                         "that the actions that arrived finish."),
        "shutting_down": ("info", "The ordered shutdown began: `connections` open, `busy` with an action."),
        "shutdown_timeout": ("warning", "Past `shutdown_timeout`, the handler calls still running were "
                                        "cancelled and their actions answered as failed.",
                                        "Those actions are delivered again after the restart (from the last "
                                        "checkpoint). If handlers need longer to finish, raise "
                                        "`shutdown_timeout`; make long calls cancellable."),
        "shutdown_cancelled": ("warning", "What was still running after the shutdown's deadline was "
                                          "cancelled.",
                                          "Nothing is lost (what was not checkpointed is delivered again). If"
                                          " it happens at every stop, raise `shutdown_timeout`."),
        "handler_calls_ended": ("warning", "Handler calls that swallowed their cancellation were closed "
                                           "at shutdown.",
                                           "A handler catches `asyncio.CancelledError` (or `BaseException`) "
                                           "and goes on: re-raise it in your handler."),
        "stopped": ("info", "The server stopped (`loop_lag_max_ms`: the longest the loop was blocked); "
                            "exit 0."),
        "task_crashed": ("error", "A task the server owns died (`task`: a listener, the coordinator's "
                                  "committer, the Spark supervisor, the daemon): the server shuts down "
                                  "and exits 1.",
                                  "Read the traceback and `task`. The daemon's child: see `daemon_exited`; "
                                  "Spark: `spark_restart_failed`; otherwise report it. Restart the server: it"
                                  " resumes from the checkpoints."),
        "positions_reset": ("info", "`--reset-positions` deleted a `--source`'s saved positions."),
    }),
    **_area("admin endpoint", {
        "admin_listening": ("info", "The admin endpoint is bound (`host`, `port`, `url`, and `token_file` "
                                    "when its POSTs need a token)."),
        "admin_token_generated": ("info", "Listening beyond loopback with no `--admin-token-file`: a token "
                                          "was written to `<state-dir>/admin-token` (the file, never the "
                                          "token)."),
        "admin_busy": ("warning", "The admin endpoint holds its cap of open connections (`open`, `cap`): "
                                  "those past it are answered 503 and closed, the shards unaffected; at most "
                                  "once a minute, with `refused` since the last and `timed_out` (headers not "
                                  "sent within 10 s) in all.",
                                  "Something opens many connections to the admin endpoint (a scraper, a probe"
                                  " without keep-alive, a client that never sends its headers): find it by "
                                  "`peer` in your proxy, or scrape less often."),
        "admin_refused": ("warning", "A POST without the admin token, or with another, was refused (401): "
                                     "`method`, `path`, `peer`, `reason`.",
                                     "Give the token: `--admin-token-file FILE` to `mldserver "
                                     "pause/resume/reload/redrive`, or `Authorization: Bearer <token>`. A "
                                     "`peer` you do not know is worth looking into."),
    }),
    **_area("redrive", {
        "redrive_started": ("info", "`mldserver redrive` (`POST /redrive`) began run `run`: the redrivable dead "
                                    "letters (`dead_letters`, of `records` in `shards` files) go through the "
                                    "current handler; `left` others stay."),
        "redriven": ("info", "A shard file's redriven records (`records`) have their rows committed under "
                             "`redrive_shard` (the commit log's name for them): their `dead_letters` were "
                             "removed from `path`."),
        "redrive_failed_again": ("warning", "Redriven records of `shard_id` failed again (`records`, the first "
                                            "`sequence_numbers`, `error`): their dead letters are kept.",
                                            "Read `error`: the handler still fails on those records. Fix the "
                                            "handler, `mldserver reload`, then `mldserver redrive` again; the"
                                            " records stay in `<state-dir>/dead-letters/` meanwhile."),
        "redrive_not_committed": ("warning", "A redrive's rows were not committed within its time-out: their "
                                             "dead letters are kept (a later redrive may send them again: a "
                                             "duplicate at worst).",
                                             "The sink is slow or failing: look for `sink_commit_failed`. Run"
                                             " `mldserver redrive` again once windows commit (or with a "
                                             "longer `--timeout`)."),
        "redrive_finished": ("info", "A redrive ended: `redriven`, `failed_again`, `left` dead letters, "
                                     "`not_committed` of them, `duration_ms`."),
    }),
    **_area("shard", {
        "initialize": ("info", "A shard's connection initialized: its `shard_id`, starting position and "
                               "protocol `dialect`."),
        "batch": ("debug", "One `processRecords` batch handled: `records`, `millis_behind_latest`, "
                           "`duration_ms`."),
        "checkpoint": ("warning", "A checkpoint the daemon did not store at once: `outcome` (retry or "
                                  "failed), the daemon's `error`, the position, `delay_ms` before a retry.",
                                  "A `retry` outcome needs nothing (throttling, DynamoDB busy). `failed` with"
                                  " `ShutdownException`: the lease moved, the new owner resumes. Repeated "
                                  "failures: check the daemon's lease table (its DynamoDB capacity) and the "
                                  "daemon's log."),
        "checkpoint_reply_timeout": ("error", "The daemon did not answer a checkpoint within the time "
                                              "allowed: the checkpoint fails.",
                                              "The daemon is stuck or overloaded: look at its log "
                                              "(`daemon_error`) and its JVM (heap, GC). The records after the"
                                              " last stored checkpoint are delivered again later."),
        "shard_ended": ("info", "The daemon said the shard ended (`shardEnded`, KCL 1.x `TERMINATE`)."),
        "shard_end_stored": ("info", "`SHARD_END` was checkpointed (`by`: the handler or the server)."),
        "shard_end_not_stored": ("error", "`SHARD_END` could not be stored within `shard_end_budget`: the "
                                          "daemon will not start the shard's children until it is.",
                                          "Look at the lines before it (the shard's rows not committed: "
                                          "`sink_commit_failed`) and at the daemon's lease table (throttled? "
                                          "unreachable?); raise `shard_end_budget` if it is only slow. Then "
                                          "restart the daemon (under `mldserver run`, the server) so the "
                                          "shard end comes again."),
        "lease_lost": ("info", "The daemon said another worker holds the shard's lease now (`leaseLost`, "
                               "KCL 1.x `ZOMBIE`)."),
        "disconnected": ("info warning", "The shard's peer went away (a reset, a closed socket); a warning "
                                         "when an action was left unanswered (`owed`).",
                                         "At the warning, the daemon redelivers the unanswered action to a "
                                         "new connection: nothing to do unless it repeats; then look for the "
                                         "daemon's restarts (`daemon_error`) or a relay killed (memory)."),
        "closed": ("info", "A shard's connection ended: its `batches`, `records` and last `state`."),
        "close_failed_internally": ("error", "A step of closing a shard's connection raised (a bug of "
                                             "ours); the other steps still ran.",
                                             "Report it with the traceback. The shard's other closing steps "
                                             "ran; a restart is not needed."),
        "unexpected_line": ("error", "The daemon broke the protocol (a line its state does not allow): "
                                     "the connection is closed.",
                                     "A daemon that speaks another protocol version, or a peer that is not "
                                     "the daemon: check the daemon's version (KCL 1.x to 3.x), and that only "
                                     "relays connect to the port."),
        "bad_line": ("error", "A line from the daemon that does not parse: answered when its first bytes name "
                              "an action, kept in the dead letters.",
                              "Look at the dead letter (`<state-dir>/dead-letters/`): a daemon writing "
                              "malformed JSON is a bug to report with the line; raise `max_line_size` if it "
                              "was cut for size."),
        "bad_line_unanswerable": ("error", "A line that names no action (not JSON, no `action`): it owes no "
                                           "status and gets none; dead-lettered, and the connection goes on (the "
                                           "real daemon never sends one): look at what sent it.",
                                           "Something that is not the daemon wrote to a shard connection: "
                                           "check what connects to the port (a scanner, a health check on the"
                                           " shard port instead of the admin endpoint)."),
        "kpl_aggregate_invalid": ("error", "A KPL aggregate record that does not decode: its batch is "
                                           "dead-lettered whole.",
                                           "A producer wrote a malformed KPL aggregate: the records are in "
                                           "`<state-dir>/dead-letters/`. Fix the producer; `mldserver "
                                           "redrive` sends them again once the handler can take them."),
        "action_failed_internally": ("error", "A failure of ours inside one action: it is answered, its "
                                              "batch dead-lettered, and the next action served.",
                                              "Report it with the traceback; the batch is in "
                                              "`<state-dir>/dead-letters/` and can be sent again with "
                                              "`mldserver redrive`."),
        "rows_discarded": ("warning", "A shard's handler emitted rows with no sink to keep them (once per "
                                      "shard).",
                                      "Give `--sink` to keep the rows the handler emits, or stop emitting "
                                      "them."),
        "slots_held": ("warning", "A batch waited more than a few seconds for one of the "
                                  "`max_batches_in_flight` slots; `holders` names who held them.",
                                  "Handlers are slow or blocked: raise `max_batches_in_flight`, or "
                                  "`--workers`, or look at `holders` and at `handler_blocked` lines for what "
                                  "they wait on."),
        "peer_stalled": ("warning", "A peer stopped sending in the middle of an action: its slot is given "
                                    "back until it sends again.",
                                    "Usually a daemon under load (GC) or a slow network between daemon and "
                                    "server: nothing to do if it passes; look at the daemon's JVM if it "
                                    "repeats."),
        "unanswered_at_shutdown": ("warning", "At shutdown the daemon had not sent a whole action by "
                                              "`shutdown_timeout`: it is left unanswered.",
                                              "Nothing is lost: the daemon delivers that action again after "
                                              "the restart. Raise `shutdown_timeout` if it happens at every "
                                              "stop."),
        "paused_action": ("info", "A shard's next action waits at the pause."),
        "resumed_action": ("info", "A shard's action held at the pause goes on."),
    }),
    **_area("handler calls", {
        "initialize_failed": ("error", "A shard's handler failed `initialize` every attempt (or could not be made): "
                                       "until an initialize tried again before each later action (`callback`) "
                                       "succeeds, its batches are dead-lettered whole (reason `initialize failed`) "
                                       "and no other callback is called; the connection stays open.",
                                       "Read the traceback: your handler's `initialize` (or its constructor) "
                                       "raises. Fix it and `mldserver reload`; the dead-lettered batches go "
                                       "back through with `mldserver redrive`."),
        "initialized_again": ("info", "A shard's handler whose `initialize` had failed was made and initialized "
                                      "afresh before `before`: its actions are called again."),
        "handler_create_failed": ("error", "The handler factory raised when called for a shard (`factory(context)`).",
                                           "Your handler's constructor raises: read the traceback, fix it, "
                                           "`mldserver reload`."),
        "handler_failed": ("error", "A handler call raised: `attempt` of `attempts`, retried after "
                                    "`handler_backoff`, then dead-lettered.",
                                    "Read the traceback. A transient failure (a timeout of a service) needs "
                                    "nothing: it is retried. A bug: fix it and `mldserver reload`, then "
                                    "`mldserver redrive` what was dead-lettered meanwhile."),
        "handler_stuck": ("error", "A handler swallowed its cancellation past `execution_timeout` and a "
                                   "grace: abandoned, the action answered as failed.",
                                   "The handler catches cancellation and goes on: re-raise "
                                   "`asyncio.CancelledError`, and avoid blocking calls in async code (use "
                                   "`asyncio.to_thread`)."),
        "handler_timed_out": ("error", "A call ran past `execution_timeout`: where it was (`stack`) and "
                                       "how it was stopped (`cancelled`, `interrupted`, `killed`).",
                                       "Look at `stack` for where the call was: a slow service, a blocking "
                                       "call in async code. Make it faster or raise `execution_timeout`."),
        "handler_redone": ("warning", "An action in flight in a handler process that died is redone "
                                      "elsewhere, not counted as an attempt.",
                                      "Nothing for this line; see the `handler_process_died` before it for "
                                      "why the process died."),
        "record_retry": ("warning", "A change handler's callback raised for one record: retried for that "
                                    "record alone.",
                                    "Nothing if it passes; read the traceback if the same record keeps "
                                    "failing."),
        "record_failed": ("error", "A change handler's callback failed every attempt for one record: it is "
                                   "dead-lettered and the batch goes on.",
                                   "Read the traceback: the record is in `<state-dir>/dead-letters/`. Fix the"
                                   " callback, `mldserver reload`, then `mldserver redrive`."),
        "handler_output": ("info", "A line an amazon_kclpy processor printed (`stream`: stdout or stderr, "
                                   "`line`); from a thread it started, that thread's name (`thread`)."),
    }),
    **_area("handler processes", {
        "handler_process_died": ("error", "A handler process died (`exit_code` or `signal`, `shards`, "
                                          "`running`, `quarantine`, `stack`): it is replaced, its shards "
                                          "move.",
                                          "Read `exit_code` or `signal` and `stack`: a crash in native code, "
                                          "`os._exit`, or the kernel's OOM killer (`signal` 9: raise the "
                                          "memory, or set `max_handler_memory` to replace the process before "
                                          "it). The action is retried in quarantine; nothing is lost."),
        "handler_process_started": ("debug info", "A handler process started (`pid`, `process`, "
                                                  "`generation`): debug for the first ones (`listening` "
                                                  "names them), info for a replacement."),
        "handler_process_quarantined": ("info", "The action that was running when its process died is "
                                                "retried in a process of its own."),
        "handler_process_memory": ("warning", "A handler process is over `max_handler_memory`: it is "
                                              "replaced between actions.",
                                              "Nothing if it is rare. Often: the handler keeps memory across "
                                              "batches (a cache without a bound); fix that or raise "
                                              "`max_handler_memory`."),
        "handler_process_retired": ("info", "A handler process was retired (over its memory, or an old "
                                            "generation after a reload) once no action was under way in it; "
                                            "its idle shards (idle_shards) move at their next action."),
        "handler_process_start_failed": ("error", "A handler process could not be started (the module does "
                                                  "not import?): retried with backoff.",
                                                  "Read the error: the handler module does not import in a "
                                                  "fresh process (a missing dependency, `PYTHONPATH`). Check "
                                                  "with `mldserver check --handler MODULE:ATTR`."),
        "handler_process_unreadable": ("error", "A frame from a handler process could not be read: it is "
                                                "killed and replaced, its calls redone elsewhere.",
                                                "Report it with the traceback. Nothing is lost: the process "
                                                "is killed and replaced, and its calls are redone elsewhere."),
        "handler_blocked": ("warning", "A handler blocked its process's loop longer than "
                                       "`handler_block_warning`: its stack (it is not killed for that).",
                                       "Read the stack: a blocking call (requests, time.sleep, a CPU-bound "
                                       "loop) in async code. Move it to `asyncio.to_thread`, or use an async "
                                       "client."),
        "handler_pool_stopped": ("info", "The handler processes stopped at shutdown (`deaths`, "
                                         "`replaced`)."),
        "shard_moved": ("info", "A shard moved to another handler process with a fresh handler instance, "
                                "initialized at its checkpoint."),
        "request_failed_internally": ("error", "A handler process's request (a checkpoint, SQL) failed "
                                               "inside the server: the handler gets the error.",
                                               "Report it with the traceback; the handler got the error and "
                                               "its retries apply."),
        "bindings_close_failed": ("warning", "A handler process could not close its table bindings' "
                                             "client at shutdown.",
                                             "Nothing is lost (the process is exiting). If it repeats, check "
                                             "the table bindings' endpoint."),
        "reloaded": ("info", "SIGHUP or `POST /reload`: the handler module serves from a new generation of "
                             "processes."),
        "reload_failed": ("error", "The reloaded handler module failed to import (the importer's error): "
                                   "the running code keeps serving.",
                                   "Read the importer's error, fix the module and reload again: the old code "
                                   "serves meanwhile."),
    }),
    **_area("coordinator", {
        "commit_log_read": ("info", "At start-up the sink's commit log told what is committed: `windows`, "
                                    "`shards`, `end`."),
        "committed_position_read": ("info", "A shard's committed intervals (`intervals`) and highest "
                                            "position were read from the table (`duration_ms`)."),
        "committed_position_failed": ("warning", "A shard's committed intervals could not be read from the "
                                                 "table: retried.",
                                                 "Check the table's catalog and storage are reachable "
                                                 "(credentials, network); it is retried."),
        "spool_replayed": ("info", "A shard's spooled rows (written at its end) were replayed at start-up."),
        "spooled": ("info", "At a shard end, its uncommitted rows were spooled (fsynced) before "
                            "`SHARD_END`."),
        "spool_deleted": ("info", "A shard's spool was deleted once its windows committed."),
        "lineage": ("info", "A shard's parents became known: its rows follow theirs."),
        "lineage_lookup_failed": ("warning", "ListShards / DescribeStream failed: lineage is what the server "
                                             "saw until the next try.",
                                             "Check the AWS credentials and region for ListShards / "
                                             "DescribeStream (`stream`, `aws_region`, `aws_endpoint_url`); it"
                                             " is retried."),
        "lineage_unknown": ("warning", "A shard ended and the server does not know the stream's shards "
                                       "(no `stream`, no `--source`): its children are guessed; set `stream`.",
                                       "Set `stream` (`--stream`: the Kinesis stream's name or ARN, the "
                                       "DynamoDB stream's ARN) so that the server reads the shards' lineage: "
                                       "children are then ordered after their parents."),
        "child_released": ("info", "A child shard's parents are done: its rows are released into the merge."),
        "duplicates_dropped": ("info", "Rows at or below a committed position (delivered again) were "
                                       "dropped."),
        "event_time_clamped": ("info", "Event times that went backwards within a shard were clamped."),
        "lease_lost_rows_dropped": ("info", "A shard's lease was lost (or a reading of it began that does not continue "
                                            "the one whose rows are still here): its uncommitted rows left the "
                                            "coordinator; the new owner reads them again. `committed`: the shard's "
                                            "committed intervals."),
        "shard_restarted": ("warning", "A `--source` stream was deleted and created again while read: the shard "
                                       "id names a new shard; the old one's uncommitted rows (`rows`) and "
                                       "positions are dropped.",
                                       "Nothing to do if the stream was recreated on purpose; the dropped "
                                       "rows were the old stream's."),
        "backpressure": ("info", "Shards get their status late: a closed window waits behind the one "
                                 "committing (`reason` `sink_behind`: every shard), or the rows buffered "
                                 "passed three quarters of a cap (`buffered_cap`: shards running ahead)."),
        "rows_spilled": ("info", "Rows past `max_buffered_bytes` wait in unlinked files under "
                                 "`<state-dir>/spill/` (once)."),
        "spill_failed": ("error", "Rows could not be spilled to `<state-dir>/spill/`: they stay in memory.",
                                  "Free space in `<state-dir>/spill/` (or fix its permissions): the rows stay"
                                  " in memory meanwhile, past `max_buffered_bytes`."),
        "late_rows_dropped": ("info", "Late rows (their window had closed) were left out of the window they "
                                      "came with and counted (`late_policy` drop)."),
        "late_rows_dead_lettered": ("warning", "Late rows were left out of the window they came with and kept "
                                               "with their data in the dead letters (`late_policy` dead-letter).",
                                               "See [late rows](../troubleshooting.md#late-rows): raise "
                                               "`idle_timeout` or `max_out_of_orderness` or "
                                               "`allowed_lateness`, or use `late_policy = \"next\"`. The rows "
                                               "are in `<state-dir>/dead-letters/rows.jsonl`."),
        "window_committed": ("info", "A closed window was committed to the sink: `window`, `rows`, `late`, "
                                     "`shards`, `duration_ms`."),
        "sink_commit_failed": ("error", "A window's commit failed (the pipeline raised, the sink failed): "
                                        "retried with backoff; no shard checkpoints past it.",
                                        "Read `error` and the traceback: storage unreachable or full (fix it:"
                                        " the window is retried), or a bug in the pipeline or rows the sink "
                                        "cannot take (fix the handler and `mldserver reload`, or the pipeline "
                                        "or the sink's settings and restart: nothing is lost, no shard "
                                        "checkpoints past the rows). See "
                                        "[sink_commit_failed](../troubleshooting.md#sink_commit_failed)."),
        "sink_recovered": ("info", "The sink committed a window after failing it: attempts, failed_for_s."),
        "coordinator_stopped": ("info", "The coordinator stopped: what it committed, dropped and clamped, "
                                        "and its peak memory."),
    }),
    **_area("sinks", {
        "window_already_committed": ("info", "A window offered again (after a crash, a time-out, a "
                                             "conflict) was already committed."),
        "window_handed_over": ("debug", "A window was handed to the Spark process and written (`input_ms`, "
                                        "`spark_ms`)."),
        "schema_inferred": ("info", "The row schema was inferred from the first window, and fixed."),
        "table_created": ("info", "The Iceberg table was created (`table`, `location`, `schema`)."),
        "table_opened": ("info", "The Iceberg table was opened (`table`, `exists`, `server`, `stream`)."),
        "table_maintained": ("info", "Table maintenance ran (`table`, `expired` snapshots, `orphans` files named by "
                                     "nothing removed, their `orphan_bytes`, `young` ones kept for now, "
                                     "`duration_ms`): every `table_maintenance_interval`, or `mldserver table "
                                     "maintain`."),
        "table_maintenance_failed": ("warning", "Table maintenance failed (`table`, `error`): nothing is lost (it "
                                                "only removes what nothing names); it runs again at the next "
                                                "interval.",
                                                "Read `error` (storage, catalog); nothing is lost. Run "
                                                "`mldserver table maintain` by hand to see it again."),
        "table_commit_conflict": ("info", "Another server committed to the table first: the commit reads "
                                          "the new base and filters again."),
        "rows_already_committed": ("info", "Rows of a window were left out: another server had already "
                                           "committed them."),
        "rows_rejected": ("error", "Rows that do not fit the schema were dead-lettered with the reason.",
                                   "The rows do not fit `schema`: read the reason in "
                                   "`<state-dir>/dead-letters/`; fix the handler's rows or the schema."),
    }),
    **_area("spark", {
        "spark_started": ("info", "The Spark process is up (`pid`, `master` or `remote`, "
                                  "`spark_version`, `log`)."),
        "spark_executors": ("info", "The Spark cluster's live executors, first told (`executors`, `hosts`): a "
                                    "cluster master only (local[*] runs none)."),
        "spark_executor_lost": ("warning", "A Spark executor left the cluster (`executor`, `executors` left): a "
                                          "worker died or was stopped; Spark runs its tasks again on the others.",
                                           "Nothing if Spark goes on; if executors keep leaving, look at the "
                                           "Spark cluster's workers (memory, preemption)."),
        "spark_executor_added": ("info", "A Spark executor joined the cluster (`executor`, `executors`)."),
        "spark_process_exited": ("error", "The Spark process exited: restarted with backoff, the window in "
                                          "flight handed over again.",
                                          "Read `<state-dir>/spark/spark.log` (memory: `spark.driver.memory` "
                                          "in `spark_conf`; Java missing or too old). The window is handed "
                                          "over again after the restart."),
        "spark_restart_failed": ("error", "The Spark process could not be started again: the server shuts "
                                          "down and exits 1.",
                                          "Read `<state-dir>/spark/spark.log`: Java 17 or later, pyspark "
                                          "installed (the `spark` extra), `spark_remote` reachable, "
                                          "`spark_start_timeout` long enough. Then restart the server."),
        "spark_stopped": ("info", "The Spark process stopped at shutdown (`restarts`)."),
        "sql_closed": ("debug", "A handler's `context.sql` cursor was closed (`jobs` Spark ran for it)."),
    }),
    **_area("timers", {
        "timers_started": ("info", "The timer scheduler started (`store`, `pending` timers)."),
        "timer_create_refused": ("warning", "`timers.create` was refused before the store (bad "
                                            "arguments).",
                                            "Read the error: a bad `timers.create` argument (a time, a key, a"
                                            " context too large for `timer_context_size`). Fix the call."),
        "timer_write_failed": ("error", "A call's timers could not be written to the store: the action "
                                        "fails (retried, then dead-lettered).",
                                        "Check the timer store (`timer_store`: its DynamoDB table or "
                                        "`<state-dir>` disk); the action is retried."),
        "timer_callback_failed": ("error", "A timer callback raised or timed out: retried after "
                                           "`handler_backoff`.",
                                           "Read the traceback: fix the callback and `mldserver reload`."),
        "timer_callback_stuck": ("error", "A timer callback swallowed its cancellation past "
                                          "`execution_timeout`: abandoned.",
                                          "The callback catches cancellation: re-raise "
                                          "`asyncio.CancelledError`, and avoid blocking calls in async code."),
        "timer_redone": ("warning", "A timer being fired in a handler process that died is fired again, not "
                                    "counted as an attempt.",
                                    "Nothing for this line; see the `handler_process_died` before it."),
        "timer_dead_lettered": ("error", "A timer failed every attempt: dead-lettered with its context to "
                                         "`<state-dir>/dead-letters/_timers.jsonl`.",
                                         "Read the reason and the timer's context in "
                                         "`<state-dir>/dead-letters/_timers.jsonl`; fix the callback and "
                                         "create the timer again from there: it is not fired again by itself."),
        "timer_claim_failed": ("error", "Due timers could not be claimed in the DynamoDB store: retried.",
                                        "Check the DynamoDB timer table (throttling, credentials); it is "
                                        "retried."),
        "timer_store_failed": ("error", "The timer store failed (read, claim or delete): retried with "
                                        "backoff.",
                                        "Check the timer store (the DynamoDB table, or the disk of "
                                        "`<state-dir>`); it is retried, and `timer_store_recovered` says when"
                                        " it answers again."),
        "timer_store_recovered": ("warning", "The timer store answers again after failures.",
                                             "Nothing: the store answers again. Look at the failures before "
                                             "it if they repeat."),
    }),
    **_area("sources", {
        "source_started": ("info", "A `--source` started: its `stream`, where it `start`s, "
                                   "`saved_shards`."),
        "source_stream_replaced": ("warning", "The table's stream was replaced: the saved positions name the "
                                              "old stream's shards.",
                                              "Nothing if the table's stream was disabled and enabled again "
                                              "on purpose: the new stream's shards start from `--from`, and "
                                              "what the old one still held is not read. `--reset-positions` "
                                              "deletes the saved positions."),
        "source_stream_recreated": ("warning", "The stream was deleted and created again under its name (a "
                                               "Kinesis stream's creation time changed; with `running`, a table's "
                                               "latest stream too, noticed while read): the saved positions were "
                                               "the old stream's and are dropped; while running, the new stream is "
                                               "read from its trim horizon.",
                                               "Nothing if it was recreated on purpose: the new stream's "
                                               "shards start from `--from` (from its trim horizon when "
                                               "noticed while running)."),
        "source_stream_deleted": ("warning", "The stream (or the table's stream) is gone while read: its shards "
                                             "are not read until it is created again (then from its trim horizon).",
                                             "Create the stream again (or enable the table's stream), or stop"
                                             " the server if it was removed on purpose."),
        "source_shard_gone": ("info", "A shard being read is gone from the stream (trimmed away): it ends here."),
        "source_position_invalid": ("error", "A shard's position is not in the stream (past its end, not its "
                                             "shard's: the service's ResourceNotFound, InvalidArgument or "
                                             "Validation answer): the server stops with one line (exit 2); "
                                             "`--reset-positions` deletes the positions.",
                                             "A position of another stream, or past its retention: start with"
                                             " `--reset-positions` (and `--from` to choose where), which "
                                             "deletes the saved positions."),
        "source_list_failed": ("warning", "Listing a source's shards failed: retried at the next "
                                          "discovery.",
                                          "Check the credentials, region and endpoint (`aws_region`, "
                                          "`AWS_ENDPOINT_URL_*`); it is retried."),
        "source_shard_lease_taken": ("info", "This server took shard leases (`--lease-table`): free, expired or "
                                             "stolen from a server over its share (`shards`, `stolen`, `was`, "
                                             "`held`, `servers`, `target`); it reads them from their stored "
                                             "positions."),
        "source_shard_lease_lost": ("info warning", "A shard's lease was lost (warning: stolen by a peer, or not "
                                                    "renewed within a period, `reason`; info: the shard's reading "
                                                    "then stopped and its handler got `leaseLost`, `position` the "
                                                    "last stored).",
                                                    "At the warning: another server took the shard (nothing "
                                                    "to do) or this one could not renew in time (check the "
                                                    "lease table's reachability and `lease_period`)."),
        "source_shard_lease_released": ("info", "At a clean stop this server released its shard leases "
                                                "(`shards`, `count`): peers take them at their next cycle."),
        "source_lease_unreachable": ("warning", "The lease table could not be read or written: retried; a lease "
                                                "not renewed for a period is lost and its shard stops.",
                                                "Check the lease table (`lease_table`: DynamoDB reachable, "
                                                "throttled?); shards stop if it stays unreachable for "
                                                "`lease_period`."),
        "source_lease_release_failed": ("warning", "Releasing a shard's lease failed: a peer takes it over once it "
                                                   "expires.",
                                                   "Nothing: the lease expires and a peer takes it over after"
                                                   " `lease_period`."),
        "source_positions_write_failed": ("warning", "Writing a shard's position into its lease item failed: "
                                                     "retried while the lease lasts; the checkpoint's reply waits.",
                                                     "Check the lease table (DynamoDB throttling, "
                                                     "credentials); it is retried while the lease lasts."),
        "source_shard_started": ("info", "A source's shard began to be read (`start`, `position`, "
                                         "`parents`)."),
        "source_shard_ended": ("info", "A source's shard was read to its end (`children`)."),
        "source_shard_end_not_stored": ("error", "A source's shard ended but `SHARD_END` was not stored: "
                                                 "it is read again at the next start.",
                                                 "Make the handler's `shard_ended` call `await "
                                                 "checkpointer.checkpoint()` with no argument (the default "
                                                 "does): the shard's children are not read until `SHARD_END` "
                                                 "is stored, after a restart reads the shard to its end "
                                                 "again."),
        "source_shard_closed": ("warning", "The server closed a source shard's connection: it is read "
                                           "again at the next start.",
                                           "Look at the lines before it for why (a handler failure, a "
                                           "shutdown); the shard is read again at the next start."),
        "source_throttled": ("warning", "The stream service throttled a read: backoff with jitter.",
                                        "Nothing if it is rare. Often: more readers than the stream allows (5"
                                        " reads a second a shard for Kinesis): raise `source_poll_interval`, "
                                        "or use fewer servers per stream."),
        "source_iterator_expired": ("info", "A shard iterator expired: a fresh one from the last position."),
        "source_records_trimmed": ("error", "Records left the stream before they were read (`after` the "
                                            "last position): reading restarts at the trim horizon.",
                                            "The server read slower than the stream's retention: those "
                                            "records are lost to it. Read faster (more servers, `--workers`),"
                                            " or raise the stream's retention."),
        "source_read_failed": ("warning", "A read from the stream failed: retried with backoff.",
                                          "Nothing if it passes; if it repeats, check the credentials, the "
                                          "region and the endpoint."),
        "source_read_recovered": ("info", "Reads succeed again after failures (`attempts`)."),
        "source_stopped": ("info", "A `--source` stopped at shutdown (`shards`)."),
    }),
    **_area("daemon (mldserver run)", {
        "daemon_started": ("info", "The KCL MultiLangDaemon started as the server's child (`pid`, "
                                   "`properties`, `log`, `worker_id`), tethered: it dies with the server."),
        "daemon_leftover_stopped": ("warning", "At start-up, a daemon an earlier run of this state dir left "
                                               "running (`pid`) was SIGKILLed before the server listened.",
                                               "Nothing: an earlier `mldserver run` was killed without "
                                               "stopping its daemon. Stop runs with SIGTERM or Ctrl-C."),
        "executable_overridden": ("info", "The properties file's `executableName` was replaced by this "
                                          "server's relay."),
        "jaxb_missing": ("warning", "No JAXB jar for the daemon: one malformed KPL aggregate would make it "
                                    "exit (`MLDSERVER_JAXB_JAR`).",
                                    "Install the JAXB API jar (Debian `libjaxb-api-java`) or set "
                                    "`MLDSERVER_JAXB_JAR` to it."),
        "properties_error": ("error", "`mldserver check` would call this line of the properties file an "
                                      "error (the daemon is started anyway).",
                                      "Fix the line `mldserver check --properties FILE` names: the daemon may"
                                      " fail on it."),
        "properties_warning": ("warning", "A warning about a line of the properties file, as "
                                          "`mldserver check` prints it.",
                                          "Read it and fix the line if it is not what you meant (`mldserver "
                                          "check --properties FILE`)."),
        "daemon_lease_taken": ("info", "The daemon took `leases` (from its log)."),
        "daemon_lease_lost": ("info warning", "The daemon lost a shard's lease (from its log).",
                                              "Nothing if another worker took the shard; if leases move back "
                                              "and forth, give `failoverTimeMillis` more time, or look at the"
                                              " workers' clocks and load."),
        "daemon_error": ("debug info warning error", "A message of the daemon's that is an ERROR or carries an "
                                                     "exception, its stack trace included, as one event at the "
                                                     "daemon's own level (`line`: its first, `exception`, "
                                                     "`caused_by`, `lines`, `text`).",
                                                     "Read `line` and `caused_by`: credentials, the lease table, "
                                                     "CloudWatch (`metricsLevel = NONE` locally). An error the "
                                                     "daemon recovers from needs nothing."),
        "daemon_stopping": ("info", "SIGTERM to the daemon: each shard gets `shutdownRequested` within "
                                    "`shutdownGraceMillis`."),
        "daemon_killed": ("warning", "The daemon did not stop within its grace and a margin: killed.",
                                     "Nothing is lost (uncheckpointed records come again). Look at the "
                                     "daemon's log for why it did not stop."),
        "daemon_stopped": ("info", "The daemon stopped (`returncode`, `clean`)."),
        "daemon_exited": ("error", "The daemon exited by itself (`returncode`, `last_error`): the server "
                                   "shuts down and exits 1.",
                                   "Read `last_error` and the daemon's log: its properties (`mldserver check "
                                   "--properties FILE`), Java, credentials, the stream. Restart: the server "
                                   "resumes from the checkpoints."),
    }),
    **_area("state directory", {
        "state_write_failed": ("error", "A write to the state directory failed (`errno`: a full disk?): "
                                        "retried with backoff until it succeeds; the shard's status waits.",
                                        "Free space on the state directory's disk (or fix its permissions): "
                                        "writes resume by themselves."),
        "state_write_recovered": ("warning", "A state write succeeded after failures (`attempts`, "
                                             "`waited_ms`).",
                                             "Nothing: the state directory takes writes again."),
        "dead_lettered": ("error", "What could not be processed was written with its data to "
                                   "`<state-dir>/dead-letters/` (`reason`, `path`).",
                                   "Read `reason` and the file at `path`; fix the handler (or the producer), "
                                   "then `mldserver redrive` sends the records through again."),
        "batch_bisected": ("warning", "A batch failed whole after its retries: it was split until only the "
                                      "records that fail alone were left (dead-lettered); the others handled.",
                                      "Nothing for the records handled; the ones that fail alone are "
                                      "dead-lettered (`dead_lettered`): fix and `mldserver redrive`."),
        "dead_letter_failed": ("error", "A dead letter could not be written whole (`path`, `error`).",
                                        "Check the state directory's disk (space, permissions): the failed "
                                        "data is only in this log line now."),
        "failed_records_unknown": ("error", "The handler named failed records its batch does not have (a "
                                            "defect: report it).",
                                            "Report it with the line: the handler's side named records its "
                                            "batch does not have (a defect of ours). The records it did name "
                                            "are dead-lettered."),
    }),
}

# Log calls whose event is not a string at the call, by "path:function": what they can
# emit (``emitted`` resolves a module-level constant, ``EVENT = "..."``, itself).
COMPUTED: dict[str, dict[str, tuple[str, ...]]] = {
    "mldserver/ops/daemon.py:_told": {  # ops.daemon.PATTERNS: lines of the daemon's log
        "daemon_lease_taken": ("info",), "daemon_lease_lost": ("info", "warning")},
    "mldserver/ops/daemon.py:_error": {  # at the daemon's own level (ops.daemon_messages.LEVELS)
        "daemon_error": ("debug", "info", "warning", "error")},
    "mldserver/ops/daemon.py:report": {  # "properties_" + a finding's level
        "properties_error": ("error",), "properties_warning": ("warning",)},
}


class Site(NamedTuple):
    path: str  # relative to the package's parent: mldserver/shard/driver.py
    line: int
    function: str
    level: str
    fields: tuple[str, ...]  # the keyword arguments given at the call


def emitted(root: Path | None = None) -> tuple[dict[str, list[Site]], list[str]]:
    """What the package's source logs: event -> its call sites, and the log calls whose
    event could not be read (neither a string, a module constant nor in ``COMPUTED``).

    A log call is a call of ``debug``/``info``/``warning``/``error`` on something whose
    name says log (``log``, ``self.log``, ``wire.log``, ``get_logger(...)``), of either
    of two such methods (``(log.debug if initial else log.info)(...)``), or of
    ``getattr(<log>, level)``. Calls on ``context.log`` are a handler's own events."""
    root = root or Path(__file__).resolve().parents[1]
    found: dict[str, list[Site]] = {}
    unread: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel == "mldserver/base/logs.py":
            continue
        tree = ast.parse(path.read_text(), rel)
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
        for function, call in _calls(tree):
            levels, receiver = _log_call(call.func)
            if not levels or "log" not in receiver.lower() or receiver.endswith("context.log"):
                continue
            fields = tuple(k.arg for k in call.keywords if k.arg and k.arg != "exc_info")
            first = call.args[0] if call.args else None
            if levels == ("computed",):  # getattr(log, level)(...): only COMPUTED says what
                names = COMPUTED.get(f"{rel}:{function}", {})
                if not names:
                    unread.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:120]}")
                    continue
            elif isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = {first.value: levels}
            elif isinstance(first, ast.Name) and first.id in constants:
                names = {constants[first.id]: levels}
            elif f"{rel}:{function}" in COMPUTED:
                names = COMPUTED[f"{rel}:{function}"]
            else:
                unread.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:120]}")
                continue
            for name, levels in names.items():
                for lv in levels:
                    found.setdefault(name, []).append(Site(rel, call.lineno, function, lv, fields))
    return found, unread


def _calls(tree: ast.AST):
    """(enclosing function's name, call) for every call in ``tree``."""
    def visit(node: ast.AST, function: str):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, name)
    yield from visit(tree, "<module>")


def _log_call(func: ast.expr) -> tuple[tuple[str, ...], str]:
    """(levels, receiver's text) if ``func``, what a call calls, looks like a logger's
    method: ``log.info``, ``(log.debug if initial else log.info)``, or
    ``getattr(log, level)`` (levels ``("computed",)``); else ((), "")."""
    if isinstance(func, ast.Attribute) and func.attr in LEVELS + ("exception", "critical"):
        return (func.attr,), ast.unparse(func.value)
    if isinstance(func, ast.IfExp):
        (a, receiver), (b, other) = _log_call(func.body), _log_call(func.orelse)
        return (a + b, receiver) if a and b and receiver == other else ((), "")
    if (isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr"
            and func.args):
        return ("computed",), ast.unparse(func.args[0])
    return (), ""
