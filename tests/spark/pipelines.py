"""Pipelines for the Spark tests, run in the server's Spark process. They read
their switches from the environment the test gives the server."""

from __future__ import annotations

import os
import time
from pathlib import Path


def slow(df, window):
    """Marks that a commit is under way, then takes its time: a window to kill in."""
    marks = Path(os.environ["MLDSERVER_TEST_MARKS"])
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"{window.id}-{os.getpid()}").touch()
    time.sleep(float(os.environ.get("MLDSERVER_TEST_SLEEP", "2")))
    return df


def fails_while_flagged(df, window):
    """Raises while the flag file exists."""
    if Path(os.environ["MLDSERVER_TEST_FLAG"]).exists():
        raise ValueError(f"bad window {window.id}")
    return df
