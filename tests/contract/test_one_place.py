"""Each value and path written in one place (issue 29): the stall defaults in ``contract.stall_policy``, the node's
paths and the Slurm rank rule in ``contract.layout``. A scan of the source (``ast``, no import): a new copy fails here.

Docs are not code: a bare string statement (a docstring, an attribute's doc) and comments are not scanned.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from higgsfield.contract import layout
from higgsfield.contract.stall_policy import DEFAULT_STALL, ON_STALL_CHOICES, OnStall, StallPolicy

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "higgsfield"
TEMPLATES = ROOT / "templates"
STALL_POLICY = PACKAGE / "contract" / "stall_policy.py"
LAYOUT = PACKAGE / "contract" / "layout.py"

STALL_NAMES = {"stall_timeout", "startup_timeout", "on_stall"}
STALL_NUMBERS = {DEFAULT_STALL.stall_timeout, DEFAULT_STALL.startup_timeout}   # 600, 1800 (int or float alike)
CHOICES = set(ON_STALL_CHOICES)
# the node's path names: only contract/layout.py spells them (everything else asks it, or the node's NodeState)
PATH_NAMES = {"projects", ".cache", "envs", "trash", "releases", "queue.json", "queue.lock", "env.json",
              "env-build.log", "deployed.json", "image.json"}
PATH_IN_TEXT = re.compile(r"(^|/)(projects|\.cache/higgsfield)(/|$)")


def _sources(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _docs(tree: ast.AST) -> set[int]:
    """The ids of every bare string statement's constant (docstrings and attribute docs)."""
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def _stall_literal(node: ast.AST) -> str | None:
    """A stall default written as a literal anywhere in ``node``: 600 / 1800 or one of the choices."""
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and not isinstance(n.value, bool):
            if isinstance(n.value, (int, float)) and n.value in STALL_NUMBERS:
                return repr(n.value)
            if isinstance(n.value, str) and n.value in CHOICES:
                return repr(n.value)
    return None


def _name_of(target: ast.AST) -> str | None:
    return target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None


def stall_copies(path: Path, tree: ast.Module) -> list[str]:
    """Where ``tree`` writes a stall default again: a value bound to a stall name (an argument's default, a
    keyword, an assignment, a dict entry, a call that names the field: ``_seconds(d, "stall_timeout", default=600.0)``)
    that is a literal 600 / 1800 / "fail" ..., or the three choices spelled out together (a tuple, a Literal)."""
    found = []

    def flag(node: ast.AST, value: ast.AST | None, why: str) -> None:
        lit = _stall_literal(value) if value is not None else None
        if lit is not None:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {why} = {lit}")   # type: ignore[attr-defined]

    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = n.args
            positional = [*a.posonlyargs, *a.args]
            for arg, default in zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True):
                if arg.arg in STALL_NAMES:
                    flag(default, default, f"default of {arg.arg}")
            for arg, kwdefault in zip(a.kwonlyargs, a.kw_defaults, strict=True):
                if arg.arg in STALL_NAMES and kwdefault is not None:
                    flag(kwdefault, kwdefault, f"default of {arg.arg}")
        elif isinstance(n, ast.keyword) and n.arg in STALL_NAMES:
            flag(n.value, n.value, f"{n.arg}=")
        elif isinstance(n, ast.AnnAssign) and _name_of(n.target) in STALL_NAMES:
            flag(n, n.value, f"{_name_of(n.target)}:")
        elif isinstance(n, ast.Assign) and any(_name_of(t) in STALL_NAMES for t in n.targets):
            flag(n, n.value, "assignment")
        elif isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values, strict=True):
                if isinstance(k, ast.Constant) and k.value in STALL_NAMES:
                    flag(v, v, f"{{{k.value!r}: ...}}")
        elif isinstance(n, ast.Call) and any(isinstance(x, ast.Constant) and x.value in STALL_NAMES for x in n.args):
            for kw in n.keywords:
                flag(kw.value, kw.value, f"a call naming a stall field, {kw.arg}=")
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            strings = {e.value for e in n.elts if isinstance(e, ast.Constant)}
            if CHOICES <= strings:
                found.append(f"{path.relative_to(ROOT)}:{n.lineno}: the on_stall choices spelled out")
    return found


def path_copies(path: Path, tree: ast.Module) -> list[str]:
    """Where ``tree`` spells one of the node's path names (``"projects"``, ``"queue.json"`` ...) or a path through
    them (``f"{state}/projects/{name}/code"``) outside a doc."""
    docs = _docs(tree)
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value in PATH_NAMES or PATH_IN_TEXT.search(n.value):
                found.append(f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}")
    return found


def rank_rule_copies(path: Path, tree: ast.Module) -> list[str]:
    """Where ``tree`` works out a Slurm rank's host itself (``rank // nproc``) instead of asking the layout."""
    return [f"{path.relative_to(ROOT)}:{n.lineno}: ... // nproc" for n in ast.walk(tree)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv) and _name_of(n.right) == "nproc"]


