"""The admin endpoint: metrics, health, status and the lifecycle over HTTP (aiohttp),
on loopback by default (``--admin 127.0.0.1:7071``; ``--admin off`` disables it; an
embedded ``Server`` has none unless ``Settings.admin`` names one)::

    GET  /          JSON: these endpoints, each with what it answers
    GET  /metrics   Prometheus text from the server's own registry (mldserver.server.metrics)
    GET  /healthz   200 "ok" while the loop answers and every task the server owns is
                    alive; 503 and the reason otherwise
    GET  /readyz    200 once listening and, with a pipeline, the Spark session up and the
                    commit log read; 503 and what is missing before
    GET  /status    JSON: each shard, the coordinator, Spark (see ``status_of``)
    POST /pause     actions under way finish; the next one of every shard waits before
                    its handler is called; commits and checkpoints go on
    POST /resume    every shard goes on from exactly where it stopped
    POST /reload    what SIGHUP does (``Server.reload()``): 200 once the new code serves, 500 if it
                    failed to import (the old code keeps serving), 409 with ``--workers 0``
    POST /redrive   the dead-lettered records through the current handler, into the sink
                    (mldserver.server.redrive): 200 once their rows are committed (or
                    ``?timeout=SECONDS``, default 300, has passed), with what was redriven,
                    what failed again and what is left; 409 while paused or during another

    $ curl -s 127.0.0.1:7071/readyz
    ready
    $ curl -s -XPOST 127.0.0.1:7071/pause
    {"paused":true,"changed":true}

The GETs are always open (Prometheus scrapes /metrics with no credentials). The POSTs
(``/redrive`` too) need the admin token (``Authorization: Bearer TOKEN``; mldserver.server.admin_token) when
there is one: ``--admin-token-file FILE`` always makes one; an endpoint that listens
beyond loopback (``--admin 0.0.0.0:7071``) always has one, the state directory's
``admin-token`` (generated at its first start, mode 0600) unless a file is given. A
token that cannot be read stops the start with a ConfigError. Without a token, or with
a wrong one, a POST is a 401 that changes nothing::

    $ curl -s -XPOST 10.0.0.5:7071/pause
    {"error":"POST /pause needs the admin token: ..."}
    $ curl -s -XPOST -H "Authorization: Bearer $(cat mldserver-state/admin-token)" 10.0.0.5:7071/pause
    {"paused":true,"changed":true}

Whatever reaches the port cannot hurt the shards: at most 64 connections are open at
once (one more is answered 503 and closed, logged as ``admin_busy`` at most once a
minute), a request's headers must arrive within 10 s of the connection (else 408), and
a keep-alive connection idle for 15 s is closed (mldserver.server.admission).

The token travels in clear text: beyond a private network, put TLS in front. Once bound
it logs ``admin_listening`` with the address (and ``token_file``, where the POSTs' token
is: never the token); a port in use is a ConfigError naming ``--admin``.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..errors import ConfigError
from .admin_token import Token, bearer, in_state_dir, matches, read as read_token
from ..base.config import admin_address
from ..base.logs import get_logger
from .admission import IDLE_TIMEOUT_S, Admission

log = get_logger("mldserver.admin")

GETS = ("/metrics", "/healthz", "/readyz", "/status")
POSTS = ("/pause", "/resume", "/reload", "/redrive")
DEFAULT_REDRIVE_TIMEOUT = 300.0  # s POST /redrive waits for its rows to be committed
MAX_REDRIVE_TIMEOUT = 86_400.0
BACKLOG = 64  # connections the kernel holds before we accept them: not ours to count, but few
USAGE = f"GET {', '.join(GETS)}; POST {', '.join(POSTS)}"


ENDPOINTS = {
    "GET /metrics": "Prometheus metrics",
    "GET /healthz": "200 while the server and every task it owns are alive, else 503 and why",
    "GET /readyz": "200 once it serves shards (and Spark is up, with a pipeline), else 503 and what is missing",
    "GET /status": "JSON: each shard, the coordinator, Spark",
    "POST /pause": "hold every shard before its next handler call",
    "POST /resume": "go on from where each shard stopped",
    "POST /reload": "import the handler module afresh (SIGHUP)",
    "POST /redrive": "send the dead-lettered records through the current handler, into the sink (?timeout=SECONDS)",
}


class Admin:
    def __init__(self, server: Any, value: str, token_file: str | None = None) -> None:
        self.server = server
        self.value = value
        self.address = admin_address(value)
        self.token_file = token_file
        self.token: Token | None = None  # set by prepare(): the POSTs need it
        self.bound: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.admission: Admission | None = None  # set by start(): its connections, counted and capped
        self._prepared = False

    async def prepare(self, state_dir: Path) -> None:
        """Read the token, before anything starts: ``--admin-token-file``'s, else, beyond
        loopback, the state directory's (generated there if missing). A token that cannot
        be read or written is a ConfigError: no endpoint beyond loopback without one."""
        self._prepared = True
        if self.address is None:
            return
        if self.token_file:
            path = Path(self.token_file)
            value = await asyncio.to_thread(read_token, path, "--admin-token-file")
            self.token = Token(value, path)
        elif not await _loopback(*self.address):
            try:
                self.token = await asyncio.to_thread(in_state_dir, state_dir)
            except ConfigError as exc:
                raise ConfigError(f"--admin {self.value} listens beyond loopback, where POST /pause, /resume and "
                                  f"/reload need a token, and there is none: {exc}") from None
            if self.token.generated:
                log.info("admin_token_generated", file=str(self.token.path),
                         what_to_do="POST /pause, /resume and /reload need it (Authorization: Bearer TOKEN, the "
                                    "file's content); mldserver pause|resume|reload|redrive read it from the state "
                                    "directory on this machine (--state-dir)")

    async def start(self) -> None:
        if not self._prepared:  # never bound without its token decided
            await self.prepare(Path(self.server.settings.state_dir))
        if self.address is None:
            return
        host, port = self.address
        app = web.Application(middlewares=[_errors, self._guard])
        app.add_routes([
            web.get("/", self.index),
            web.get("/metrics", self.metrics),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/status", self.status),
            web.post("/pause", self.pause),
            web.post("/resume", self.resume),
            web.post("/reload", self.reload),
            web.post("/redrive", self.redrive),
        ])
        runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=IDLE_TIMEOUT_S)
        await runner.setup()
        assert runner.server is not None
        self.admission = Admission(runner.server)
        try:
            # Served through Admission, not a TCPSite: its cap and header time-out keep the admin
            # side's file handles well below the limit the shard listener shares.
            self._listener = await asyncio.get_running_loop().create_server(
                self.admission, host, port, backlog=BACKLOG, reuse_address=True)
        except (OSError, socket.gaierror) as exc:
            await runner.cleanup()
            reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"--admin {self.value}: {host}:{port} is already in use: stop what listens "
                                  f"there, or choose another --admin HOST:PORT (port 0 picks one; off disables)"
                                  ) from None
            raise ConfigError(f"--admin {self.value}: cannot listen there ({reason})") from None
        self._runner = runner
        self.bound = self._listener.sockets[0].getsockname()[:2]
        guarded = {} if self.token is None else {"token_file": str(self.token.path)}
        log.info("admin_listening", host=self.bound[0], port=self.bound[1],
                 url=f"http://{_hostport(*self.bound)}/", **guarded)

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()  # no new connection; the runner's clean-up closes the open ones
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """With a token, anything but a read needs it: a 401 before the handler runs."""
        if self.token is None or request.method in ("GET", "HEAD"):
            return await handler(request)
        header = request.headers.get("Authorization")
        if matches(header, self.token.value):
            return await handler(request)
        given = bearer(header) is not None
        log.warning("admin_refused", method=request.method, path=request.path, peer=request.remote,
                    reason="wrong token" if given else "no token")
        challenge = 'Bearer realm="mldserver admin"' + (', error="invalid_token"' if given else "")
        what = "the token given is not the admin token" if given else \
            f"{request.method} {request.path} needs the admin token"
        return _json({"error": f"{what}: send Authorization: Bearer TOKEN, TOKEN being the content of the server's "
                               f"--admin-token-file, or of admin-token in its state directory (mldserver "
                               f"pause|resume|reload|redrive on the server's machine read it: --state-dir DIR or "
                               f"--admin-token-file FILE)"},
                     status=401, headers={"WWW-Authenticate": challenge})

    # -- GET -------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        return web.json_response({"endpoints": ENDPOINTS})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        reason = self.server.unhealthy()
        if reason is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"unhealthy: {reason}\n")

    async def readyz(self, request: web.Request) -> web.Response:
        missing = self.server.not_ready()
        if missing is None:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {missing}\n")

    async def status(self, request: web.Request) -> web.Response:
        return _json(status_of(self.server))

    # -- POST ------------------------------------------------------------------------

    async def pause(self, request: web.Request) -> web.Response:
        return _json({"paused": True, "changed": self.server.pause()})

    async def resume(self, request: web.Request) -> web.Response:
        return _json({"paused": False, "changed": self.server.resume()})

    async def reload(self, request: web.Request) -> web.Response:
        task = self.server.reload()
        if task is None:
            return _json({"reloaded": False, "error": "handlers run in the server's loop (--workers 0): nothing can "
                                                      "be imported again; restart the server to load new handler code"},
                         status=409)
        if not await asyncio.shield(task):
            return _json({"reloaded": False, "error": "the handler module failed to import (reload_failed in the "
                                                      "server's log has the importer's error); the running code "
                                                      "keeps serving"}, status=500)
        return _json({"reloaded": True})


    async def redrive(self, request: web.Request) -> web.Response:
        from ..sources.feed import FeedClosed  # (the sources' package: loaded by a redrive, or --source)
        from .redrive import Busy

        try:
            timeout = float(request.query.get("timeout", DEFAULT_REDRIVE_TIMEOUT))
        except ValueError:
            timeout = math.nan
        if not 0 < timeout <= MAX_REDRIVE_TIMEOUT:
            return _json({"error": f"timeout={request.query.get('timeout')}: seconds, more than 0 and at most "
                                   f"{MAX_REDRIVE_TIMEOUT:g}"}, status=400)
        try:
            # shielded: a client that goes away does not stop a redrive half-way (it finishes, and logs)
            result = await asyncio.shield(self.server.redrive(timeout))
        except Busy as exc:
            return _json({"error": str(exc)}, status=409)
        except FeedClosed as exc:
            return _json({"error": f"the server closed the redrive's connection ({exc}): it is shutting down; "
                                   f"nothing was removed"}, status=503)
        return _json(result.answer())


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """A wrong path or method answers in one line what exists, as JSON."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return _json({"error": f"{request.method} {request.path}: use {allowed} {request.path} ({USAGE})"},
                     status=405, headers={"Allow": allowed})
    except web.HTTPNotFound:
        return _json({"error": f"{request.method} {request.path}: no such path ({USAGE})"}, status=404)


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE), status=status,
                        content_type="application/json", headers=headers)


