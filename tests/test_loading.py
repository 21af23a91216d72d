"""What ``--handler`` names, as the server calls it: an amazon_kclpy processor class
(v1, v2, v3, by its base class) wrapped, one of its instances or anything not callable
refused with what to write instead, a missing amazon_kclpy named with its extra, and
``check`` and ``serve`` saying it in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mldserver.api.checks import check_handler, emits
from mldserver.api.context import Context
from mldserver.api.handler import Handler
from mldserver.api.kclpy import processor_api
from mldserver.api.loading import handler_factory, load_handler
from mldserver.base.config import Settings
from mldserver.errors import ConfigError

from . import handlers, kclpy_handlers
from .harness import MLDSERVER, ROOT


@pytest.mark.parametrize("spec, version", [("samples.sample_kclpy_app:RecordProcessor", 3),
                                           ("tests.kclpy_handlers:V2Processor", 2),
                                           ("tests.kclpy_handlers:V1Processor", 1)])
def test_a_processor_class_of_each_api_is_recognised_by_its_base_and_wrapped(spec, version):
    factory = load_handler(spec)
    assert issubclass(factory, Handler) and factory.api_version == version
    module, _, name = spec.partition(":")
    assert (factory.__module__, factory.__qualname__) == (module, name)  # errors name the user's class
    handler = check_handler(factory, Context(Settings()), spec)
    assert type(handler.processor).__name__ == name and not emits(factory)


def test_anything_else_is_as_it_was():
    assert load_handler("tests.handlers:Noop") is handlers.Noop
    assert handler_factory(handlers.Noop) is handlers.Noop
    assert processor_api(handlers.Noop) is None and processor_api(kclpy_handlers.V2Processor()) is None
    assert emits(load_handler("tests.kclpy_handlers:Emits"))  # its code calls emit


def test_an_instance_or_something_not_callable_is_refused_with_what_to_write(tmp_path, monkeypatch):
    (tmp_path / "kclapp.py").write_text("from tests.kclpy_handlers import V2Processor\nprocessor = V2Processor()\n"
                                        "SETTING = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_handler("kclapp:processor")
    assert str(caught.value) == (
        "handler kclapp:processor is an instance of the amazon_kclpy processor tests.kclpy_handlers.V2Processor: "
        "name its class (--handler kclapp:V2Processor); the server makes one instance per shard, as KCLProcess "
        "makes one per process")
    with pytest.raises(ConfigError) as caught:
        load_handler("kclapp:SETTING")
    assert str(caught.value) == '"kclapp:SETTING" is not callable: the handler must be a class or a factory function.'


def test_a_processor_whose_constructor_fails_or_a_lookalike_that_is_not_one_is_told_so(tmp_path, monkeypatch):
    (tmp_path / "kcllike.py").write_text(
        "from tests.kclpy_handlers import Base\n"
        "class NeedsArgs(Base):\n    def __init__(self, table):\n        self.table = table\n"
        "class Lookalike:\n    def initialize(self, initialize_input): pass\n"
        "    def process_records(self, process_records_input): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        check_handler(load_handler("kcllike:NeedsArgs"), Context(Settings()), "kcllike:NeedsArgs")
    assert str(caught.value).startswith("handler kcllike:NeedsArgs: kcllike.NeedsArgs() failed at start-up: "
                                        "TypeError: ")
    assert str(caught.value).endswith("(the server builds one per shard with no arguments, as KCLProcess's "
                                      "script does)")
    with pytest.raises(ConfigError) as caught:
        check_handler(load_handler("kcllike:Lookalike"), Context(Settings()), "kcllike:Lookalike")
    assert "initialize must be a coroutine function" in str(caught.value)
    assert "an amazon_kclpy processor runs unchanged when it subclasses amazon_kclpy's RecordProcessorBase" in \
        str(caught.value)


def test_without_amazon_kclpy_a_processors_module_is_refused_naming_the_extra(tmp_path, monkeypatch):
    (tmp_path / "kclmissing.py").write_text("from amazon_kclpy.v3 import processor\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.partition(".")[0] == "amazon_kclpy"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(ConfigError) as caught:
        load_handler("kclmissing:RecordProcessor")
    assert str(caught.value).startswith('Importing module "kclmissing" (handler) failed: ')
    assert str(caught.value).endswith(": an amazon_kclpy processor needs it: pip install 'mldserver[kclpy]' "
                                      "(or the amazon-kclpy your application uses)")


@pytest.mark.parametrize("command", ["check", "serve"])
def test_check_and_serve_say_what_to_install_in_one_line_and_exit_2(tmp_path, command):
    missing = tmp_path / "missing" / "amazon_kclpy"  # first on the path: imports as a package that is not there
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'amazon_kclpy\'", '
                                         'name="amazon_kclpy")\n')
    args = ["--handler", "samples.sample_kclpy_app:RecordProcessor"]
    if command == "serve":
        args += ["--state-dir", str(tmp_path / "state"), "--port", "0", "--admin", "off"]
    done = subprocess.run([MLDSERVER, command, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{missing.parent}:{ROOT}"})
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert line.endswith('"samples.sample_kclpy_app" (handler) failed: No module named \'amazon_kclpy\': an '
                         "amazon_kclpy processor needs it: pip install 'mldserver[kclpy]' (or the amazon-kclpy "
                         "your application uses)"), line
