"""The state machine alone (no bytes): every (state, trigger) pair, generated from the
enumerations and the table, moves as ``TRANSITIONS`` says or raises the protocol
error of the side that sent it and changes nothing; and nothing but
``ConnectionState.move`` assigns the state."""

from __future__ import annotations

import ast
import doctest
import re
from collections import deque
from pathlib import Path

import pytest

import mldserver
from mldserver.protocol import state as state_module
from mldserver.protocol.errors import LocalProtocolError, RemoteProtocolError
from mldserver.protocol.state import BACK, NEVER_OWED, OURS, OWING, TRANSITIONS, ConnectionState, State, Trigger

# The daemon's triggers that are actions (owed a status), and the name each carries.
ACTIONS = {
    t: "bogus" if t is Trigger.UNKNOWN_ACTION else t.value.split(":")[0]
    for t in Trigger
    if t not in OURS and t not in (Trigger.CHECKPOINT_REPLY, Trigger.END_OF_INPUT)
}


def action_for(m: ConnectionState, trigger: Trigger) -> str | None:
    """What ``move`` is told with ``trigger``: a daemon action's wire name, or the
    action a STATUS answers (the right one: the table alone decides)."""
    if trigger is Trigger.STATUS:
        return m.answering
    return ACTIONS.get(trigger)


def replay(path: list[Trigger]) -> ConnectionState:
    m = ConnectionState()
    for trigger in path:
        m.move(trigger, action_for(m, trigger))
    return m


def snapshot(m: ConnectionState) -> tuple:
    return m.state, m.resume, m.answering, m.stray


def reachable() -> dict[tuple, list[Trigger]]:
    """Every configuration the table reaches from a new conversation, and the shortest
    path of triggers there (breadth first over the table's legal pairs)."""
    seen = {snapshot(ConnectionState()): []}
    queue: deque[list[Trigger]] = deque([[]])
    while queue:
        path = queue.popleft()
        here = replay(path).state
        for trigger in Trigger:
            if (here, trigger) in TRANSITIONS:
                key = snapshot(replay(path + [trigger]))
                if key not in seen:
                    seen[key] = path + [trigger]
                    queue.append(path + [trigger])
    return seen


CONFIGS = reachable()


def name(config: tuple) -> str:
    state, resume, answering, _ = config
    return state.name + (f"<-{resume.name}" if resume else "") + (f"[{answering}]" if answering else "")


PAIRS = [(path, trigger) for path in CONFIGS.values() for trigger in Trigger]
PAIR_IDS = [f"{name(config)}-{trigger.name}" for config in CONFIGS for trigger in Trigger]


def test_the_table_reaches_every_state_and_every_trigger_moves_somewhere_but_an_unknown_action():
    assert {config[0] for config in CONFIGS} == set(State)
    assert {t for (_, t) in TRANSITIONS} == set(Trigger) - {Trigger.UNKNOWN_ACTION}
    # a checkpoint outstanding from each state that may send one, and only those
    assert {c[1] for c in CONFIGS if c[0] is State.CHECKPOINTING} == {
        s for (s, t) in TRANSITIONS if t is Trigger.CHECKPOINT
    }


@pytest.mark.parametrize(("path", "trigger"), PAIRS, ids=PAIR_IDS)
def test_every_pair_moves_as_the_table_says_or_raises_and_changes_nothing(path, trigger):
    m = replay(path)
    state, resume, answering, stray = before = snapshot(m)
    action = action_for(m, trigger)
    target = TRANSITIONS.get((state, trigger))
    if target is not None:
        expected = resume if target is BACK else target
        assert m.move(trigger, action) is expected
        assert m.state is expected
        assert m.resume is (state if expected is State.CHECKPOINTING else None)
        assert m.stray is None
        assert m.answering == (action if trigger in ACTIONS else None if trigger is Trigger.STATUS else answering)
        assert m.owes_status == (m.answering if expected in OWING else None)
        return
    with pytest.raises(LocalProtocolError if trigger in OURS else RemoteProtocolError):
        m.move(trigger, action)
    if trigger in ACTIONS:  # refused, and still waiting for its status
        assert snapshot(m) == (state, resume, answering, action)
        assert m.owes_status == action
    else:
        assert snapshot(m) == before


WRONG_STATUS = [
    (path, wrong)
    for config, path in CONFIGS.items()
    if config[0] in OWING
    for wrong in sorted({*ACTIONS.values(), "status"} - {config[2]})
]


@pytest.mark.parametrize(("path", "wrong"), WRONG_STATUS)
def test_a_status_for_another_action_than_the_one_being_answered_is_refused(path, wrong):
    m = replay(path)
    before = snapshot(m)
    with pytest.raises(LocalProtocolError, match="the action being answered is"):
        m.move(Trigger.STATUS, wrong)
    assert snapshot(m) == before


REFUSED = [
    (path, trigger)
    for config, path in CONFIGS.items()
    for trigger in ACTIONS
    if (config[0], trigger) not in TRANSITIONS
]


