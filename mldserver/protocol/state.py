"""The conversation's states, the one table of transitions, and the one writer.

Everything that moves the state machine lives here (the h11 rule). ``TRANSITIONS``
maps (state, trigger) to the next state; a pair that is not in it is not allowed.
``ConnectionState.move`` looks the pair up and is the only code that assigns
``state``: ``Connection`` (in :mod:`.connection`) decodes and encodes lines, and asks
``move`` for every step. The daemon drives the conversation; our only moves are a
``STATUS`` (which ends an action) and a ``CHECKPOINT`` (allowed only inside some
actions, one outstanding at a time)::

    AWAITING_INITIALIZE --INITIALIZE--> INITIALIZING --STATUS--> READY
    READY --PROCESS_RECORDS--> PROCESSING --STATUS--> READY
    READY --SHUTDOWN_REQUESTED--> SHUTTING_DOWN --STATUS--> DRAINING
    READY|DRAINING --SHARD_ENDED|SHUTDOWN_TERMINATE--> ENDING --STATUS--> FINISHED
    READY|DRAINING --LEASE_LOST|SHUTDOWN_ZOMBIE--> LOSING --STATUS--> FINISHED
    PROCESSING|SHUTTING_DOWN|ENDING --CHECKPOINT--> CHECKPOINTING --CHECKPOINT_REPLY--> BACK
    any but CLOSED --END_OF_INPUT--> CLOSED

``BACK`` is the state the outstanding checkpoint was sent from (kept in ``resume``).
Driving the machine alone, without any bytes (this is what ``Connection`` does as
it reads and writes lines)::

    >>> m = ConnectionState()
    >>> m.move(Trigger.INITIALIZE, "initialize").name
    'INITIALIZING'
    >>> m.move(Trigger.STATUS, "initialize").name
    'READY'
    >>> m.move(Trigger.PROCESS_RECORDS, "processRecords").name
    'PROCESSING'
    >>> m.move(Trigger.CHECKPOINT).name, m.resume.name
    ('CHECKPOINTING', 'PROCESSING')
    >>> m.move(Trigger.CHECKPOINT_REPLY).name
    'PROCESSING'
    >>> m.move(Trigger.INITIALIZE, "initialize")
    Traceback (most recent call last):
    mldserver.protocol.errors.RemoteProtocolError: initialize is out of order while PROCESSING (...)
    >>> m.state.name, m.owes_status
    ('PROCESSING', 'initialize')
    >>> m.move(Trigger.STATUS, "initialize").name  # the refused action's status
    'PROCESSING'
    >>> m.move(Trigger.STATUS, "processRecords").name
    'READY'

A pair not in the table raises RemoteProtocolError (a daemon's trigger) or
LocalProtocolError (ours, ``OURS``) and leaves ``state``, ``resume`` and ``answering``
as they were. Two things besides the table decide, and they are not transitions:

- ``answering``: the daemon action a status-owing state answers. ``ENDING`` and
  ``LOSING`` are entered by two actions each (``shardEnded`` or a KCL 1.x ``shutdown``,
  ``leaseLost`` or ``shutdown``), and a ``STATUS`` must name the one that was sent.
- ``stray``: a daemon action that was refused (out of order, unknown to this core, or
  on a line that cannot be read) still waits for its status, as in the example above.
  The refusal records it (the only thing a refused trigger changes); the next
  ``STATUS`` must answer it and leaves ``state`` where it is; no ``CHECKPOINT`` is
  allowed until then. A line that cannot be read and names ``checkpoint`` (a reply)
  or ``status`` (ours) is owed nothing (``NEVER_OWED``: names, not a transition).
"""

from __future__ import annotations

import enum

from .errors import LocalProtocolError, RemoteProtocolError


