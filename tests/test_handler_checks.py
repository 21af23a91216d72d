"""A handler is checked at start-up for what it means (``mldserver.api.checks``):
a near miss of a callback, no callback that handles records, a plain ``def``, a
constructor that fails as the server calls it. As a user meets it: ``mldserver serve``
exits 2 with one line, in a handler process and in the server's own loop alike."""

from __future__ import annotations

import subprocess

import pytest

import mldserver
from mldserver.errors import ConfigError
from mldserver.api.checks import check_class, check_handler, emits

from .faulty_handlers import NoContext, Typo
from .harness import MLDSERVER, ROOT


class Helper(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        for record in batch.records:
            await self.process_record(record)

    async def process_record(self, record):  # a helper beside the callback: fine
        pass


class ChangeTypo(mldserver.ChangeHandler):
    async def on_updte(self, doc, meta):
        pass


class ShardEnd(mldserver.Handler):
    async def process_records(self, batch, checkpointer):
        pass

    async def shard_end(self, checkpointer):
        pass


class Nothing(mldserver.Handler):
    async def initialize(self, shard):
        pass


class NoChanges(mldserver.ChangeHandler):
    def kinesis_doc(self, data):
        return data


class Plain(mldserver.Handler):
    def process_records(self, batch, checkpointer):  # type: ignore[override]
        pass


class Emits(mldserver.ChangeHandler):
    async def on_update(self, doc, meta):
        if doc:
            self.emit({"doc": doc})


@pytest.mark.parametrize("cls, message", [
    (Typo, "Typo: process_record is not a callback the server calls: did you mean process_records?"),
    (ChangeTypo, "ChangeTypo: on_updte is not a callback the server calls: did you mean on_update?"),
    (ShardEnd, "ShardEnd: shard_end is not a callback the server calls: did you mean shard_ended?"),
    (Nothing, "Nothing: it defines no process_records, so no record would be handled"),
    (NoChanges, "NoChanges: a ChangeHandler needs on_update or on_delete"),
    (Plain, "process_records must be a coroutine function"),
])
def test_a_handler_class_that_does_not_mean_what_it_says_is_refused_naming_it(cls, message):
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        check_class(cls)


def test_a_helper_named_like_a_callback_beside_the_callback_is_fine():
    check_class(Helper)
    assert isinstance(check_handler(Helper, None), Helper)


def test_the_constructor_is_called_as_the_server_calls_it_and_its_failure_names_the_class():
    with pytest.raises(ConfigError, match=r"handler x:NoContext: .*NoContext\(context\) failed at start-up: TypeError"):
        check_handler(NoContext, None, "x:NoContext")


def test_a_factory_function_is_called_and_what_it_makes_is_checked():
    with pytest.raises(ConfigError, match="did you mean process_records"):
        check_handler(lambda context: Typo(context), None)
    with pytest.raises(ConfigError, match="returned None"):
        check_handler(lambda context: None, None)


def test_emits_sees_emit_in_the_handlers_own_code():
    assert emits(Emits) and not emits(Helper)


@pytest.mark.parametrize("workers", ["2", "0"])
@pytest.mark.parametrize("attr, message", [
    ("Typo", "did you mean process_records?"),
    ("NoContext", "NoContext(context) failed at start-up: TypeError"),
])
def test_serve_refuses_the_handler_in_one_line_before_anything_starts(tmp_path, workers, attr, message):
    out = subprocess.run([MLDSERVER, "serve", "--handler", f"tests.faulty_handlers:{attr}", "--port", "0",
                          "--admin", "off", "--workers", workers, "--state-dir", str(tmp_path / "state")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("mldserver: handler tests.faulty_handlers") and message in out.stderr, out.stderr


def test_check_handler_alone_runs_the_same_checks():
    out = subprocess.run([MLDSERVER, "check", "--handler", "tests.faulty_handlers:Typo"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "did you mean process_records?" in out.stderr, out.stderr
    out = subprocess.run([MLDSERVER, "check", "--handler", "tests.handlers:CheckpointLast"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "handler     tests.handlers:CheckpointLast (class; its callbacks and constructor checked)" in out.stdout
