"""Every class name once in the package: a name says one thing, so a reader (or a
traceback, or ``grep "class LeaseLost"``) never has to ask which of two it is.

The classes are found with ``ast`` in every module of ``mldserver/``, those nested in
functions and other classes included; ``mldserver/api/kclpy`` is excepted, as it keeps
amazon_kclpy's own names for the users who port their processors. A name two modules
must both define is in ``ALLOWED``, with the modules and the reason::

    # mldserver/ops/status.py                   # mldserver/sources/service.py
    class Unreachable(Exception): ...           class Unreachable(StreamsError): ...
    -> "Unreachable: mldserver/ops/status.py, mldserver/sources/service.py"
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import mldserver

PACKAGE = Path(mldserver.__file__).parent
EXCEPTED = ("api/kclpy",)  # amazon_kclpy's names (RecordProcessorBase, ...), as its users know them

ALLOWED = {
    # Both are documented handler paths users are told to run: the quick start's
    # (docs/quickstart.md, docs/local.md: mldserver.examples.quickstart:Orders) and
    # the demo's DynamoDB-stream one (mldserver.examples.orders:Orders, in its own
    # docstring and run by `mldserver demo`). Each module is a whole example on its own.
    "Orders": {"examples/orders.py", "examples/quickstart.py"},
    # Bloop reads a model's settings from a nested class it names Meta (bench --part
    # stream's peer, a script run with Bloop's own folder); the handler API's Meta is a
    # change's metadata (docs/sources.md and docs/handlers.md: a ChangeHandler's meta).
    "Meta": {"api/changes.py", "ops/bench/bloop_side.py"},
}


def class_names(root: Path, excepted: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Class name -> the modules (paths relative to ``root``) that define it."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if any(module.startswith(prefix + "/") for prefix in excepted):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].add(module)
    return found


def duplicates(found: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    """One line per name defined in more than one module and not allowed there."""
    return [f"{name}: {', '.join(sorted(modules))}" for name, modules in sorted(found.items())
            if len(modules) > 1 and modules != allowed.get(name)]


def test_every_class_name_is_defined_in_one_module():
    found = duplicates(class_names(PACKAGE, EXCEPTED), ALLOWED)
    assert found == [], ("class names defined in more than one module of mldserver/ (rename one to say what "
                         "it is, or add it to ALLOWED in tests/test_names.py with the reason):\n" + "\n".join(found))


def test_the_allowed_names_are_still_defined_where_listed():
    found = class_names(PACKAGE, EXCEPTED)
    stale = {name: modules for name, modules in ALLOWED.items() if found.get(name) != modules}
    assert stale == {}, f"ALLOWED in tests/test_names.py no longer matches the package: {stale}"


def test_a_name_in_two_modules_is_found_nested_ones_too_and_the_excepted_folder_is_not(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "sources").mkdir()
    (tmp_path / "api" / "kclpy").mkdir(parents=True)
    (tmp_path / "ops" / "status.py").write_text("class Unreachable(Exception):\n    pass\n")
    (tmp_path / "sources" / "service.py").write_text(
        "def open():\n    class Unreachable(Exception):\n        pass\n\nclass Page:\n    pass\n")
    (tmp_path / "api" / "kclpy" / "handler.py").write_text("class Page:\n    pass\n")

    found = class_names(tmp_path, EXCEPTED)

    assert duplicates(found, {}) == ["Unreachable: ops/status.py, sources/service.py"]
    assert duplicates(found, {"Unreachable": {"ops/status.py", "sources/service.py"}}) == []
    assert duplicates(class_names(tmp_path), {}) == ["Page: api/kclpy/handler.py, sources/service.py",
                                                     "Unreachable: ops/status.py, sources/service.py"]
