"""The reference pages, generated from the code so they cannot drift: every setting
(``mldserver.base.config.Settings``, each with its Rule), every command and option (the
parser of ``mldserver.cli``), every metric (each Prometheus instrument the package
makes), every log event (``mldserver/base/events.toml``), what to do about each
warning and error, and the Python API (``mldserver.__all__`` and ``mldserver.api.testing``,
rendered by mkdocstrings from the docstrings).

mkdocs runs it as a hook (``hooks:`` in mkdocs.yml): ``on_files`` puts the pages
generated now in the build, in place of the copies committed under ``docs/reference/``
(kept so that the links to them read on GitHub too). ``tests/test_docs.py`` builds the
site and reads the pages back against the same sources, both ways, and fails when a
committed copy differs from what the code generates. After a change to what they list::

    .venv/bin/python docs/reference.py --write      # rewrites docs/reference/*.md

To look at one page's Markdown: ``python docs/reference.py settings``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the package of this checkout, as the tests import it
    sys.path.insert(0, str(ROOT))

from mldserver import cli  # noqa: E402
from mldserver.base import config  # noqa: E402
from mldserver.base.logs import LEVELS, events  # noqa: E402

PACKAGE = ROOT / "mldserver"
EVENTS = events()  # the catalogue, mldserver/base/events.toml
GENERATED = ("This page is generated from the code (`docs/reference.py`, at every build; the copy in the "
             "repository by `python docs/reference.py --write`).")
WIDE = "---\nhide:\n  - toc\n---\n\n"  # a page that is one wide table: no table of contents beside it


# -- settings ------------------------------------------------------------------------------

class Setting(NamedTuple):
    name: str  # the field of Settings, and the TOML key
    kind: str
    default: str
    allowed: str
    flag: str  # of serve and run ("" if none)
    note: str  # the comment on the field's line, and the flag's help
    group: str  # the comment above the fields it belongs to


def settings() -> list[Setting]:
    comments = _settings_comments()
    flags = _serve_flags()
    out = []
    for field in dataclasses.fields(config.Settings):
        rule = config.RULES[field.name]
        trailing, group = comments.get(field.name, ("", ""))
        flag, help_ = flags.get(field.name, ("", ""))
        note = "; ".join(x for x in (trailing, help_) if x)
        out.append(Setting(field.name, _kind(rule, field.default), _default(field.default), _allowed(rule),
                           flag, note, group))
    return out


def _kind(rule: config.Rule, default: Any) -> str:
    names = {int: "integer", float: "number", str: "string", dict: "table", tuple: "list of strings"}
    return names.get(rule.kind, rule.kind.__name__)


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    return f"`{value}`"


def _allowed(rule: config.Rule) -> str:
    if rule.item is not None:
        return "each " + _allowed(rule.item)
    if rule.choices:
        return ", ".join(f"`{c}`" for c in rule.choices)
    if rule.kind in (int, float) and (rule.low is not None or rule.high is not None):
        return rule.allowed() + (" (finite)" if rule.kind is float else "")
    if rule.kind is str and not rule.empty:
        return "not empty"
    if rule.kind is dict:
        return "a TOML table"
    return "any"


def _settings_comments() -> dict[str, tuple[str, str]]:
    """Field -> (the comment on its line, the comment block above it or above the fields
    before it), read from config.py's source."""
    source = Path(config.__file__).read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    lines = {n.lineno: n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    out: dict[str, tuple[str, str]] = {}
    group: list[str] = []
    previous = cls.body[0].end_lineno or cls.lineno
    for line in sorted(lines):
        above = [comments[n] for n in range(previous + 1, line) if n in comments and n not in code_lines]
        if above:
            group = above
        trailing = comments.get(line, "") if line in code_lines else ""
        out[lines[line]] = (trailing, " ".join(group))
        previous = line
    return out


def _serve_flags() -> dict[str, tuple[str, str]]:
    """Setting -> (the serve flag that sets it, its help)."""
    serve = _subparsers(cli._parser())["serve"]
    return {a.dest: (", ".join(a.option_strings), a.help or "") for a in serve._actions
            if a.option_strings and a.dest in config.RULES}


def settings_page() -> str:
    out = [WIDE + "# Settings", "",
           "Every setting, from `mldserver.base.config.Settings`: set it in a TOML file (`--config FILE`, "
           "the key is the setting's name, at the top level; a table setting is a TOML table, "
           "`[spark_conf]`) or, where there is one, with the flag of `mldserver serve` and `mldserver run`. "
           "The flag wins over the file, the file over the default; each value is checked against its "
           "range for the file and the flags alike, and a mistake stops the server with one line naming "
           "it (exit 2).", "",
           "```toml", "# mldserver.toml", 'handler = "handlers.orders:Orders"', "execution_timeout = 30.0",
           'sink = "file:./windows"', "", "[spark_conf]", '"spark.driver.memory" = "2g"', "```", "",
           GENERATED, ""]
    group = None
    for s in settings():
        if s.group != group:
            group = s.group
            out += ["", (_sentence(group) if group else "Serving: what runs, where it listens and logs, "
                         "where it keeps its state."), "",
                    "| setting (TOML key) | type | default | allowed | flag | notes |",
                    "|---|---|---|---|---|---|"]
        flag = f"`{s.flag}`" if s.flag else ""
        out.append(f"| `{s.name}` | {s.kind} | {s.default} | {_cell(s.allowed)} | {flag} | {_cell(s.note)} |")
    return "\n".join(out) + "\n"


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- the command line ----------------------------------------------------------------------

class Option(NamedTuple):
    command: str  # "" for mldserver's own options
    names: str  # "--port" or "-h, --help" or a positional's name
    argument: str
    default: str
    help: str


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def options(parser: argparse.ArgumentParser | None = None) -> list[Option]:
    parser = parser or cli._parser()
    out = [_option("", a) for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    for command, sub in _subparsers(parser).items():
        out += [_option(command, a) for a in sub._actions]
    return out


def _option(command: str, action: argparse.Action) -> Option:
    names = ", ".join(action.option_strings) or action.dest
    if action.nargs == 0:
        argument = ""
    else:
        argument = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
        if action.choices:
            argument = "{" + ",".join(map(str, action.choices)) + "}"
        if action.type is not None:
            argument += f" ({getattr(action.type, '__name__', action.type)})"
        if action.nargs in ("+", "*"):
            argument += " ..."
    if action.nargs == argparse.SUPPRESS or action.default in (None, False, argparse.SUPPRESS):
        default = ""
    else:
        default = f"`{' '.join(map(str, action.default)) if isinstance(action.default, list) else action.default}`"
    repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) and "repeatable" not in (
        action.help or "") else ""
    return Option(command, names, argument, default, (action.help or "") + repeat)


def cli_page() -> str:
    parser = cli._parser()
    helps = _command_helps(parser)
    out = ["# Command line", "",
           f"`mldserver {{{','.join(_subparsers(parser))}}}`: every command and option, from the argument "
           "parser of `mldserver/cli.py`. A mistake in the arguments is one line on stderr, with the nearest "
           "known option, and exit 2. The flags of `serve` that set a setting are listed with it in "
           "[Settings](settings.md).", "", GENERATED, ""]
    groups: dict[str, list[Option]] = {}
    for option in options(parser):
        groups.setdefault(option.command, []).append(option)
    for command, rows in groups.items():
        title = f"mldserver {command}".strip()
        out += ["", f"## `{title}`", ""]
        if command:
            out += [_sentence(helps.get(command, "")), ""]
        out += ["| option | argument | default | what |", "|---|---|---|---|"]
        for o in rows:
            argument = f"`{o.argument}`" if o.argument else ""
            out.append(f"| `{o.names}` | {_cell(argument)} | {_cell(o.default)} | {_cell(o.help)} |")
    return "\n".join(out) + "\n"


# -- metrics -------------------------------------------------------------------------------

class Metric(NamedTuple):
    name: str  # as exposed: a counter's with _total
    kind: str
    labels: tuple[str, ...]
    help: str
    where: str


_INSTRUMENTS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
                "CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge",
                "HistogramMetricFamily": "histogram", "SummaryMetricFamily": "summary"}


