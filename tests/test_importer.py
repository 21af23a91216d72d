"""The importer of ``--handler`` and ``--pipeline`` (``MODULE:ATTR``): each mistake an
exact ConfigError, a user's own failing import reported as theirs."""

from __future__ import annotations

import pytest

from mldserver.errors import ConfigError
from mldserver.base.importer import import_from_string

from . import handlers


def test_a_dotted_attribute_is_found():
    assert import_from_string("tests.handlers:Noop") is handlers.Noop


@pytest.mark.parametrize(
    "spec, what, message",
    [
        ("tests.handlers", "handler",
         'Import string "tests.handlers" must be in format "<module>:<attribute>" (handler).'),
        (":Noop", "pipeline", 'Import string ":Noop" must be in format "<module>:<attribute>" (pipeline).'),
        ("tests.nosuch:H", "handler", 'Could not import module "tests.nosuch" (handler tests.nosuch:H): is it on '
                                      "PYTHONPATH (the server's working directory is included)?"),
        ("tests.handlers:Nope", "handler", 'Attribute "Nope" not found in module "tests.handlers" (handler).'),
    ],
)
def test_each_mistake_is_an_exact_config_error(spec, what, message):
    with pytest.raises(ConfigError) as caught:
        import_from_string(spec, what)
    assert str(caught.value) == message


def test_something_not_callable_is_refused(tmp_path, monkeypatch):
    (tmp_path / "userconf.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        import_from_string("userconf:VALUE", "pipeline")
    assert str(caught.value) == '"userconf:VALUE" is not callable: the pipeline must be a class or a factory function.'


def test_an_import_failing_inside_the_users_module_is_theirs_not_a_missing_module(tmp_path, monkeypatch):
    (tmp_path / "userhandler.py").write_text("import no_such_dependency_of_theirs\n")
    (tmp_path / "userbroken.py").write_text("raise RuntimeError('bad config at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as missing:
        import_from_string("userhandler:H")
    assert str(missing.value) == ('Importing module "userhandler" (handler) failed: '
                                  "No module named 'no_such_dependency_of_theirs'")
    with pytest.raises(ConfigError) as broken:
        import_from_string("userbroken:H")
    assert str(broken.value) == 'Importing module "userbroken" (handler) failed: RuntimeError: bad config at import'
