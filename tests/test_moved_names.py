"""The modules' old names keep working after the package was grouped by role: each
imports the moved module itself (one module object, so one class of each name),
as the README's examples and users' code spell them."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import mldserver

MOVED = {
    "mldserver.records": "mldserver.api.records",
    "mldserver.testing": "mldserver.api.testing",
    "mldserver.dynamodb_json": "mldserver.api.dynamodb_json",
    "mldserver.handler": "mldserver.api.handler",
    "mldserver.changes": "mldserver.api.changes",
    "mldserver.context": "mldserver.api.context",
    "mldserver.checkpointer": "mldserver.api.checkpointer",
    "mldserver.config": "mldserver.base.config",
    "mldserver.bindings": "mldserver.api.bindings",
}


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_name_imports_the_moved_module_itself(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_documented_spellings_work_in_a_fresh_interpreter():
    code = ("from mldserver.testing import FakeDaemon, make_records\n"
            "from mldserver.records import MAX_EVENT_TIME_MS\n"
            "import mldserver.config\n"
            "import mldserver\n"
            "assert mldserver.config.Settings is mldserver.Settings\n"
            "assert mldserver.records.Record is mldserver.Record\n"
            "from mldserver.server import Server\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_name_that_never_was_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mldserver.no_such_module")
    assert mldserver.Handler.__module__ == "mldserver.api.handler"