def metrics(root: Path = PACKAGE) -> list[Metric]:
    """Every Prometheus instrument the package makes (a constructor called with the
    metric's name as a string), whatever registry or collector it ends up in."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in _INSTRUMENTS and len(node.args) >= 2):
                continue
            name, doc = (ast.literal_eval(a) if isinstance(a, ast.Constant) else None for a in node.args[:2])
            if not isinstance(name, str):
                continue
            labels: Any = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg in ("labels", "labelnames")), None)
            labels = tuple(ast.literal_eval(labels)) if labels is not None else ()
            kind = _INSTRUMENTS[node.func.id]
            exposed = name.removesuffix("_total") + "_total" if kind == "counter" else name
            out.append(Metric(exposed, kind, labels, doc or "", path.relative_to(ROOT).as_posix()))
    return sorted(out)


def metrics_page() -> str:
    out = [WIDE + "# Metrics", "",
           "What `GET /metrics` on the admin endpoint answers (Prometheus text, the server's own registry): "
           "every instrument the package makes. A histogram is exposed as its `_bucket`, `_sum` and `_count` "
           "series. Per-shard series (`shard_id`) last while the shard's connection does. Some appear only "
           "where their part runs: the coordinator's with a sink, the Spark process's with Spark.", "",
           GENERATED, "",
           "| metric | type | labels | what | from |", "|---|---|---|---|---|"]
    for m in metrics():
        labels = ", ".join(f"`{x}`" for x in m.labels)
        out.append(f"| `{m.name}` | {m.kind} | {labels} | {_cell(m.help)} | `{m.where}` |")
    return "\n".join(out) + "\n"


# -- log events ----------------------------------------------------------------------------

# The catalogue (mldserver/base/events.toml) is what the code may log; the code's log calls,
# read from its source, are what it does log, with the fields each passes: the pages list
# both, and tests/test_events.py checks that they are the same events at the same levels.

# Log calls whose event is not a string at the call, by "path:function": what they can
# emit (``emitted`` resolves a module-level constant, ``EVENT = "..."``, itself).
COMPUTED: dict[str, dict[str, tuple[str, ...]]] = {
    "mldserver/ops/daemon.py:_told": {  # ops.daemon.PATTERNS: lines of the daemon's log
        "daemon_lease_taken": ("info",), "daemon_lease_lost": ("info", "warning")},
    "mldserver/ops/daemon.py:_error": {  # at the daemon's own level (ops.daemon_messages.LEVELS)
        "daemon_error": ("debug", "info", "warning", "error")},
    "mldserver/ops/daemon.py:report": {  # "properties_" + a finding's level
        "properties_error": ("error",), "properties_warning": ("warning",)},
}


class Site(NamedTuple):
    path: str  # relative to the package's parent: mldserver/shard/driver.py
    line: int
    function: str
    level: str
    fields: tuple[str, ...]  # the keyword arguments given at the call


def emitted(root: Path = PACKAGE) -> tuple[dict[str, list[Site]], list[str]]:
    """What the package's source logs: event -> its call sites, and the log calls whose
    event could not be read (neither a string, a module constant nor in ``COMPUTED``).

    A log call is a call of ``debug``/``info``/``warning``/``error`` on something whose
    name says log (``log``, ``self.log``, ``wire.log``, ``get_logger(...)``), of either
    of two such methods (``(log.debug if initial else log.info)(...)``), or of
    ``getattr(<log>, level)``. Calls on ``context.log`` are a handler's own events."""
    found: dict[str, list[Site]] = {}
    unread: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel == "mldserver/base/logs.py":
            continue
        tree = ast.parse(path.read_text(), rel)
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
        for function, call in _calls(tree):
            levels, receiver = _log_call(call.func)
            if not levels or "log" not in receiver.lower() or receiver.endswith("context.log"):
                continue
            fields = tuple(k.arg for k in call.keywords if k.arg and k.arg != "exc_info")
            first = call.args[0] if call.args else None
            if levels == ("computed",):  # getattr(log, level)(...): only COMPUTED says what
                names = COMPUTED.get(f"{rel}:{function}", {})
                if not names:
                    unread.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:120]}")
                    continue
            elif isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = {first.value: levels}
            elif isinstance(first, ast.Name) and first.id in constants:
                names = {constants[first.id]: levels}
            elif f"{rel}:{function}" in COMPUTED:
                names = COMPUTED[f"{rel}:{function}"]
            else:
                unread.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:120]}")
                continue
            for name, levels in names.items():
                for lv in levels:
                    found.setdefault(name, []).append(Site(rel, call.lineno, function, lv, fields))
    return found, unread


