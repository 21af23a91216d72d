"""What is known of one handler process's life, and whom its death is blamed on: the
calls in flight in it and who has work under way there, the shared state file the
process writes which call runs and its heartbeat in, whether we killed it and for
which call, and how it ended. ``HandlerProcess`` owns one (``proc.life``); the pool
reads it to place work and to log a death, a call's owner to wait for one::

    life = Liveness("/var/lib/mldserver/handlers/process-4201-3")
    life.open()                                  # process-4201-3.run: zeros, mapped
    life.ready()                                 # it imported the handler: its age starts
    life.sent(12, ("shardId-000000000001", "process_records"))   # in_flight {12: (...)}, served 1
    life.running()                               # 12 while its handler code executes, else 0
    life.blocked()                               # True once its loop missed BLOCKED beats (frames.BEAT)
    life.kill_for(12, ("shardId-000000000001", "process_records"))   # its time-out kills it
    running = life.ended(-9, life.running())     # died: 12, the call its death is blamed on
    await life.died.wait()
    life.close()                                 # the .run and .stack files gone

``acting`` holds whoever has work under way in the process (a shard's calls, a timer
fire's id): a retiring process is stopped only once it is empty. ``stopping`` says its
death was asked for (``HandlerProcess.stop``), so it is no death to report.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from pathlib import Path

from .frames import BEAT, BEAT_AT, RUN, STATE_SIZE, STOP, STOP_AT


class Liveness:
    """One handler process's life: what runs in it, whether it lives, whom to blame."""

    def __init__(self, state: str) -> None:
        self.state = state  # its state files' path, without .run (ours) or .stack (faulthandler's)
        self._map: mmap.mmap | None = None
        self.in_flight: dict[int, tuple[str, str]] = {}  # call id -> (shard id, action)
        self.acting: set[object] = set()  # who has work under way here: a shard's calls, a timer fire's id
        self.served = 0  # calls sent to it
        self.started = 0.0  # when it was ready (time.monotonic)
        self.killed = False  # by us: no longer alive, though its death may not be noticed yet
        self.killed_for = 0  # the call id whose time-out killed it
        self.killed_what: tuple[str, str] | None = None  # its (shard id, action)
        self.stopping = False  # its end was asked for: not a death to report
        self.returncode: int | None = None
        self.last_running = 0  # the call id running when it died (0: none was)
        self.died = asyncio.Event()

    def open(self) -> None:
        """The state file the process writes, zeroed and mapped."""
        with open(self.state + ".run", "wb") as f:
            f.write(b"\0" * STATE_SIZE)
        fd = os.open(self.state + ".run", os.O_RDWR)
        self._map = mmap.mmap(fd, STATE_SIZE)
        os.close(fd)

    def ready(self) -> None:
        """It imported the handler and is ready for calls: its age starts now."""
        self.started = time.monotonic()

    def sent(self, call_id: int, what: tuple[str, str]) -> None:
        """A call of ``what`` (shard id, action) went to it."""
        self.in_flight[call_id] = what
        self.served += 1

    def over(self, call_id: int) -> None:
        """The call is no longer in flight (done, or its caller gave up on it)."""
        self.in_flight.pop(call_id, None)

    def running(self) -> int:
        """The id of the call whose handler code is executing now (0: none is)."""
        return RUN.unpack_from(self._map)[0] if self._map is not None else 0

    def blocked(self) -> bool:
        """Its loop has missed BLOCKED beats of its period (the time it wrote is past): a
        call blocks it (``time.sleep``, a long computation), and a call sent now would
        wait behind it."""
        due = self.beat_due()
        return due != 0 and time.monotonic_ns() > due

    def beat_due(self) -> int:
        """By when (``time.monotonic_ns()``) its loop said it would turn again; 0: not yet."""
        return BEAT.unpack_from(self._map, BEAT_AT)[0] if self._map is not None else 0

    def mark_stop(self, call_id: int) -> bool:
        """``call_id`` written as the one to stop (the process raises ExecutionTimeout
        in it at SIGUSR2); False if the state file is closed."""
        if self._map is None:
            return False
        STOP.pack_into(self._map, STOP_AT, call_id)
        return True

    def kill(self) -> None:
        """We killed it: no longer alive, though its death may not be noticed yet."""
        self.killed = True

    def stop(self) -> None:
        """Its end was asked for: its death is not one to report."""
        self.stopping = True

    def kill_for(self, call_id: int, what: tuple[str, str]) -> None:
        """It is killed because ``call_id`` (of ``what``: shard id, action) ran past its time."""
        self.killed_for, self.killed_what = call_id, what

    def ended(self, returncode: int | None, running: int) -> int:
        """It exited with ``returncode`` while ``running`` ran (read before its stdin
        closed): the call its death is blamed on (the one killed for, else that one;
        0: none), and ``died`` set."""
        self.returncode = returncode
        self.last_running = self.killed_for or running
        self.died.set()
        return self.last_running

    def stack_file(self) -> Path:
        """Where faulthandler writes its stacks (SIGUSR1, a fatal signal)."""
        return Path(self.state + ".stack")

    def crash_stack(self) -> str:
        """What faulthandler wrote when the process died of a fatal signal."""
        path = self.stack_file()
        return path.read_text(errors="replace")[-8000:] if path.exists() else ""

    def close(self) -> None:
        """The state file unmapped, and both files gone."""
        if self._map is not None:
            self._map.close()
            self._map = None
        for suffix in (".run", ".stack"):
            try:
                os.unlink(self.state + suffix)
            except FileNotFoundError:
                pass
