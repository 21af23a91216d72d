"""Each folder of the package opens with its map: the docstring of its ``__init__.py``
names every module of the folder, and names none that does not exist, so it cannot drift
from ``ls``. docs/contributing.md's layout table points at these maps instead of copying them.

The convention: a module is named by a line of the docstring that starts (after any
indentation) with ``- ``, then the module's file name in double backquotes, then a
colon and one plain sentence of what it is for::

    - ``relay.py``: ``mldserver connect``, the daemon's child, in Python where ...
    - ``relay.c``: the same relay in C (built as ``mldserver-relay``) ...
    - ``bench/``: ``mldserver bench``, one module a part (its own map)

The modules of a folder: its ``.py`` files but ``__init__.py``, its ``.c`` files (the
native parts ``setup.py`` builds) and its subfolders with an ``__init__.py`` (named with
a trailing ``/``; each has its own map). Any other ``something.py`` a docstring mentions
in double backquotes must exist too, beside it, from ``mldserver/`` (``base/handoff.py``)
or from the checkout (``tests/test_layers.py``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import mldserver

PACKAGE = Path(mldserver.__file__).parent
ITEM = re.compile(r"^\s*- ``([A-Za-z0-9_]+(?:\.py|\.c|/))``:", re.MULTILINE)
MENTION = re.compile(r"``([A-Za-z0-9_/]+\.(?:py|c))``")
FOLDERS = sorted(path.parent for path in PACKAGE.rglob("__init__.py") if path.parent != PACKAGE)


def modules(folder: Path) -> set[str]:
    """What a folder's map must name: ``x.py`` (not ``__init__.py``), ``x.c``, ``sub/``."""
    return ({p.name for p in folder.glob("*.py") if p.name != "__init__.py"} | {p.name for p in folder.glob("*.c")}
            | {p.name + "/" for p in folder.iterdir() if (p / "__init__.py").is_file()})


def docstring(folder: Path) -> str:
    return ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""


def named(text: str) -> list[str]:
    return ITEM.findall(text)


def unknown_mentions(text: str, folder: Path) -> list[str]:
    """The ``x.py`` mentions that name nothing: beside the folder, from the package or
    from the checkout (``tests/test_layers.py``)."""
    return [m for m in MENTION.findall(text) if not any((root / m).exists() for root in (folder, PACKAGE, PACKAGE.parent))]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: str(f.relative_to(PACKAGE)))
def test_each_folder_docstring_names_its_modules_and_nothing_else(folder):
    text = docstring(folder)
    listed = named(text)
    where = f"mldserver/{folder.relative_to(PACKAGE)}/__init__.py"
    assert sorted(set(modules(folder)) - set(listed)) == [], (
        f"{where}: its docstring does not name these modules: add a line `- ``name``: what it is for.` for each")
    assert sorted(set(listed) - modules(folder)) == [], f"{where}: its docstring names modules that do not exist"
    assert sorted(m for m in set(listed) if listed.count(m) > 1) == [], f"{where}: a module named twice"
    assert unknown_mentions(text, folder) == [], f"{where}: its docstring mentions files that do not exist"


def test_the_check_finds_a_missing_a_stale_and_a_wrong_name(tmp_path):
    folder = tmp_path / "pkg"
    (folder / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "_n.c", "sub/__init__.py"):
        (folder / name).write_text("")
    text = '"""A folder.\n\n- ``a.py``: one.\n  - ``gone.py``: moved away.\n- ``sub/``: its own map.\n\nSee ``base/nowhere.py``."""\n'
    (folder / "__init__.py").write_text(text)
    listed = named(docstring(folder))
    assert listed == ["a.py", "gone.py", "sub/"]
    assert modules(folder) - set(listed) == {"b.py", "_n.c"} and set(listed) - modules(folder) == {"gone.py"}
    assert unknown_mentions(docstring(folder), folder) == ["gone.py", "base/nowhere.py"]


def test_every_folder_of_the_package_is_checked():
    assert {str(f.relative_to(PACKAGE)) for f in FOLDERS} >= {
        "api", "api/kclpy", "base", "coordinator", "examples", "ops", "ops/bench", "pool", "protocol", "server",
        "shard", "sinks", "sources", "spark", "timers"}