class State(enum.Enum):
    # Members are singletons compared by identity; Enum's own __hash__ is a Python call
    # (hash of the name), and the table is looked up for every line.
    __hash__ = object.__hash__

    AWAITING_INITIALIZE = "waiting for the daemon's initialize"
    INITIALIZING = "initialize received: a status is owed; checkpoints are not allowed"
    READY = "status sent: waiting for the next action"
    PROCESSING = "processRecords received: may checkpoint; a status is owed"
    SHUTTING_DOWN = "shutdownRequested received: may checkpoint; a status is owed"
    DRAINING = "shutdownRequested answered: only leaseLost or shardEnded may follow"
    ENDING = "shard ended: SHARD_END must be checkpointed before the status"
    LOSING = "lease lost: checkpoints fail; a status is owed"
    CHECKPOINTING = "checkpoint sent: waiting for the daemon's reply"
    FINISHED = "final status sent: waiting for the daemon to close"
    CLOSED = "the daemon closed its end"


class Trigger(enum.Enum):
    """What moves the conversation: the daemon's lines and end of input, and our two.

    A daemon action's value is its wire name; a KCL 1.x ``shutdown`` is keyed by its
    meaning ("shutdown:TERMINATE" is a shard end, any other reason a lost lease)."""

    __hash__ = object.__hash__  # as State's

    INITIALIZE = "initialize"
    PROCESS_RECORDS = "processRecords"
    SHUTDOWN_REQUESTED = "shutdownRequested"
    SHARD_ENDED = "shardEnded"
    SHUTDOWN_TERMINATE = "shutdown:TERMINATE"
    LEASE_LOST = "leaseLost"
    SHUTDOWN_ZOMBIE = "shutdown:ZOMBIE"
    UNKNOWN_ACTION = "an action this core does not know"  # in no state's row: always refused
    CHECKPOINT_REPLY = "the daemon's reply to our checkpoint"
    END_OF_INPUT = "the daemon closed its end"
    STATUS = "status"  # ours: the action being answered is done
    CHECKPOINT = "checkpoint"  # ours


# Our triggers: a refused one is a LocalProtocolError (the daemon's, a RemoteProtocolError).
OURS: frozenset[Trigger] = frozenset({Trigger.STATUS, Trigger.CHECKPOINT})


class _Back:
    def __repr__(self) -> str:
        return "BACK"


BACK = _Back()  # the state the outstanding checkpoint was sent from

_EITHER_END = (State.READY, State.DRAINING)  # where the lease can end
_MAY_CHECKPOINT = (State.PROCESSING, State.SHUTTING_DOWN, State.ENDING)

TRANSITIONS: dict[tuple[State, Trigger], State | _Back] = {
    (State.AWAITING_INITIALIZE, Trigger.INITIALIZE): State.INITIALIZING,
    (State.READY, Trigger.PROCESS_RECORDS): State.PROCESSING,
    (State.READY, Trigger.SHUTDOWN_REQUESTED): State.SHUTTING_DOWN,
    **{(s, t): State.ENDING for s in _EITHER_END for t in (Trigger.SHARD_ENDED, Trigger.SHUTDOWN_TERMINATE)},
    **{(s, t): State.LOSING for s in _EITHER_END for t in (Trigger.LEASE_LOST, Trigger.SHUTDOWN_ZOMBIE)},
    (State.INITIALIZING, Trigger.STATUS): State.READY,
    (State.PROCESSING, Trigger.STATUS): State.READY,
    (State.SHUTTING_DOWN, Trigger.STATUS): State.DRAINING,
    (State.ENDING, Trigger.STATUS): State.FINISHED,
    (State.LOSING, Trigger.STATUS): State.FINISHED,
    **{(s, Trigger.CHECKPOINT): State.CHECKPOINTING for s in _MAY_CHECKPOINT},
    (State.CHECKPOINTING, Trigger.CHECKPOINT_REPLY): BACK,
    **{(s, Trigger.END_OF_INPUT): State.CLOSED for s in State if s is not State.CLOSED},
}

# The states a STATUS ends (a status is owed in them).
OWING: frozenset[State] = frozenset(s for (s, t) in TRANSITIONS if t is Trigger.STATUS)

# Names that are never owed a status, however malformed the line that carried them.
NEVER_OWED: frozenset[str] = frozenset({"checkpoint", "status"})

