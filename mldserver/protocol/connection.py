"""The sans-IO protocol core: bytes in, events out; events in, bytes out.

No asyncio, no logging, no clock: a ``Connection`` is driven by plain calls, so it
can be tested line by line or byte by byte. The shard driver feeds it what the relay
read from the daemon and writes what it returns::

    conn = Connection()
    conn.receive_data(b'{"action":"initialize","shardId":"shardId-0","sequenceNumber":null,'
                      b'"subSequenceNumber":null}\\n')
    event = conn.next_event()        # Initialize(shard_id="shardId-0", ...)
    wire = conn.send(event.reply())  # b'{"action":"status","responseFor":"initialize"}\\n'

``next_event()`` returns an event, ``NEED_DATA`` until a whole line is buffered, or
``ConnectionClosed`` after end of input. It raises RemoteProtocolError for a line it
cannot accept (state unchanged; see :mod:`.errors` for the owed status). A line that is
not JSON, or is over ``max_line_size``, is owed a status when its first bytes name a
daemon action; one that names none at all (``names_no_action``) can be answered by no
status; ``overflow()`` then hands out the whole line in pieces as it arrives. While a
checkpoint is outstanding, a line that cannot be read is its reply, malformed: a
``CheckpointReply`` with ``error=MALFORMED_REPLY``, and the checkpoint failed. Only a
daemon action is ever owed a status (never ``checkpoint`` or ``status``). ``send()``
raises LocalProtocolError, writing nothing, for anything the daemon would not accept
at that point: the transition table in :mod:`.state` is the only judge.
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
from .state import (
    CHECKPOINT_ALLOWED,
    NEVER_OWED,
    REMOTE_TRANSITIONS,
    RESPONSE_FOR,
    STATUS_TRANSITIONS,
    State,
)


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


def _transition_key(event: Action) -> str:
    if isinstance(event, Shutdown):
        return "shutdown:TERMINATE" if event.is_shard_end else "shutdown:ZOMBIE"
    return event.action


class Connection:
    """One shard's conversation with the daemon, from the child's side."""

    def __init__(self, max_line_size: int = DEFAULT_MAX_LINE_SIZE, lazy: bool = False) -> None:
        """``lazy``: processRecords lines' records are read on demand (see :mod:`.lazy`)."""
        self._lines = LineBuffer(max_line_size)
        self.lazy = lazy
        self.state = State.AWAITING_INITIALIZE
        self.dialect = Dialect.SEQUENCE
        self.shard_id: str | None = None
        self._resume: State | None = None  # the state a checkpoint reply returns to
        self._action: str | None = None  # the action name the owed status answers
        self._stray: str | None = None  # an out-of-order action still owed a status

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
            self._owe(action)
            raise RemoteProtocolError(str(exc), line=exc.prefix, action=self._stray, too_long=True,
                                      names_no_action=action is None) from None
        if line is None:
            if self._lines.eof:
                self.state = State.CLOSED
                return ConnectionClosed()
            return NEED_DATA
        try:
            event = decode(line, self.lazy)
        except RemoteProtocolError as exc:
            if self.state is State.CHECKPOINTING and (exc.action is None or exc.action in NEVER_OWED):
                return self._settle(CheckpointReply(None, None, MALFORMED_REPLY, str(exc)))
            if exc.action is None:  # not JSON (cut short, garbled): the daemon action its first bytes name
                named = action_in(line[:NAMED_WITHIN])
                if named in DAEMON_ACTIONS or named in NEVER_OWED:
                    exc.action = named
                else:
                    exc.names_no_action = True
            self._owe(exc.action)  # a malformed action still waits for its status
            exc.action = self._stray
            raise
        if isinstance(event, CheckpointReply):
            if self.state is not State.CHECKPOINTING:
                raise RemoteProtocolError(
                    f"checkpoint reply while {self.state.name} (no checkpoint outstanding)",
                    line=line,
                )
            return self._settle(event)
        assert isinstance(event, Action)
        new = REMOTE_TRANSITIONS.get((self.state, _transition_key(event)))
        if new is None:
            self._stray = event.action
            raise RemoteProtocolError(
                f"{event.action} is out of order while {self.state.name} ({self.state.value})",
                line=line,
                action=event.action,
            )
        if isinstance(event, Initialize):
            self.shard_id = event.shard_id
            self.dialect = Dialect.SEQUENCE if event.has_sequence_key else Dialect.V1
        self.state = new
        self._action = event.action
        return event

    def _settle(self, reply: CheckpointReply) -> CheckpointReply:
        """The outstanding checkpoint's reply: back to where the checkpoint was sent."""
        assert self._resume is not None
        self.state, self._resume = self._resume, None
        return reply

    def _owe(self, action: str | None) -> None:
        """An action the daemon sent that cannot be taken still waits for its status;
        only a daemon action can be owed one."""
        self._stray = None if action is None or action in NEVER_OWED else action

    def overflow(self) -> tuple[bytes, bool]:
        """After a RemoteProtocolError with ``too_long``: the over-long line's bytes
        received since the last call (the first call starts at its first byte), and
        whether it has ended. Feed more data until it has."""
        return self._lines.overflow()

    # -- output ------------------------------------------------------------------

    def send(self, event: Event) -> bytes:
        """Bytes for the daemon, or LocalProtocolError if ``event`` is not allowed now."""
        if isinstance(event, Status):
            return self._send_status(event)
        if isinstance(event, Checkpoint):
            if self.state not in CHECKPOINT_ALLOWED or self._stray is not None:
                raise LocalProtocolError(
                    f"cannot checkpoint while {self.state.name} ({self.state.value})"
                )
            data = encode(event, self.dialect)
            self._resume, self.state = self.state, State.CHECKPOINTING
            return data
        raise LocalProtocolError(f"{event!r} is not something the child sends")

    def _send_status(self, event: Status) -> bytes:
        if self._stray is not None:
            if event.response_for != self._stray:
                raise LocalProtocolError(
                    f"status for {event.response_for!r}, but the daemon waits for one "
                    f"for the out-of-order {self._stray!r}"
                )
            self._stray = None
            return encode(event, self.dialect)
        new = STATUS_TRANSITIONS.get(self.state)
        if new is None:
            raise LocalProtocolError(f"no status is owed while {self.state.name} ({self.state.value})")
        if event.response_for != self._action or event.response_for not in RESPONSE_FOR[self.state]:
            raise LocalProtocolError(
                f"status for {event.response_for!r}, but the action being answered is {self._action!r}"
            )
        data = encode(event, self.dialect)
        self.state = new
        self._action = None
        return data

    @property
    def owes_status(self) -> str | None:
        """The action name a status is owed for, if any."""
        if self._stray is not None:
            return self._stray
        if self.state in STATUS_TRANSITIONS:
            return self._action
        return None
