"""The house's measures (issue 29): typed all the way, one codec, small modules. Each is cheap to count, so it is
counted here on every run and a regression fails by name, not in a later reading of the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "higgsfield"
TRAINING = {"experiment.py", "llama.py", "loaders.py", "dataset.py", "checkpoint.py", "training.py", "metrics.py"}
MAX_LINES = 400
MAX_STRING_KEY_READS = 100


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rel(p: Path) -> str:
    return str(p.relative_to(PACKAGE.parent))


def outside_contract(p: Path) -> bool:
    """Code that should read typed attributes: not the contract (it decodes), not the training library."""
    parts = p.relative_to(PACKAGE).parts
    return parts[0] not in ("contract", "_lib") and not (len(parts) == 1 and parts[0] in TRAINING)


def string_key_reads(tree: ast.AST) -> int:
    """``x["key"]`` and ``x.get("key")``: the shape of reading an untyped dict."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            n += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            n += 1
    return n


def hand_codecs(tree: ast.AST) -> list[str]:
    return [n.name for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in ("to_dict", "from_dict")]


def test_no_module_is_over_400_lines():
    long = {rel(p): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concept: {long}"


def test_no_hand_written_codec_is_left():
    found = {rel(p): names for p in modules() if (names := hand_codecs(ast.parse(p.read_text())))}
    assert not found, f"use higgsfield.contract.codec's encode/decode: {found}"


def test_the_gang_wire_is_read_by_type_not_by_key():
    pattern = re.compile(r"""\bmsg(\[|\.get\()["']""")
    found = [f"{rel(p)}:{i}" for p in modules() for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not found, f"decode the message into its contract.gang type: {found}"


def test_string_key_reads_outside_the_contract_stay_few():
    per = {rel(p): n for p in modules() if outside_contract(p) and (n := string_key_reads(ast.parse(p.read_text())))}
    total = sum(per.values())
    top = sorted(per.items(), key=lambda kv: -kv[1])[:8]
    assert total < MAX_STRING_KEY_READS, f"{total} string-key reads outside the contract (most: {top})"


@pytest.mark.parametrize("planted, check", [
    ("def to_dict(self):\n    return {}\n", lambda t: hand_codecs(t) == ["to_dict"]),
    ("x = msg['t']\ny = d.get('k')\n", lambda t: string_key_reads(t) == 2),
])
def test_the_counters_see_a_planted_violation(planted, check):
    assert check(ast.parse(planted))


def test_every_package_is_listed_for_the_wheel() -> None:
    """pyproject.toml lists the packages by hand; one left out ships a wheel whose invoker cannot import it
    (test_packaging builds the wheel to see it; this says it in a second, in make test-fast)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {p.parent.relative_to(PACKAGE.parent).as_posix().replace("/", ".") for p in PACKAGE.rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert not sorted(found - listed), f"add these to pyproject.toml's packages = [...]: {sorted(found - listed)}"
