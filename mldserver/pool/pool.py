"""The pool of handler processes (``workers`` of them) and its supervision::

    pool = HandlerPool(settings)
    await pool.start()                 # every process imported the handler, or ConfigError
    proc = await pool.assign(key, "shardId-0")   # the least loaded live process not blocked
    proc = await pool.quarantine(key, "shardId-0")   # a process of its own (a poisoned call)
    await pool.reload()                # SIGHUP: a new generation, or the old one keeps serving
    await pool.stop()

- A process that dies (any signal or exit) is logged ``handler_process_died`` with its
  pid, exit code or signal, the shards it held and the actions in flight (the one
  running, and faulthandler's stack for a fatal signal), and replaced. Its shards move
  to fresh instances in the live processes at their next call (``calls.ProcessCalls``),
  at once: they wait for no respawn while another process serves.
- A shard is placed (at its first call, or when it moves) on the least loaded live
  process whose loop is not blocked (``HandlerProcess.blocked``: its heartbeat stopped),
  so a shard moving off a dead process does not queue behind another's ``time.sleep``.
- Quarantine: a call whose process died while it ran, or that ran past
  ``execution_timeout``, is retried in a process spawned for it alone
  (``handler_process_quarantined``), never again beside other shards; that process is
  stopped once the call is over. Its death is logged but never respawned.
- Respawns back off only when processes do not start, or die young before serving any
  call: a handler that crashes on import does not spin the CPU, and a poisoned batch
  does not delay the bystanders' fresh process.
- ``max_handler_memory`` (MiB, 0: no limit): a process over it is marked retiring
  (``handler_process_memory``) and a new one started; its shards move between two
  actions and it is stopped once no action is under way in it, so nothing in flight
  is lost (an idle shard moves at its next action, as off a dead process).
- ``reload()`` starts a new generation that imports the module afresh; if it fails,
  ``reload_failed`` carries the importer's exact error and the old generation keeps
  serving; else the old processes retire as above (``reloaded``).

What the pool has each process do is the pool's own record of it (``ProcessRole``:
its shards, quarantine, retiring), never a flag set on the process: a call's owner
asks the pool whether its process still ``fits`` the shard::

    pool.fits(proc, quarantine=False)  # alive, not retiring, one of the pool's own: keep the shard there
    pool.shards_of(proc)               # {3: "shardId-000000000003"}: the shards placed on it
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time

from ..base.backoff import Backoff
from ..base.config import Settings, state_path
from ..errors import ConfigError
from ..base.logs import EventLogger, get_logger
from .arena import TRIM_PERIOD
from .process import HandlerImportFailed, HandlerProcess, Requests, clear_stale, describe_exit

# A process that dies younger than this counts towards the respawn backoff.
YOUNG = 5.0
CHECK_INTERVAL = 0.5


@dataclasses.dataclass
class ProcessRole:
    """What the pool has one of its processes do: the shards placed on it (kept after
    its death: what it held when it died), whether it was spawned for one shard's call
    alone (quarantine), whether it is retiring (its shards move away between actions;
    stopped once none is under way in it)."""

    shards: dict[int, str] = dataclasses.field(default_factory=dict)  # shard key -> shard id
    quarantine: bool = False
    retiring: bool = False


class HandlerPool:
    def __init__(self, settings: Settings, *, log: EventLogger | None = None) -> None:
        self.settings = settings
        self.size = settings.workers
        self.log = log or get_logger("mldserver.pool")
        self.processes: list[HandlerProcess] = []
        self.generation = 1
        self.backoff = Backoff(first=0.2, cap=10.0)
        self.failures = 0  # failed starts, and deaths of young processes that served nothing, in a row
        self.call_ids = itertools.count(1)
        self.task: asyncio.Task[None] | None = None  # the supervisor, watched by the server
        self._wake = asyncio.Event()
        self._added = asyncio.Event()
        self._stopping = asyncio.Event()
        self._reloading = asyncio.Lock()
        self.deaths = 0
        self.replaced = 0
        self.services: dict[str, Requests] = {}  # what every process's requests may ask the server (timers)
        self.quarantined: list[HandlerProcess] = []  # one call each (``quarantine``), stopped once it is over
        self._roles: dict[HandlerProcess, ProcessRole] = {}  # every process of this pool not stopped yet

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        clear_stale(state_path(self.settings, "handlers"))  # a killed server's processes' files
        started = await asyncio.gather(*(self._spawn(initial=True) for _ in range(self.size)),
                                       return_exceptions=True)
        failed = [r for r in started if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(self._stop(p) for p in started if isinstance(p, HandlerProcess)))
            if isinstance(failed[0], HandlerImportFailed):
                raise ConfigError(str(failed[0]))
            raise failed[0]
        self.processes = list(started)  # type: ignore[arg-type]
        self.task = asyncio.create_task(self._supervise(), name="handler-pool")

    async def stop(self) -> None:
        self._stopping.set()
        if self.task is not None:  # not cancelled: a process it is starting must be known, to be stopped
            self._wake.set()
            await asyncio.gather(self.task, return_exceptions=True)
        await asyncio.gather(*(self._stop(p) for p in self.processes + self.quarantined))
        self.log.info("handler_pool_stopped", deaths=self.deaths, replaced=self.replaced)

    def _process(self, role: ProcessRole, generation: int | None = None) -> HandlerProcess:
        """A process of this pool in ``role``, not started: its death reported here, its
        requests answered by the pool's services."""
        proc = HandlerProcess(self.settings, log=self.log, generation=generation or self.generation,
                              on_death=self._died, services=self.services)
        self._roles[proc] = role
        return proc

    async def _stop(self, proc: HandlerProcess) -> None:
        """Stopped, and no longer the pool's."""
        try:
            await proc.stop()
        finally:
            self._roles.pop(proc, None)

    async def _spawn(self, generation: int | None = None, initial: bool = False) -> HandlerProcess:
        proc = self._process(ProcessRole(), generation)
        try:
            await proc.start()
        except BaseException:
            self._roles.pop(proc, None)
            raise
        # The first ones are in ``listening`` (``workers``); a replacement is news.
        (self.log.debug if initial else self.log.info)(
            "handler_process_started", pid=proc.pid, process=proc.number, generation=proc.generation)
        return proc

    # -- shards -----------------------------------------------------------------------

    def serving(self) -> list[HandlerProcess]:
        return [p for p in self.processes if p.alive and not self._role(p).retiring]

    def _role(self, proc: HandlerProcess) -> ProcessRole:
        """Its role; a process no longer the pool's (stopped) retires."""
        return self._roles.get(proc) or ProcessRole(retiring=True)

    def shards_of(self, proc: HandlerProcess) -> dict[int, str]:
        """The shards placed on ``proc`` (shard key -> shard id); a dead one's, what it
        held when it died."""
        return self._role(proc).shards

    def fits(self, proc: HandlerProcess, quarantine: bool) -> bool:
        """A shard placed on ``proc`` stays there: it is alive, not retiring, and a
        process of the shard's own exactly when ``quarantine``."""
        role = self._role(proc)
        return proc.alive and not role.retiring and role.quarantine == quarantine

    def isolates(self, proc: HandlerProcess) -> bool:
        """``proc`` was spawned for one shard's call alone (``quarantine``)."""
        return self._role(proc).quarantine

    async def assign(self, key: int, shard_id: str) -> HandlerProcess:
        """The least loaded live process of the current generation whose loop is not
        blocked (any, if every one is), waiting for a respawn only if there is none; the
        shard is counted on it."""
        while True:
            live = self.serving()
            if live:
                proc = min(live, key=lambda p: (p.blocked(), len(self._role(p).shards), p.number))
                self._role(proc).shards[key] = shard_id
                return proc
            self._added.clear()
            self._wake.set()
            await self._added.wait()

    async def any_process(self) -> HandlerProcess:
        """For work not tied to a shard (timer callbacks): the live process of the
        current generation with the fewest calls in flight, waiting for a respawn if
        there is none."""
        while True:
            live = self.serving()
            if live:
                return min(live, key=lambda p: (p.blocked(), len(p.life.in_flight), p.number))
            self._added.clear()
            self._wake.set()
            await self._added.wait()

    async def quarantine(self, key: int, shard_id: str) -> HandlerProcess:
        """A process of the shard's own, for a call that killed its process or ran past
        its time: whatever it does next harms no other shard. HandlerImportFailed if
        it does not start (or the pool stops)."""
        if self._stopping.is_set():
            raise HandlerImportFailed("the server is stopping")
        proc = self._process(ProcessRole({key: shard_id}, quarantine=True))
        self.quarantined.append(proc)
        try:
            await proc.start()
        except BaseException:
            self.quarantined.remove(proc)
            self._roles.pop(proc, None)
            raise
        self.log.info("handler_process_quarantined", pid=proc.pid, process=proc.number, shard_id=shard_id)
        return proc

    def release(self, proc: HandlerProcess, key: int) -> None:
        """The shard leaves ``proc``: its instance is dropped there. A dead process
        keeps its list (what it held when it died); nothing is sent to it."""
        if not proc.alive:
            return
        role = self._role(proc)
        role.shards.pop(key, None)
        proc.drop(key)
        if role.retiring or role.quarantine:
            self._wake.set()

    # -- supervision ------------------------------------------------------------------

    def _died(self, proc: HandlerProcess) -> None:
        """Called by the process's reader when the pipe closes (before its calls fail)."""
        life, role = proc.life, self._role(proc)
        if life.stopping:
            return
        self.deaths += 1
        how = describe_exit(life.returncode)
        lived = time.monotonic() - life.started
        fatal = "signal" in how and how["signal"] in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL")
        running = life.in_flight.get(life.last_running) or life.killed_what
        self.log.error(
            "handler_process_died",
            pid=proc.pid,
            process=proc.number,
            **how,
            shards=sorted(set(role.shards.values())),
            in_flight=[{"shard_id": s, "action": a} for s, a in life.in_flight.values()],
            running=None if running is None else {"shard_id": running[0], "action": running[1]},
            lived_s=round(lived, 1),
            quarantine=role.quarantine,
            stack=life.crash_stack() if fatal else None,
            what_to_do="the action that was running is retried in a process of its own, then dead-lettered; "
                       "the other shards get fresh handler instances in the live processes and their actions "
                       "in flight are redone there",
        )
        if role.quarantine:
            pass  # never respawned, and no reason to hold back the pool's own processes
        elif lived < YOUNG and not life.served:
            self.failures += 1
        else:
            self.failures = 0
        self._wake.set()

    async def _supervise(self) -> None:
        limit = self.settings.max_handler_memory
        trimmed_at = time.monotonic()
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), CHECK_INTERVAL)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            if now - trimmed_at >= TRIM_PERIOD:  # (each process trims its rows arena itself)
                trimmed_at = now
                for proc in self.processes + self.quarantined:
                    proc.channel.trim()
            for proc in [p for p in self.processes + self.quarantined
                         if not p.alive and not p.life.killed and p.proc is not None]:
                proc.kill()  # its stdin failed: no frame reaches it any more
            for proc in [p for p in self.processes if p.life.died.is_set()]:
                self.processes.remove(proc)
                await self._stop(proc)
            for proc in [p for p in self.quarantined if p.life.died.is_set() or not self._role(p).shards]:
                self.quarantined.remove(proc)
                await self._stop(proc)
            if limit > 0:
                for proc in self.serving():
                    rss = proc.rss_mib()
                    if rss is not None and rss > limit:
                        self._role(proc).retiring = True
                        self.log.warning("handler_process_memory", pid=proc.pid, process=proc.number,
                                         rss_mib=round(rss, 1), max_handler_memory=limit,
                                         shards=len(self._role(proc).shards),
                                         what_to_do="replaced: its shards move to a new process between actions")
            # A retiring process goes once no action is under way in it: a shard with
            # none (an idle one: the daemon sends nothing to an empty shard) moves at its
            # next action, as off a dead process, rather than keep it (and its old code
            # and memory) alive until then.
            for proc in [p for p in self.processes
                         if self._role(p).retiring and not p.life.acting and not p.life.in_flight]:
                self.processes.remove(proc)
                idle = sorted(set(self._role(proc).shards.values()))
                await self._stop(proc)
                self.log.info("handler_process_retired", pid=proc.pid, process=proc.number,
                              generation=proc.generation, idle_shards=idle)
            while len(self.serving()) < self.size and not self._stopping.is_set():
                if self.failures:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.backoff.delay(self.failures - 1))
                    if self._stopping.is_set():
                        break
                try:
                    proc = await self._spawn()
                except HandlerImportFailed as exc:
                    self.failures += 1
                    self.log.error("handler_process_start_failed", error=str(exc), attempt=self.failures,
                                   what_to_do="retried with backoff; fix the handler module, then SIGHUP")
                    continue
                self.processes.append(proc)
                self.replaced += 1
                self._added.set()

    async def reload(self) -> bool:
        """SIGHUP: a new generation imports the module afresh; shards move to it
        between two actions and the old processes retire. False if it failed to import
        (``reload_failed``, the old generation keeps serving)."""
        async with self._reloading:
            generation = self.generation + 1
            started = await asyncio.gather(*(self._spawn(generation) for _ in range(self.size)),
                                           return_exceptions=True)
            failed = [r for r in started if isinstance(r, BaseException)]
            if failed:
                await asyncio.gather(*(self._stop(p) for p in started if isinstance(p, HandlerProcess)))
                self.log.error("reload_failed", error=str(failed[0]), handler=self.settings.handler,
                               what_to_do="the processes already running keep serving; fix the module, SIGHUP again")
                return False
            old = [p for p in self.processes if not self._role(p).retiring]
            for proc in old:
                self._role(proc).retiring = True
            self.generation = generation
            self.processes.extend(started)  # type: ignore[arg-type]
            self.failures = 0
            self._added.set()
            self._wake.set()
            self.log.info("reloaded", generation=generation, handler=self.settings.handler,
                          processes=[p.pid for p in started], retiring=[p.pid for p in old])
            return True
