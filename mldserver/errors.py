"""mldserver's own errors, one small hierarchy (aiokafka style: ``retriable`` says
whether trying again can help, instead of a subclass per case)::

    try:
        await checkpointer.checkpoint(record.sequence_number, record.sub_sequence_number)
    except mldserver.CheckpointError as exc:
        log(exc.error)        # "ShutdownException", "ThrottlingException", ...
"""

from __future__ import annotations

# The daemon's transient errors (PROTOCOL.md section 5): retried with backoff.
RETRIABLE_CHECKPOINT_ERRORS = frozenset({"ThrottlingException", "KinesisClientLibDependencyException"})


class MldserverError(Exception):
    retriable = False


class ConfigError(MldserverError):
    """Bad settings or a handler that cannot be loaded: the message says what to fix."""


class CheckpointError(MldserverError):
    """The daemon refused a checkpoint; ``error`` is its Java exception's simple name."""

    def __init__(
        self,
        error: str,
        sequence_number: str | None = None,
        sub_sequence_number: int | None = None,
        detail: str = "",
    ) -> None:
        self.error = error
        self.sequence_number = sequence_number
        self.sub_sequence_number = sub_sequence_number
        self.retriable = error in RETRIABLE_CHECKPOINT_ERRORS
        where = "all delivered" if sequence_number is None else f"{sequence_number}/{sub_sequence_number}"
        super().__init__(f"checkpoint at {where} failed: {error}" + (f" ({detail})" if detail else ""))
