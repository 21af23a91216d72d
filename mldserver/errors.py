"""mldserver's own errors, one small hierarchy (aiokafka style: ``retriable`` says
whether trying again can help, instead of a subclass per case)::

    try:
        await checkpointer.checkpoint(record.sequence_number, record.sub_sequence_number)
    except mldserver.CheckpointError as exc:
        log(exc.error)        # "ShutdownException", "ThrottlingException", ...

The coordinator reads ``retriable`` to decide what a failed commit means::

    retriable(SparkError("ZeroDivisionError: ...")) -> True   # the pipeline raised: retried
    retriable(OSError(28, "No space left on device")) -> True # a sink's I/O: retried
    retriable(TypeError("...")) -> False                      # a bug: the committer dies,
                                                              # the server logs task_crashed
                                                              # and shuts down, exit 1
"""

from __future__ import annotations

# The daemon's transient errors (docs/protocol.md, section 5): retried with backoff.
RETRIABLE_CHECKPOINT_ERRORS = frozenset({"ThrottlingException", "KinesisClientLibDependencyException"})


class MldserverError(Exception):
    """The root: ``retriable`` is False unless a class (or an instance) says otherwise."""

    retriable = False


def retriable(exc: BaseException) -> bool:
    """Can trying the same thing again help? Ours say so; any OSError (a disk, a
    socket) may be transient; anything else is a bug and is not retried."""
    if isinstance(exc, MldserverError):
        return exc.retriable
    return isinstance(exc, OSError)


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


class SparkError(MldserverError):
    """Spark (or the user's pipeline) raised; ``traceback`` is the Spark process's.
    Retriable: a pipeline may fail on something outside that comes back (a table, a
    service), so a window is offered again; a Spark process that does not start says
    ``retriable=False``."""

    retriable = True

    def __init__(self, message: str, traceback: str = "", *, retriable: bool | None = None) -> None:
        super().__init__(message)
        self.traceback = traceback
        if retriable is not None:
            self.retriable = retriable


class SparkProcessDied(SparkError):
    """The Spark process exited with requests in flight: they are offered again once
    it is back (the commit log keeps a window from being committed twice)."""


class ServerCrashed(MldserverError):
    """A task the server owns died (logged as ``task_crashed``); the server shut down
    in order and the CLI exits 1 so that systemd starts it again."""


class ExecutionTimeout(BaseException):
    """Raised in a handler's code that blocks past ``execution_timeout``: where it blocks
    its handler process's loop (the server's SIGUSR2, ``pool/child.py``), or in the
    thread an amazon_kclpy processor runs in (``api/kclpy/thread.py``). Not an
    Exception: a handler's ``except Exception`` lets it pass."""
