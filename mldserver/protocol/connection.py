"""The sans-IO protocol core: bytes in, events out; events in, bytes out.

No asyncio, no logging, no clock: a ``Connection`` is driven by plain calls, so it
can be tested line by line or byte by byte. The shard driver feeds it what the relay
read from the daemon and writes what it returns::

    >>> conn = Connection()
    >>> conn.receive_data(b'{"action":"initialize","shardId":"shardId-0","sequenceNumber":null,'
    ...                   b'"subSequenceNumber":null}\\n')
    >>> event = conn.next_event()
    >>> event.shard_id, conn.state.name, conn.owes_status
    ('shardId-0', 'INITIALIZING', 'initialize')
    >>> conn.send(event.reply())
    b'{"action":"status","responseFor":"initialize"}\\n'
    >>> conn.state.name, conn.owes_status, conn.next_event()
    ('READY', None, NEED_DATA)

A ``Connection`` is a :class:`.state.ConnectionState` that reads and writes lines.
Every step it takes (an action read, a checkpoint's reply, end of input, a status or
a checkpoint sent) is a ``move`` of that machine, whose table is the only judge of
what is allowed and whose ``move`` is the only code that assigns ``state``; this
module frames, decodes and encodes, and never assigns the state itself.

``next_event()`` returns an event, ``NEED_DATA`` until a whole line is buffered, or
``ConnectionClosed`` after end of input. It raises RemoteProtocolError for a line it
cannot accept (state unchanged; see :mod:`.errors` for the owed status). A line that is
not JSON, or is over ``max_line_size``, is owed a status when its first bytes name a
daemon action; one that names none at all (``names_no_action``) can be answered by no
status; ``overflow()`` then hands out the whole line in pieces as it arrives. While a
checkpoint is outstanding, a line that cannot be read is its reply, malformed: a
``CheckpointReply`` with ``error=MALFORMED_REPLY``, and the checkpoint failed. A line
that cannot be read and names ``checkpoint`` or ``status`` is owed nothing. ``send()``
raises LocalProtocolError, writing nothing and moving nothing, for anything the
daemon would not accept at that point.
"""

from __future__ import annotations

import re

from .errors import LocalProtocolError, RemoteProtocolError
from .events import (
    DAEMON_ACTIONS,
    Action,
    Checkpoint,
    CheckpointReply,
    MALFORMED_REPLY,
    ConnectionClosed,
    Event,
    Initialize,
    Shutdown,
    Status,
)
from .framing import DEFAULT_MAX_LINE_SIZE, LineBuffer, LineTooLong
from .messages import Dialect, decode, encode
from .state import NEVER_OWED, ConnectionState, State, Trigger


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()

# The action name in a line's first bytes (the daemon writes "action" first).
_ACTION = re.compile(rb'"action"\s*:\s*"([A-Za-z0-9_:]{1,64})"')
# How far into a line that does not parse its action is looked for (a record's own
# "action":"record" comes later).
NAMED_WITHIN = 256


def action_in(prefix: bytes) -> str | None:
    """The action a (partial) line names in its first bytes, if it does."""
    match = _ACTION.search(prefix)
    return match.group(1).decode("ascii") if match else None


# Daemon actions by wire name; ``shutdown`` is split by its reason in ``_trigger``.
_TRIGGERS: dict[str, Trigger] = {name: Trigger(name) for name in DAEMON_ACTIONS if name != "shutdown"}


# Members by plain name (reading one from its Enum class costs a descriptor call).
_STATUS, _CHECKPOINT, _REPLY = Trigger.STATUS, Trigger.CHECKPOINT, Trigger.CHECKPOINT_REPLY
_UNKNOWN = Trigger.UNKNOWN_ACTION


def _trigger(event: Action) -> Trigger:
    """The daemon action's trigger (a KCL 1.x ``shutdown`` by its reason; an action
    this core does not know, ``UNKNOWN_ACTION``)."""
    if isinstance(event, Shutdown):
        return Trigger.SHUTDOWN_TERMINATE if event.is_shard_end else Trigger.SHUTDOWN_ZOMBIE
    return _TRIGGERS.get(event.action, _UNKNOWN)


