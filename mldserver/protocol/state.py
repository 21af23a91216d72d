"""The conversation's states and the one table of transitions between them.

Everything that moves the state machine lives here (the h11 rule). The daemon drives
the conversation; our only moves are a Status (which ends an action) and a
Checkpoint (allowed only inside some actions, one outstanding at a time)::

    AWAITING_INITIALIZE --initialize--> INITIALIZING --status--> READY
    READY --processRecords--> PROCESSING --status--> READY
    READY --shutdownRequested--> SHUTTING_DOWN --status--> DRAINING
    READY|DRAINING --shardEnded / shutdown TERMINATE--> ENDING --status--> FINISHED
    READY|DRAINING --leaseLost / shutdown ZOMBIE--> LOSING --status--> FINISHED
    any --EOF--> CLOSED

While a checkpoint is outstanding the conversation is in CHECKPOINTING; the checkpoint
reply returns it to the state it came from (kept by the connection as ``resume``).
So does a line that cannot be read while CHECKPOINTING (not JSON, a reply with a field
of the wrong type, a line over ``max_line_size``): it is the reply, malformed, and the
checkpoint failed. Only a daemon action is ever owed a status: a
checkpoint reply, or our own ``status``, never is (``NEVER_OWED``).
"""

from __future__ import annotations

import enum


class State(enum.Enum):
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


# Daemon actions, by wire name (a KCL 1.x ``shutdown`` is keyed by its meaning:
# "shutdown:TERMINATE" is a shard end, "shutdown:ZOMBIE" and others a lost lease).
REMOTE_TRANSITIONS: dict[tuple[State, str], State] = {
    (State.AWAITING_INITIALIZE, "initialize"): State.INITIALIZING,
    (State.READY, "processRecords"): State.PROCESSING,
    (State.READY, "shutdownRequested"): State.SHUTTING_DOWN,
    (State.READY, "shardEnded"): State.ENDING,
    (State.READY, "shutdown:TERMINATE"): State.ENDING,
    (State.READY, "leaseLost"): State.LOSING,
    (State.READY, "shutdown:ZOMBIE"): State.LOSING,
    (State.DRAINING, "shardEnded"): State.ENDING,
    (State.DRAINING, "shutdown:TERMINATE"): State.ENDING,
    (State.DRAINING, "leaseLost"): State.LOSING,
    (State.DRAINING, "shutdown:ZOMBIE"): State.LOSING,
}

# Names that are never owed a status, however malformed the line that carried them.
NEVER_OWED: frozenset[str] = frozenset({"checkpoint", "status"})

# Our status ends the action being answered.
STATUS_TRANSITIONS: dict[State, State] = {
    State.INITIALIZING: State.READY,
    State.PROCESSING: State.READY,
    State.SHUTTING_DOWN: State.DRAINING,
    State.ENDING: State.FINISHED,
    State.LOSING: State.FINISHED,
}

# Where a checkpoint may be sent (the reply returns to the same state).
CHECKPOINT_ALLOWED: frozenset[State] = frozenset(
    {State.PROCESSING, State.SHUTTING_DOWN, State.ENDING}
)

# The action each status-owing state answers.
RESPONSE_FOR: dict[State, tuple[str, ...]] = {
    State.INITIALIZING: ("initialize",),
    State.PROCESSING: ("processRecords",),
    State.SHUTTING_DOWN: ("shutdownRequested",),
    State.ENDING: ("shardEnded", "shutdown"),
    State.LOSING: ("leaseLost", "shutdown"),
}
