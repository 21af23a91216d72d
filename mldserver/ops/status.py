"""``mldserver status``, ``pause``, ``resume``, ``reload``: the admin endpoint from a
terminal. ``status`` draws ``GET /status`` as a table (``--watch`` redraws it every
second); the others POST and print the answer::

    $ mldserver status
    mldserver 0.1.0  pid 41800  handler handlers.orders:Orders  state dir /srv/orders/mldserver-state
    server 127.0.0.1:7070  ready  running  loop lag max 3.1 ms
    coordinator  watermark 10:42:01.250 (lag 5.2 s)  open windows 2  buffered 4,100 rows / 390 kB
                 committed 12 windows, 61,000 rows, 0 late  last commit 3.1 s ago (5,200 rows)
    spark        up  restarts 0
    SHARD                 CONN STATE       LAST ACTION (AGE)        RECORDS   BEHIND MS  WATERMARK     CHECKPOINT
    shardId-000000000001     3 READY       processRecords (0.2 s)   120,000           0  10:42:01.250  4959...:0
    SOURCE          SHARD                 LAG MS
    kinesis:clicks  shardId-000000000001       0

(the first line names the server that answers: its version, process id, handler and
state directory, then where it listens; the sources' rows: each ``--source`` shard being
read, how far behind its head).

No server answering is one line naming the URL tried, exit status 1. The POSTs send the
admin token when there is one (``Authorization: Bearer``): ``--admin-token-file``'s, else
the server's state directory's ``admin-token`` (``--state-dir``, default
./mldserver-state), which a server listening beyond loopback generates; a 401 says
where the token is looked for, exit status 1.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any, TextIO

from ..server import admin_token
from ..base.config import DEFAULT_ADMIN

TIMEOUT_S = 5.0


class AdminUnreachable(Exception):
    """No admin endpoint answered at the URL (exit status 1)."""


def base_url(admin: str | None) -> str:
    url = (admin or DEFAULT_ADMIN).rstrip("/")
    return url if "://" in url else f"http://{url}"


def request(admin: str | None, method: str, path: str, token: str | None = None,
            timeout: float = TIMEOUT_S) -> tuple[int, Any]:
    """(HTTP status, the decoded JSON answer) or AdminUnreachable."""
    url = base_url(admin) + path
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, {"error": body.decode("utf-8", "replace").strip()}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AdminUnreachable(f"no mldserver admin endpoint answers at {url} ({reason}): is the server running, "
                          f"with its admin endpoint there? (pass --admin URL)") from None


def command(admin: str | None, action: str, out: TextIO, token: admin_token.Token | None = None) -> int:
    """``pause``, ``resume``, ``reload``: POST (with the token, if any), print the answer; exit status."""
    status, answer = request(admin, "POST", f"/{action}", None if token is None else token.value)
    if status == 401:
        said = (f"the admin endpoint refused the token in {token.path}: pass the server's own with "
                f"--admin-token-file FILE, or --state-dir DIR (the server's, where it wrote admin-token)"
                if token is not None else
                "the admin endpoint needs its token, and none was found: pass --state-dir DIR (the server's, "
                "where it wrote admin-token) or --admin-token-file FILE")
        out.write(f"mldserver {action}: {said}\n")
        return 1
    if status >= 400:
        out.write(f"mldserver {action}: {answer.get('error', answer)}\n")
        return 1
    out.write(json.dumps(answer) + "\n")
    return 0


def show(admin: str | None, out: TextIO, *, watch: bool = False, interval: float = 1.0) -> int:
    while True:
        _, snapshot = request(admin, "GET", "/status")
        text = render(snapshot)
        if not watch:
            out.write(text)
            return 0
        out.write("\x1b[H\x1b[2J" + f"{base_url(admin)}/status  every {interval:g} s (Ctrl-C to stop)\n" + text)
        out.flush()
        time.sleep(interval)


def _clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def render(s: dict[str, Any]) -> str:
    lines = [f"mldserver {s.get('version') or '(version unknown)'}  pid {s.get('pid') or '-'}  "
             f"handler {s.get('handler') or '-'}  state dir {s.get('state_dir') or '-'}"]
    state = "PAUSED" + (f" ({s['waiting_actions']} actions waiting)" if s.get("waiting_actions") else "") \
        if s["paused"] else "running"
    lines.append(f"server {s['listening'] or '-'}  {'ready' if s['ready'] else 'NOT READY'}  {state}  "
                 f"loop lag max {s['loop_lag_max_ms']} ms")
    c = s.get("coordinator")
    if c is not None:
        mark = c["global_watermark"]
        lag = f" (lag {time.time() - mark / 1000:.1f} s)" if mark is not None else ""
        last = c["last_commit"]
        commit = "none yet" if last is None else f"{last['age_s']:.1f} s ago ({last['rows']:,} rows)"
        lines.append(f"coordinator  watermark {_clock(mark)}{lag}  open windows {c['open_windows']}  "
                     f"buffered {c['buffered_rows']:,} rows / {c['buffered_bytes'] / 1000:,.0f} kB")
        lines.append(f"             committed {c['windows_committed']:,} windows, {c['rows_committed']:,} rows, "
                     f"{c['late_rows']:,} late  last commit {commit}")
        failing = c.get("sink_failing")
        if failing:
            lines.append(f"             SINK FAILING for {failing['for_s']:.0f} s, window {failing['window']}, "
                         f"{failing['attempts']} attempts: {failing['error']}")
    sp = s.get("spark")
    if sp is not None:
        lines.append(f"spark        {sp['state']}  restarts {sp['restarts']}"
                     + (f"  last error: {sp['last_error']}" if sp["last_error"] else ""))
    for src in s.get("sources") or ():
        held = src["lease"]
        lease = "" if held is None else (f"  leases {len(held['held'])} of {held['shards']} shards in "
                                         f"{held['table']}, {held['servers']} servers"
                                         + (f": {', '.join(held['held'])}" if held["held"] else ""))
        lines.append(f"source       {src['source']}  {len(src['shards'])} shards read{lease}")
    header = ("SHARD", "CONN", "STATE", "LAST ACTION (AGE)", "RECORDS", "BEHIND MS", "WATERMARK", "CHECKPOINT",
              "PROCESS")
    rows = [header]
    for sh in s["shards"]:
        action = sh["last_action"] or "-"
        if sh["last_action_age_s"] is not None:
            action += f" ({sh['last_action_age_s']:.1f} s)"
        if sh["callback"]:
            action += f" in {sh['callback']}"
        checkpoint = sh["checkpoint"] or "-"
        if len(checkpoint) > 16:
            checkpoint = "..." + checkpoint[-13:]
        rows.append((sh["shard_id"] or "(not initialized)", str(sh["conn"]), sh["state"], action,
                     _n(sh["records"]), _n(sh["millis_behind_latest"]), _clock(sh["watermark"]), checkpoint,
                     _n(sh["handler_process"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = {1, 4, 5}
    for r in rows:
        lines.append("  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
                     .rstrip())
    if not s["shards"]:
        lines.append("(no shard connected)")
    sources = [("SOURCE", "SHARD", "LAG MS")] + [(src["source"], sh["shard_id"], _n(sh["lag_ms"]))
                                                 for src in s.get("sources") or () for sh in src["shards"]]
    if len(sources) > 1:
        widths = [max(len(r[i]) for r in sources) for i in range(3)]
        for r in sources:
            lines.append(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2].rjust(widths[2])}")
    return "\n".join(lines) + "\n"


def main(args: Any) -> int:
    out = sys.stdout
    if args.command == "status":
        try:
            return show(args.admin, out, watch=args.watch, interval=args.interval)
        except KeyboardInterrupt:
            return 0
    return command(args.admin, args.command, out, admin_token.for_client(args.admin_token_file, args.state_dir))