class Connection(ConnectionState):
    """One shard's conversation with the daemon, from the child's side.

    A ``ConnectionState`` (its ``state``, ``owes_status``, ...) that reads and writes
    lines: every step is its ``move``; nothing here assigns the state."""

    def __init__(self, max_line_size: int = DEFAULT_MAX_LINE_SIZE, lazy: bool = False,
                 lines: LineBuffer | None = None) -> None:
        """``lazy``: processRecords lines' records are read on demand (see :mod:`.lazy`);
        ``lines``: a buffer others write into in place (``LineBuffer.get_buffer``), else
        one of its own, fed by ``receive_data``."""
        self._lines = lines if lines is not None else LineBuffer()
        self._lines.max_line_size = max_line_size
        self.lazy = lazy
        self.positions = False  # lazy lines' positions read as they are checked (a sink is downstream)
        self.dialect = Dialect.SEQUENCE
        self.shard_id: str | None = None

    # -- input -------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the daemon; ``b""`` means end of input."""
        self._lines.feed(data)

    @property
    def buffered(self) -> int:
        """Bytes received that are not yet a whole line (for back-pressure)."""
        return self._lines.pending

    @property
    def overflowing(self) -> bool:
        """Inside a line over ``max_line_size`` not yet read to its end."""
        return self._lines.overflowing

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes received of the line not yet whole (its action name)."""
        return self._lines.peek(n)

    def next_event(self) -> Event | _NeedData:
        if self.state is State.CLOSED:
            return ConnectionClosed()
        try:
            line = self._lines.next_line()
        except LineTooLong as exc:
            if self.state is State.CHECKPOINTING:  # the rest of it is skipped
                return self._settle(CheckpointReply(None, None, MALFORMED_REPLY, str(exc)))
            action = action_in(exc.prefix[:NAMED_WITHIN])
            self.owe(action)
            raise RemoteProtocolError(str(exc), line=exc.prefix, action=self.stray, too_long=True,
                                      names_no_action=action is None) from None
        if line is None:
            if self._lines.eof:
                self.move(Trigger.END_OF_INPUT)
                return ConnectionClosed()
            return NEED_DATA
        try:
            event = decode(line, self.lazy, self.positions)
        except RemoteProtocolError as exc:
            if self.state is State.CHECKPOINTING and (exc.action is None or exc.action in NEVER_OWED):
                return self._settle(CheckpointReply(None, None, MALFORMED_REPLY, str(exc)))
            if exc.action is None:  # not JSON (cut short, garbled): the daemon action its first bytes name
                named = action_in(line[:NAMED_WITHIN])
                if named in DAEMON_ACTIONS or named in NEVER_OWED:
                    exc.action = named
                else:
                    exc.names_no_action = True
            self.owe(exc.action)  # a malformed action still waits for its status
            exc.action = self.stray
            raise
        try:
            if isinstance(event, CheckpointReply):
                return self._settle(event)
            assert isinstance(event, Action)
            self.move(_trigger(event), event.action)
        except RemoteProtocolError as exc:  # refused: the state is unchanged
            exc.line = line
            raise
        if isinstance(event, Initialize):
            self.shard_id = event.shard_id
            self.dialect = Dialect.SEQUENCE if event.has_sequence_key else Dialect.V1
        return event

    def _settle(self, reply: CheckpointReply) -> CheckpointReply:
        """The outstanding checkpoint's reply: back to where the checkpoint was sent."""
        self.move(_REPLY)
        return reply

    def overflow(self) -> tuple[bytes, bool]:
        """After a RemoteProtocolError with ``too_long``: the over-long line's bytes
        received since the last call (the first call starts at its first byte), and
        whether it has ended. Feed more data until it has."""
        return self._lines.overflow()

    # -- output ------------------------------------------------------------------

    def send(self, event: Event) -> bytes:
        """Bytes for the daemon, or LocalProtocolError if ``event`` is not allowed now."""
        if isinstance(event, Status):
            trigger, action = _STATUS, event.response_for
        elif isinstance(event, Checkpoint):
            trigger, action = _CHECKPOINT, None
        else:
            raise LocalProtocolError(f"{event!r} is not something the child sends")
        data = encode(event, self.dialect)  # first: a line that cannot be written moves nothing
        self.move(trigger, action)
        return data
