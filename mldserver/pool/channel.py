"""The one-copy channel of one handler process: the two arenas of shared memory
(``arena.py``) a batch's line crosses in and its rows come back in, which region each
call holds, and the rows the server holds on loan. ``HandlerProcess`` owns one, and
only writes frames; this class decides what crosses in memory and gives it back::

    channel = Channel(tell)                     # tell: one frame to the process, never raises
    rows_fd = channel.open(rows_arena_bytes(settings.max_buffered_bytes, settings.workers))
    ... spawn it with pass_fds=channel.passed(rows_fd), then close rows_fd ...
    start.update(channel.start_fields())        # {"arena": [fd, size], "rows_arena": [fd, size]}
    frame, body = channel.put(frame, line)      # 1.4 MB: {..., "arena": (0, 1400000)}, b""
    channel.done(frame["id"])                   # its done frame came: the region is the server's again
    rows = channel.rows_body([4096, 2000000], wanted=True)   # read in place, on loan (rows.loans)
    channel.close()                             # once the process has exited

A region of the line's arena is the process's from the call frame that names it until
that call's ``done`` frame (``done``) or the process's death (``close``). A rows region
is the server's from the done frame that names it until each of its parts is handed
back (a ``free`` frame, ``tell``), from the event loop's thread whichever thread let it
go. ``read`` counts the rows bodies read in place, ``lent`` the bytes still held.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Callable

from .arena import ARENA_MIN, Arena, ArenaView, Region, extent, shared_memory


class Channel:
    """The shared memory between the server and one handler process."""

    def __init__(self, tell: Callable[[dict[str, Any]], None]) -> None:
        self._tell = tell  # one frame to the process; nothing if it is gone
        self.arena: Arena | None = None  # where a call's line lands for it
        self._regions: dict[int, Region] = {}  # call id -> its line's region, until its done frame
        self.rows: ArenaView | None = None  # where it puts a batch's rows for us, read-only
        self._rows_at: list[int] | None = None  # [fd, size] of that memory, as the process knows it
        self.read = 0  # rows bodies read from it rather than from the pipe
        self.lent = 0  # bytes of it the server still holds (on loan until their windows commit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def open(self, rows_size: int) -> int:
        """Both arenas made, on the running loop: the rows arena's fd, which the caller
        passes to the process (``passed``) and then closes (ours is mapped)."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self.arena = Arena.create()
        rows_fd = shared_memory(rows_size, "mldserver-rows")
        try:
            self.rows = ArenaView(os.dup(rows_fd), rows_size)
        except BaseException:
            os.close(rows_fd)
            raise
        self._rows_at = [rows_fd, rows_size]  # (the fd's number is the same in the process)
        return rows_fd

    def passed(self, rows_fd: int) -> tuple[int, int]:
        """The fds the process inherits (``pass_fds``)."""
        assert self.arena is not None
        return self.arena.fd, rows_fd

    def start_fields(self) -> dict[str, Any]:
        """The start frame's ``arena`` and ``rows_arena``: where the process maps them."""
        return {"arena": [self.arena.fd, self.arena.size] if self.arena is not None else None,
                "rows_arena": self._rows_at}

    def put(self, frame: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        """A call's frame and body as they go: a large body in the arena, the frame
        naming its region; else unchanged (the pipe: small, the arena full, or the line
        larger than it)."""
        if len(body) < ARENA_MIN or self.arena is None:
            return frame, body
        region = self.arena.put(body)
        if region is None:
            return frame, body
        self._regions[frame["id"]] = region
        return {**frame, "arena": region}, b""

    def done(self, call_id: int) -> None:
        """The call's done frame came: the process has read its line's region."""
        region = self._regions.pop(call_id, None)
        if region is not None and self.arena is not None:
            self.arena.free(region)

    def rows_body(self, region: list[int], wanted: bool) -> Any:
        """A done frame's rows, in the process's rows arena: read where they lie (if
        its call still waits for them), on loan until nothing refers to them (their
        windows committed: ``rows.loans``); else handed back at once. ValueError if the
        region is not inside the arena (the process is unreadable)."""
        held = extent(region)  # type: ignore[arg-type]
        self.lent += held[1]
        if not wanted:
            self._give_back(held)
            return b""
        if self.rows is None:  # (never: the arena is closed only once its frames are read)
            raise RuntimeError("a done frame names the rows arena, which is closed")
        self.rows.region(*held)
        from ..rows.loans import lend  # (numpy: a server with a sink)

        self.read += 1
        return lend(self.rows.map, *held, self._give_back)[: region[1]]

    def _give_back(self, part: Region) -> None:
        """Bytes of the rows arena the server is done with, back to the process (a
        ``free`` frame) from the event loop's thread, whichever thread let them go, and
        never in the middle of another frame: a loan's last reference may go anywhere."""
        loop = self._loop
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_soon(self._free_rows, part)  # type: ignore[union-attr]
            else:
                loop.call_soon_threadsafe(self._free_rows, part)  # type: ignore[union-attr]
        except RuntimeError:
            pass  # the loop is closed: the server is gone, and the process with it

    def _free_rows(self, part: Region) -> None:
        self.lent -= part[1]
        self._tell({"op": "free", "region": list(part)})  # (its arena went with it if it died)

    def trim(self) -> None:
        """The line arena's pages no line used for a period back to the system
        (``Arena.trim``): at 32 shards, first fit used 4 or 5 MiB of a process's
        arena at a time, and 15 to 21 MiB had been touched."""
        if self.arena is not None:
            self.arena.trim()

    def close(self) -> None:
        """Once the process has exited: its regions can be read by nobody any more.
        A rows view still lent out is unmapped when its last loan goes."""
        self._regions.clear()
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self.rows is not None:
            self.rows.close()
            self.rows = None