def _calls(tree: ast.AST):
    """(enclosing function's name, call) for every call in ``tree``."""
    def visit(node: ast.AST, function: str):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, name)
    yield from visit(tree, "<module>")


def _log_call(func: ast.expr) -> tuple[tuple[str, ...], str]:
    """(levels, receiver's text) if ``func``, what a call calls, looks like a logger's
    method: ``log.info``, ``(log.debug if initial else log.info)``, or
    ``getattr(log, level)`` (levels ``("computed",)``); else ((), "")."""
    if isinstance(func, ast.Attribute) and func.attr in LEVELS + ("exception", "critical"):
        return (func.attr,), ast.unparse(func.value)
    if isinstance(func, ast.IfExp):
        (a, receiver), (b, other) = _log_call(func.body), _log_call(func.orelse)
        return (a + b, receiver) if a and b and receiver == other else ((), "")
    if (isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr"
            and func.args):
        return ("computed",), ast.unparse(func.args[0])
    return (), ""


def log_events_page() -> str:
    sites, _ = emitted(PACKAGE)
    out = ["# Log events", "",
           "Every event mldserver logs, from its catalogue, `mldserver/base/events.toml`. Logs are one JSON "
           "object per line (`--log-format json`, the default), with `ts`, `level`, `event` and the fields "
           "below; follow one shard with `jq -c 'select(.shard_id==\"shardId-000000000001\")'`. The fields "
           "are the ones the code passes at its log calls; a shard's events also carry `conn` and `shard_id`. "
           "What a handler logs through `context.log` is its own.", "",
           GENERATED + " The tests run with `MLDSERVER_CHECK_EVENTS=1`: a logger then refuses an event, or "
           "a level of it, that is not in the catalogue, and a test compares the catalogue with the log calls "
           "of the code both ways.", ""]
    area = None
    for name, event in sorted(EVENTS.items(), key=lambda kv: (list(_areas()).index(kv[1].area), kv[0])):
        if event.area != area:
            area = event.area
            out += ["", f"## {area[:1].upper()}{area[1:]}", "", "| event | level | what | fields |",
                    "|---|---|---|---|"]
        fields = sorted({f for s in sites.get(name, []) for f in s.fields})
        todo = f" [What to do](warnings-and-errors.md#{name})." if event.todo else ""
        out.append(f"| `{name}` | {', '.join(event.levels)} | {_cell(event.meaning)}{todo} | "
                   f"{', '.join(f'`{f}`' for f in fields)} |")
    return "\n".join(out) + "\n"


