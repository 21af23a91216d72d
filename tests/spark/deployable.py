"""A pipeline module that fails to import while the file ``MLDSERVER_TEST_FLAG`` names
exists: a broken deploy, met when the Spark process is started again."""

from __future__ import annotations

import os
from pathlib import Path

if Path(os.environ.get("MLDSERVER_TEST_FLAG", "/nonexistent")).exists():  # (unset: collected for doctests)
    raise RuntimeError("a broken deploy of the pipeline")


def pipeline(df, window):
    return df