async def _loopback(host: str, port: int) -> bool:
    """Does ``host`` name this machine's loopback only (every address it resolves to)?
    A name that does not resolve counts as beyond: binding it fails anyway."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, socket.gaierror):
        return False
    addresses = {info[4][0] for info in infos}
    try:
        return bool(addresses) and all(ipaddress.ip_address(a.partition("%")[0]).is_loopback for a in addresses)
    except ValueError:
        return False


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _ms(value: float) -> int | None:
    return int(value) if math.isfinite(value) else None


def status_of(server: Any) -> dict[str, Any]:
    """What ``GET /status`` answers (and ``mldserver status`` shows)::

        {"version": "0.1.0", "pid": 41800, "handler": "handlers.orders:Orders",
         "state_dir": "/srv/orders/mldserver-state",
         "paused": false, "ready": true, "listening": "127.0.0.1:7070",
         "shards": [{"shard_id": "shardId-000000000001", "conn": 3, "state": "READY",
                     "callback": null, "last_action": "processRecords", "last_action_age_s": 0.2,
                     "records": 120000, "batches": 240, "millis_behind_latest": 0,
                     "watermark": 1763800000000, "checkpoint": "49590...:0",
                     "handler_process": 41822}, ...],
         "coordinator": {"global_watermark": 1763799995000, "open_windows": 2, "buffered_rows": 4100,
                         "buffered_bytes": 390000, "windows_committed": 12, "late_rows": 0,
                         "last_commit": {"window": "...", "rows": 5200, "late": 0, "age_s": 3.1},
                         "sink_failing": null},
         "spark": {"state": "up", "restarts": 0, "last_error": null, "executors": null, "executors_lost": 0},
         "sources": [{"source": "kinesis:clicks", "stream": "arn:aws:kinesis:...:stream/clicks",
                      "shards": [{"shard_id": "shardId-000000000001", "lag_ms": 0}],
                      "lease": {"table": "clicks-leases", "owner": "host-a:4242:9f2c1e07",
                                "held": ["shardId-000000000001"], "shards": 4, "servers": 2}}]}

    ``version``, ``pid``, ``handler`` and ``state_dir`` (absolute) name the server that
    answers: which process, running what, keeping its state where (``mldserver status``'s
    first line).

    ``sources``: each ``--source`` and its shards being read, ``lag_ms`` how far behind
    the shard's head the last page read was (Kinesis's MillisBehindLatest; DynamoDB, the
    age of the last change read; null before the first page); with ``--lease-table``
    the shard leases this server holds (``held``), of the shards that may be read now,
    and how many servers hold live leases of them, this one included (``lease`` null
    without one).
    """
    now = time.time()
    coordinator = server.coordinator
    snapshot = coordinator.status() if coordinator is not None else None
    shards = []
    for shard in sorted((d.status() for d in list(server.drivers.values())), key=lambda s: s.conn or 0):
        stored = shard.stored
        mark = snapshot.watermarks.get(shard.shard_id, -math.inf) if snapshot and shard.shard_id else math.nan
        shards.append({
            "shard_id": shard.shard_id,
            "conn": shard.conn,
            "state": shard.state,
            "callback": shard.callback,
            "last_action": shard.last_action,
            "last_action_age_s": shard.last_action_age_s,
            "records": shard.records,
            "batches": shard.batches,
            "millis_behind_latest": shard.millis_behind_latest,
            "watermark": _ms(mark),
            "checkpoint": None if stored is None else f"{stored.text}:{stored.sub}",
            "handler_process": shard.handler_process,
        })
    settings = server.settings
    out: dict[str, Any] = {
        "version": sys.modules[__name__.partition(".")[0]].__version__,  # the package ran before this module
        "pid": os.getpid(),
        "handler": settings.handler or None,
        "state_dir": str(Path(settings.state_dir).resolve()),
        "paused": server.paused,
        "paused_since": server.pause_gate.since,
        "waiting_actions": server.pause_gate.waiting,
        "ready": server.not_ready() is None,
        "listening": server.address if isinstance(server.address, str) or server.address is None
        else _hostport(*server.address),
        "loop_lag_max_ms": round(server.loop_lag.worst * 1000, 1),
        "shards": shards,
        "coordinator": None,
        "spark": None,
        "sources": [reader.status() for reader in getattr(server, "sources", ())],
    }
    if snapshot is not None:
        last = snapshot.last_commit
        out["coordinator"] = {
            "global_watermark": _ms(snapshot.global_watermark),
            "open_windows": snapshot.open_windows,
            "buffered_rows": snapshot.buffered_rows,
            "buffered_bytes": snapshot.buffered_bytes,
            "windows_committed": snapshot.windows_committed,
            "rows_committed": snapshot.rows_committed,
            "late_rows": snapshot.late_rows,
            "last_commit": None if last is None else {"window": last.window, "rows": last.rows, "late": last.late,
                                                      "age_s": round(now - last.at, 3)},
            "sink_failing": None if (f := snapshot.sink_failing) is None else {
                "window": f.window, "error": f.error, "attempts": f.attempts, "for_s": round(now - f.since, 3)},
        }
    if server.spark is not None:
        out["spark"] = {"state": server.spark.state, "restarts": server.spark.restarts,
                        "last_error": server.spark.last_error, "executors": server.spark.executors,
                        "executors_lost": server.spark.executors_lost}
    return out