def warnings_page() -> str:
    """Every warning and error of the catalogue, with what it means and what to do
    (``LogEvent.todo``), by area: the reference half of troubleshooting."""
    out = ["# Warnings and errors: what to do", "",
           "Every event mldserver logs as a warning or an error, from its catalogue "
           "(`mldserver/base/events.toml`, which also says what to do about each), with the fields its log "
           "lines carry. Find a line's `event` here: `jq -c 'select(.level==\"warning\" or "
           ".level==\"error\")' server.log` lists them. The first-hour questions (no windows committed, late "
           "rows, the daemon's first minute, dead letters) are answered in "
           "[Troubleshooting](../troubleshooting.md); every event, the informational ones too, is in "
           "[Log events](log-events.md).", "", GENERATED, ""]
    sites, _ = emitted(PACKAGE)
    area = None
    for name, event in sorted(EVENTS.items(), key=lambda kv: (list(_areas()).index(kv[1].area), kv[0])):
        levels = [lv for lv in event.levels if lv in ("warning", "error")]
        if not levels:
            continue
        if event.area != area:
            area = event.area
            out += ["", f"## {area[:1].upper()}{area[1:]}", ""]
        fields = sorted({f for s in sites.get(name, []) for f in s.fields})
        out += ["", f"### `{name}`", "",  # its anchor is its name, here and on GitHub
                f"**{', '.join(levels)}**: {event.meaning}" + (
                    f" Fields: {', '.join(f'`{f}`' for f in fields)}." if fields else ""), "",
                f"**What to do**: {event.todo}", ""]
    return "\n".join(out) + "\n"


def _areas() -> dict[str, None]:
    return dict.fromkeys(e.area for e in EVENTS.values())


# -- the Python API ------------------------------------------------------------------------

class Name(NamedTuple):
    public: str  # as a user imports it: mldserver.Handler, mldserver.api.testing.FakeDaemon
    path: str  # where it is defined, which mkdocstrings loads: mldserver.api.handler.Handler
    value: Any


def api() -> list[Name]:
    """Every public name: ``mldserver.__all__`` (exported lazily, each from its module)
    and ``mldserver.api.testing.__all__``, in their order."""
    import mldserver
    from mldserver.api import testing

    out = []
    for module, names in (("mldserver", mldserver.__all__), ("mldserver.api.testing", testing.__all__)):
        for name in names:
            value = getattr(mldserver if module == "mldserver" else testing, name)
            defined = (f"{value.__module__}.{value.__qualname__}" if inspect.isclass(value) or inspect.isfunction(value)
                       else f"{testing.__name__ if module != 'mldserver' else mldserver._EXPORTS[name]}.{name}")
            out.append(Name(f"{module}.{name}", defined, value))
    return out


