"""The package's shape, kept: no class over 450 lines (one object a job), ``base/`` at
most a dozen modules (plumbing several layers use, not a drawer), and the handler
process's boundary (``HandlerProcess``) at most 15 attributes, its shared-memory
channel and its liveness objects of their own."""

from __future__ import annotations

import ast
from pathlib import Path

import mldserver

PACKAGE = Path(mldserver.__file__).parent


def classes():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(PACKAGE.parent), node


def attributes(node: ast.ClassDef) -> set[str]:
    """Every ``self.X`` a method of the class assigns."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def test_no_class_is_over_450_lines():
    sizes = {f"{path}:{node.name}": node.end_lineno - node.lineno + 1 for path, node in classes()}
    assert len(sizes) > 100 and max(sizes.values()) > 200  # found them all, the large ones too
    assert {name: n for name, n in sizes.items() if n > 450} == {}


def test_base_holds_at_most_a_dozen_modules():
    modules = sorted(p.name for p in (PACKAGE / "base").glob("*.py") if p.name != "__init__.py")
    assert 0 < len(modules) <= 12, modules


def test_the_handler_process_keeps_at_most_15_attributes():
    [found] = [node for path, node in classes() if node.name == "HandlerProcess"]
    assert 5 < len(attributes(found)) <= 15, sorted(attributes(found))