TEMPLATE_STALL = re.compile(r"^\s*#?\s*(stall_timeout|startup_timeout|on_stall)\s*:\s*(\d|fail\b|restart\b|wait\b)",
                            re.M)


def template_copies(root: Path) -> list[str]:
    """A template that writes a stall default itself instead of rendering the contract's (``{{ stall... }}``)."""
    return [f"{p.relative_to(root)}: {m.group(0).strip()}" for p in sorted(root.rglob("*.j2"))
            for m in TEMPLATE_STALL.finditer(p.read_text(encoding="utf-8"))]


def test_the_stall_defaults_are_written_only_in_the_contracts_stall_policy() -> None:
    found = [line for path, tree in _sources(PACKAGE) if path != STALL_POLICY for line in stall_copies(path, tree)]
    assert found == [], "stall defaults written again (use higgsfield.contract.stall_policy):\n" + "\n".join(found)
    assert template_copies(TEMPLATES) == []
    # and the module itself has them, once each
    own = stall_copies(STALL_POLICY, ast.parse(STALL_POLICY.read_text(encoding="utf-8")))
    assert len(own) == 2, own   # stall_timeout: float = 600.0, startup_timeout: float = 1800.0


def test_the_node_paths_are_spelled_only_in_the_contracts_layout() -> None:
    found = [line for path, tree in _sources(PACKAGE) if path != LAYOUT for line in path_copies(path, tree)]
    assert found == [], "node paths spelled again (use higgsfield.contract.layout / NodeState):\n" + "\n".join(found)
    assert path_copies(LAYOUT, ast.parse(LAYOUT.read_text(encoding="utf-8")))     # they are there


def test_which_host_runs_a_slurm_rank_is_worked_out_only_in_the_layout() -> None:
    found = [line for path, tree in _sources(PACKAGE) if path != LAYOUT for line in rank_rule_copies(path, tree)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(("planted", "scan"), [
    ("def f(stall_timeout: float = 600.0) -> None: ...", stall_copies),
    ("def f(*, startup_timeout=1800): ...", stall_copies),
    ("x = dict(on_stall='fail')", stall_copies),
    ("class S:\n    stall_timeout: float = 600.0", stall_copies),
    ("D = {'startup_timeout': 1800.0}", stall_copies),
    ("v = _seconds(d, 'stall_timeout', default=600.0)", stall_copies),
    ("ON = ('fail', 'restart', 'wait')", stall_copies),
    ("from typing import Literal\nT = Literal['fail', 'restart', 'wait']", stall_copies),
    ("p = f'{state}/projects/{name}/code'", path_copies),
    ("p = root / 'projects' / name / 'code'", path_copies),
    ("p = Path.home() / '.cache' / 'higgsfield' / project", path_copies),
    ("q = state / 'queue.json'", path_copies),
    ("who = sorted(hosts)[rank // nproc]", rank_rule_copies),
])
def test_each_scan_catches_a_planted_copy(planted: str, scan: object) -> None:
    assert callable(scan)
    assert scan(PACKAGE / "planted.py", ast.parse(planted)), planted


@pytest.mark.parametrize("fine", [
    "TIMEOUT_S = 600.0",                          # another timeout of the same size (doctor --fabric's)
    "SKIP_CHARS = 600",
    "mode = 0o600",
    "x = one_line(text, 600)",
    "def f(state: str = 'running') -> None: ...",
    "def g():\n    '''lives under <state>/projects/<project>/code'''",   # a doc says where things are
    "kind = 'code'",
])
def test_the_scans_leave_unrelated_values_alone(fine: str) -> None:
    tree = ast.parse(fine)
    path = PACKAGE / "fine.py"
    assert stall_copies(path, tree) == [] and path_copies(path, tree) == [] and rank_rule_copies(path, tree) == []


def test_a_template_that_writes_a_default_is_caught(tmp_path: Path) -> None:
    (tmp_path / "higgsfield.yml.j2").write_text("stall_timeout: 600\n# on_stall: fail   # fail | restart | wait\n")
    assert len(template_copies(tmp_path)) == 2
    (tmp_path / "higgsfield.yml.j2").write_text('stall_timeout: {{ "%g" | format(stall.stall_timeout) }}\n')
    assert template_copies(tmp_path) == []


def test_the_policy_reads_as_the_strings_it_replaces() -> None:
    """OnStall is a str: equal to, hashed, printed and JSON-encoded as the plain value, so no file changes."""
    import json

    assert ON_STALL_CHOICES == ("fail", "restart", "wait")
    assert OnStall.WAIT == "wait" and {"wait": 1}[OnStall.WAIT] == 1
    assert f"{OnStall.RESTART}" == str(OnStall.RESTART) == "restart"
    assert json.dumps(StallPolicy(30.0).spec_fields()) == '{"stall_timeout": 30.0, "startup_timeout": 1800.0, ' \
                                                          '"on_stall": "fail"}'
    assert StallPolicy(0, 0).off and not DEFAULT_STALL.off
    assert layout.node_of_rank(["b", "a"], 2, 2) == "b" and layout.ranks_of_node(["b", "a"], 2, "a") == range(0, 2)