@pytest.mark.parametrize(("path", "trigger"), REFUSED)
def test_a_refused_action_is_answered_first_and_its_status_moves_nothing(path, trigger):
    m = replay(path)
    state, resume, answering, _ = snapshot(m)
    refused = ACTIONS[trigger]
    with pytest.raises(RemoteProtocolError) as caught:
        m.move(trigger, refused)
    assert caught.value.action == refused
    with pytest.raises(LocalProtocolError, match="cannot checkpoint"):
        m.move(Trigger.CHECKPOINT)
    other = "processRecords" if refused != "processRecords" else "initialize"
    with pytest.raises(LocalProtocolError, match="out-of-order"):
        m.move(Trigger.STATUS, other)
    assert snapshot(m) == (state, resume, answering, refused)
    assert m.move(Trigger.STATUS, refused) is state
    assert snapshot(m) == (state, resume, answering, None)


@pytest.mark.parametrize("named", [None, *sorted(NEVER_OWED), *sorted(ACTIONS.values())])
def test_a_line_that_cannot_be_read_is_owed_a_status_only_when_it_names_an_action(named):
    m = replay(CONFIGS[(State.READY, None, None, None)])
    m.owe(named)
    assert m.owes_status == (None if named is None or named in NEVER_OWED else named)
    assert m.state is State.READY


def diagram() -> dict[tuple[State, Trigger], object]:
    """The transitions drawn in state.py's docstring (``A|B --X|Y--> C --Z--> D``)."""
    drawn: dict[tuple[State, Trigger], object] = {}
    for line in state_module.__doc__.splitlines():
        parts = re.split(r"\s*--([A-Z_|]+)-->\s*", line.strip())
        for i in range(1, len(parts), 2):
            left, triggers, right = parts[i - 1], parts[i], parts[i + 1]
            if left.startswith("any but "):
                sources = [s for s in State if s.name != left.removeprefix("any but ")]
            else:
                sources = [State[n] for n in left.split("|")]
            target = BACK if right == "BACK" else State[right]
            for source in sources:
                for trigger in triggers.split("|"):
                    drawn[(source, Trigger[trigger])] = target
    return drawn


def test_the_docstrings_drawing_is_the_table():
    assert diagram() == TRANSITIONS


def test_the_modules_example_runs():
    failures, tried = doctest.testmod(
        state_module, optionflags=doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL
    )
    assert tried and not failures


# -- one writer ------------------------------------------------------------------

PACKAGE = Path(mldserver.__file__).parent
MACHINE = ("protocol/state.py", "ConnectionState")
# Who may assign each attribute of the machine.
WRITERS = {
    "state": {(*MACHINE, "move")},
    "resume": {(*MACHINE, "move")},
    "answering": {(*MACHINE, "move")},
    "stray": {(*MACHINE, "_refuse"), (*MACHINE, "owe")},
}


def assignments(root: Path) -> set[tuple[str, str, str, str]]:
    """(attribute, file, class, function) of every assignment to ``X.<attribute>`` for
    the machine's attributes under ``root``, and every ``setattr`` naming one. Outside
    ``protocol/``, only another object's attribute counts (``conn.state = ...``): a
    class of its own may have a ``self.state``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        inside = rel.startswith("protocol/")
        tree = ast.parse(path.read_text(), str(path))
        for cls, func, node in _walk(tree, "", ""):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in _flat(target)]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = _flat(node.target)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                  and node.args[1].value in WRITERS):
                found.add((node.args[1].value, rel, cls, func))
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in WRITERS:
                    own = isinstance(target.value, ast.Name) and target.value.id == "self"
                    if inside or not own:
                        found.add((target.attr, rel, cls, func))
    return found


def _walk(node: ast.AST, cls: str, func: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            yield from _walk(child, child.name, "")
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(child, cls, child.name)
        else:
            yield cls, func, child
            yield from _walk(child, cls, func)


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flat(element)]
    if isinstance(target, ast.Starred):
        return _flat(target.value)
    return [target]


def test_only_the_machines_move_assigns_the_state_anywhere_in_the_package():
    found = assignments(PACKAGE)
    strays = sorted(f for f in found if f[1:] not in WRITERS[f[0]])
    assert not strays, f"the state assigned outside ConnectionState.move (ask the machine to move instead): {strays}"
    assert {f[0] for f in found} == set(WRITERS)  # the scan sees the writer itself


def test_an_assignment_of_the_state_outside_the_writer_is_found(tmp_path):
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "connection.py").write_text(
        "class Connection:\n"
        "    def next_event(self):\n"
        "        self.state, self.resume = 1, 2\n"
        "        setattr(self, 'answering', None)\n"
    )
    (tmp_path / "shard.py").write_text(
        "class Driver:\n"
        "    def __init__(self, conn):\n"
        "        self.state = 'mine'\n"  # its own: fine outside protocol/
        "        conn.stray = None\n"
    )
    assert assignments(tmp_path) == {
        ("state", "protocol/connection.py", "Connection", "next_event"),
        ("resume", "protocol/connection.py", "Connection", "next_event"),
        ("answering", "protocol/connection.py", "Connection", "next_event"),
        ("stray", "shard.py", "Driver", "__init__"),
    }
