"""The package's layers: its top-level folders and modules in one order, each
importing only those below it; no import cycle between modules; pyspark only under
spark/.

The graph is built from the source with ``ast``: every import, those inside
functions and under ``TYPE_CHECKING`` included (a cycle closed inside a function is
still a cycle a reader has to hold in their head), relative imports resolved, and
``from package import module`` counted as importing the module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mldserver

PACKAGE = Path(mldserver.__file__).parent


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module ``name`` imports: of the package (resolved to the deepest known
    module) and outside it (as written)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:
                if f"{target}.{alias.name}" in known:  # from . import schema
                    found.add(f"{target}.{alias.name}")
    return found


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's ``__init__`` counts as
    a module; importing ``a.b.c`` also runs ``a`` and ``a.b``, which are not edges:
    what they import is their own edge)."""
    known = modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        edges[name] = {t for t in imports(name, path, known) if t in known and t != name}
    return edges


def external(root: Path, prefix: str) -> dict[str, set[str]]:
    """Module -> the imports of it that start with ``prefix`` (``pyspark``)."""
    known = modules(root)
    out = {}
    for name, path in known.items():
        hits = {t for t in imports(name, path, known) if t == prefix or t.startswith(prefix + ".")}
        if hits:
            out[name] = hits
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


# Top to bottom: an entry imports only entries below it (``mldserver/__init__.py``, the
# handler API's lazy names, is the face and may name any).
LAYERS = [
    "__main__", "cli",      # the command line
    "ops",                  # run, check, status, demo, bench, the relay
    "examples",             # handlers shipped with the package (the demo's)
    "server",               # the server process: lifecycle, assembly, listeners, admin, metrics
    "sources",              # streams the server reads itself (--source), fed as daemon connections
    "pool",                 # handler processes (pool/child.py: a handler process's main)
    "shard",                # one shard connection's driver and its policy
    "api",                  # what handlers import: Handler, records, checkpointer, context
    "coordinator",          # ordering, watermarks, windows, the ledger
    "sinks",                # file, parquet (through Spark), iceberg
    "rows",                 # the rows handlers emit, as the server carries them (RowBatch)
    "timers",               # durable timers: the API, the stores, the scheduler
    "spark",                # the Spark process boundary
    "base",                 # plumbing: config, logs, positions, durable files, the sinks' contract
    "protocol",             # the MultiLangDaemon protocol, sans-IO
    "errors",               # the error hierarchy
    "native",               # whether the native parts may be used (MLDSERVER_NO_EXTENSIONS)
    "faces",                # the packages' names imported when first asked for (PEP 562)
]


def entry(module: str) -> str:
    """The top-level entry a module belongs to: ``mldserver.shard.driver`` -> ``shard``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def back_edges(edges: dict[str, set[str]], layers: list[str]) -> list[str]:
    """Every import from an entry to one above it (or to one missing from ``layers``)."""
    rank = {name: i for i, name in enumerate(layers)}
    found = []
    for source, targets in sorted(edges.items()):
        a = entry(source)
        if a == "__init__":
            continue
        for target in sorted(targets):
            b = entry(target)
            if a == b or b == "__init__" and a in ("cli", "examples"):  # the face: mldserver.__version__
                continue
            if a not in rank or b not in rank or rank[b] < rank[a]:
                found.append(f"{source} -> {target}")
    return found


def test_every_entry_imports_only_the_entries_below_it():
    edges = graph(PACKAGE)
    entries = {entry(m) for m in edges} - {"__init__"}
    assert entries == set(LAYERS), "a new top-level entry: give it its place in LAYERS"
    assert back_edges(edges, LAYERS) == []


def test_an_import_up_the_layers_is_found_wherever_it_is(tmp_path):
    pkg = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/server/__init__.py": "",
        "pkg/server/main.py": "from ..shard import driver\n",
        "pkg/shard/__init__.py": "",
        "pkg/shard/driver.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..server.main import x\n",
        "pkg/base.py": "def f():\n    from .shard.driver import y\n",
    })  # fmt: skip
    assert back_edges(graph(pkg), ["server", "shard", "base"]) == [
        "pkg.base -> pkg.shard.driver", "pkg.shard.driver -> pkg.server.main"]


def test_no_module_of_the_package_is_in_an_import_cycle():
    edges = graph(PACKAGE)
    assert len(edges) > 40 and "mldserver.base.config" in edges["mldserver.sinks"]  # the graph sees real edges
    assert cycles(edges) == []


def test_only_the_spark_package_imports_pyspark():
    users = external(PACKAGE, "pyspark")
    assert "mldserver.spark.child" in users  # found, so the check below can fail
    assert sorted(m for m in users if not m.startswith("mldserver.spark.")) == []


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


CLOSED_IN_A_FUNCTION = {  # config -> sinks -> spark sink -> config, as it was
    "pkg/__init__.py": "",
    "pkg/config.py": "def load():\n    from .sinks import open_sink\n",
    "pkg/sinks/__init__.py": "from .spark import SparkSink\n",
    "pkg/sinks/spark.py": "from ..config import load\n",
    "pkg/leaf.py": "import os\n",
}
THROUGH_FROM_PACKAGE_IMPORT = {  # bench -> bench_coordinator -> bench_spark -> bench, as it was
    "pkg/__init__.py": "",
    "pkg/bench/__init__.py": "def main():\n    from . import coordinator\n",
    "pkg/bench/coordinator.py": "from pkg.bench import spark\n",
    "pkg/bench/spark.py": "from . import main\n",
}


@pytest.mark.parametrize(
    "files, cycle",
    [
        (CLOSED_IN_A_FUNCTION, ["pkg.config", "pkg.sinks", "pkg.sinks.spark"]),
        (THROUGH_FROM_PACKAGE_IMPORT, ["pkg.bench", "pkg.bench.coordinator", "pkg.bench.spark"]),
    ],
)
def test_a_cycle_is_found_however_it_is_closed(tmp_path, files, cycle):
    assert cycles(graph(write(tmp_path, files))) == [cycle]


def test_pyspark_outside_the_spark_package_is_found(tmp_path):
    pkg = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/bench.py": "def run():\n    from pyspark.sql.pandas.types import from_arrow_schema\n",
    })  # fmt: skip
    assert external(pkg, "pyspark") == {"pkg.bench": {"pyspark.sql.pandas.types"}}