def undocumented(names: list[Name] | None = None) -> list[str]:
    """The public names, and the public methods and properties of the public classes,
    that have no docstring of their own (a dataclass's or a NamedTuple's generated
    ``Name(field, ...)`` is none; a method may take its base's); a constant's is the string
    under its assignment, as mkdocstrings reads it."""
    missing = []
    for name in api() if names is None else names:
        value = name.value
        if inspect.isclass(value):
            doc = vars(value).get("__doc__") or ""
            if doc.startswith(value.__name__ + "("):
                doc = ""
        elif callable(value):
            doc = inspect.getdoc(value) or ""
        else:
            doc = _attribute_docstring(name.path)
        if not doc.strip():
            missing.append(name.public)
        if inspect.isclass(value):
            for attr, member in vars(value).items():
                if attr.startswith("_") or not (isinstance(member, (property, staticmethod, classmethod))
                                                or inspect.isfunction(member)):
                    continue
                doc = inspect.getdoc(member) if isinstance(member, property) else inspect.getdoc(getattr(value, attr))
                if not (doc or "").strip():
                    missing.append(f"{name.public}.{attr}")
    return missing


def _attribute_docstring(path: str) -> str:
    """The string literal right under ``NAME = ...`` at the top level of its module."""
    module, _, attr = path.rpartition(".")
    tree = ast.parse(Path(sys.modules[module].__file__).read_text())
    for node, after in zip(tree.body, tree.body[1:]):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(
                    after.value.value, str):
                return after.value.value
    return ""


def _summary(value: Any, path: str) -> str:
    doc = (vars(value).get("__doc__") if inspect.isclass(value) else inspect.getdoc(value) if callable(value)
           else _attribute_docstring(path)) or ""
    return " ".join(doc.strip().split("\n\n")[0].split()).rstrip(":")


def api_page() -> str:
    names = api()
    out = ["# Python API", "",
           "Every public name of `mldserver` (what `import mldserver` gives: the handler API, the stream "
           "reader, the errors) and of `mldserver.api.testing` (a fake daemon and records for testing handlers), "
           "with its signature and docstring. The names of `mldserver` are imported lazily, each from the "
           "module named below; import them from `mldserver` (`mldserver.Handler`), not from there.", "",
           GENERATED + " A public name without a docstring fails `tests/test_docs.py`.", "",
           "| name | what | defined in |", "|---|---|---|"]
    for name in names:
        module = name.path.rsplit(".", 1)[0]
        out.append(f"| [`{name.public}`](#{name.path}) | {_cell(_summary(name.value, name.path))} | `{module}` |")
    section = None
    for name in names:
        module = name.public.rsplit(".", 1)[0]
        if module != section:
            section = module
            out += ["", f"## `{module}`", ""]
        out += ["", f"::: {name.path}", "    options:", f'      heading: "{name.public}"', ""]
    return "\n".join(out) + "\n"


# -- the mkdocs hook -----------------------------------------------------------------------

PAGES = {"reference/settings.md": settings_page, "reference/cli.md": cli_page,
         "reference/metrics.md": metrics_page, "reference/log-events.md": log_events_page,
         "reference/warnings-and-errors.md": warnings_page, "reference/api.md": api_page}
DOCS = ROOT / "docs"
WRITE = "python docs/reference.py --write"


def stale() -> list[str]:
    """The committed pages (``docs/reference/*.md``) that differ from what the code
    generates now, or are missing."""
    return [uri for uri, page in PAGES.items()
            if not (DOCS / uri).is_file() or (DOCS / uri).read_text() != page()]


def write() -> list[str]:
    """Rewrite the committed pages that are stale; which."""
    changed = stale()
    for uri in changed:
        (DOCS / uri).parent.mkdir(parents=True, exist_ok=True)
        (DOCS / uri).write_text(PAGES[uri]())
    return changed


def on_files(files, config):  # mkdocs: the pages generated now, in place of the committed copies
    from mkdocs.structure.files import File

    for uri, page in PAGES.items():
        committed = files.get_file_from_path(uri)
        if committed is not None:
            files.remove(committed)
        files.append(File.generated(config, uri, content=page()))
    return files


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "settings"
    if which == "--write":
        for uri in write() or ["(every page was up to date)"]:
            print(uri)
    else:
        sys.stdout.write(PAGES[f"reference/{which}.md"]())