# The members ``move`` compares with, by plain name: reading a member from its Enum
# class is a descriptor call (about ten times a global's cost on Python 3.11), and
# ``move`` runs for every line.
_STATUS, _REPLY = Trigger.STATUS, Trigger.CHECKPOINT_REPLY
_CHECKPOINTING = State.CHECKPOINTING


class ConnectionState:
    """Where one conversation is, and the only code that moves it (``move``).

    Read ``state``, ``resume``, ``answering``, ``stray`` and ``owes_status``. Nothing
    in the package assigns them but ``move`` (and ``owe``, for ``stray``):
    tests/protocol/test_state.py checks it. A new conversation is
    ``AWAITING_INITIALIZE`` with nothing owed (the class's defaults); a test may place
    one mid-conversation by assigning ``state``, as tests/shard/test_slots_ready.py does.
    """

    state: State = State.AWAITING_INITIALIZE
    resume: State | None = None  # where the outstanding checkpoint's reply returns to
    answering: str | None = None  # the daemon action the owed status answers
    stray: str | None = None  # a refused daemon action still owed a status

    def move(self, trigger: Trigger, action: str | None = None) -> State:
        """Take ``trigger`` and return the new state, or raise a protocol error and
        change nothing but ``stray``: a refused daemon action is recorded as owed a status.

        ``action``: for a daemon action, its wire name (``"shutdown"`` for both
        shutdown triggers); for ``STATUS``, the action it answers (``response_for``).
        A daemon action sets ``answering``, a ``STATUS`` clears it."""
        state = self.state
        new = TRANSITIONS.get((state, trigger))
        if new is None or (self.stray is not None and trigger in OURS) or (
            trigger is _STATUS and action != self.answering
        ):
            return self._refuse(state, trigger, action)
        if new is BACK:
            new, resume = self.resume, None
        else:
            resume = state if new is _CHECKPOINTING else None
        if trigger is _STATUS:
            answering = None
        else:
            answering = self.answering if action is None else action
        self.state, self.resume, self.answering = new, resume, answering  # type: ignore[assignment]
        return new

    def _refuse(self, state: State, trigger: Trigger, action: str | None) -> State:
        """Raise why ``trigger`` cannot be taken now, recording a refused daemon action
        as owed a status; or take the status owed for one (the only thing we may send
        while one is owed), which leaves ``state`` where it is."""
        if trigger in OURS:
            if self.stray is not None:  # the refused action's status comes first
                if trigger is not _STATUS:
                    raise LocalProtocolError(f"cannot checkpoint while {state.name} ({state.value})")
                if action != self.stray:
                    raise LocalProtocolError(
                        f"status for {action!r}, but the daemon waits for one "
                        f"for the out-of-order {self.stray!r}"
                    )
                self.stray = None
                return state
            if trigger is not _STATUS:
                raise LocalProtocolError(f"cannot checkpoint while {state.name} ({state.value})")
            if state not in OWING:
                raise LocalProtocolError(f"no status is owed while {state.name} ({state.value})")
            raise LocalProtocolError(
                f"status for {action!r}, but the action being answered is {self.answering!r}"
            )
        if trigger is _REPLY:
            raise RemoteProtocolError(f"checkpoint reply while {state.name} (no checkpoint outstanding)")
        if trigger is Trigger.END_OF_INPUT:
            raise RemoteProtocolError(f"end of input while {state.name} ({state.value})")
        self.stray = action
        raise RemoteProtocolError(f"{action} is out of order while {state.name} ({state.value})", action=action)

    def owe(self, action: str | None) -> None:
        """A line that could not be read: the daemon action it named still waits for
        its status (``None``, or a name in ``NEVER_OWED``: nothing is owed)."""
        self.stray = None if action is None or action in NEVER_OWED else action

    @property
    def owes_status(self) -> str | None:
        """The action name a status is owed for, if any."""
        if self.stray is not None:
            return self.stray
        if self.state in OWING:
            return self.answering
        return None
