"""Find ``@experiment`` / ``@param`` functions under ``src/`` by parsing, never importing.

Importing user code on a laptop would need torch and the user's dependencies;
parsing needs neither. Decorators are recognised however the module is imported::

    from higgsfield.experiment import experiment, param
    from higgsfield.experiment import experiment as exp
    import higgsfield.experiment as hx            # @hx.experiment(...)
    import higgsfield.experiment                  # @higgsfield.experiment.experiment(...)
    from higgsfield import experiment as hexp     # @hexp.experiment(...)

and in any order. Anything that cannot be understood is an error naming the file
and line (a bad argument, a ``@param`` without ``@experiment``, a name used twice),
never a silent skip.

Use::

    exps = discover(Path("src"))          # list[DiscoveredExperiment], sorted by name
    exp = find_experiment(Path("src"), "alpaca")
"""

from __future__ import annotations

import ast
import keyword
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from higgsfield.contract.errors import ExperimentError
from higgsfield.contract.names import NAME_RE
from higgsfield.contract.params import ParamSpec, check_name
from higgsfield.contract.text import one_line, shown

MODULE = "higgsfield.experiment"
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", "node_modules", ".mypy_cache", ".ruff_cache"}
_TYPE_NAMES = {"int", "float", "str", "bool"}


@dataclass(frozen=True)
class DiscoveredExperiment:
    """An experiment as found in the source: where it is and what it declares."""

    name: str
    params: tuple[ParamSpec, ...]
    seed: int | None
    file: Path          # absolute path of the module
    module: str         # dotted module name relative to the source root, e.g. "llama.tiny"
    function: str
    line: int

    def as_json(self) -> ExperimentJson:
        """What ``experiments --json`` prints of it (``codec.encode`` it)."""
        return ExperimentJson(self.name, self.seed, str(self.file), self.module, self.function, self.line,
                              self.params)


@dataclass(frozen=True)
class ExperimentJson:
    """An experiment in ``experiments --json``: :class:`DiscoveredExperiment`, its file a string."""

    name: str
    seed: int | None
    file: str
    module: str
    function: str
    line: int
    params: tuple[ParamSpec, ...]


def discover(src_dir: Path) -> list[DiscoveredExperiment]:
    """Every experiment under ``src_dir``; raises ExperimentError (file:line: ...) on any problem."""
    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise ExperimentError(f"{src_dir}: no such directory; experiments live in src/ of the project")
    found: dict[str, DiscoveredExperiment] = {}
    for file in sorted(_python_files(src_dir)):
        for exp in _parse_file(file, src_dir):
            # Case-insensitively: run_Alpaca.yml and run_alpaca.yml are one file on macOS and Windows.
            other = found.get(exp.name.lower())
            if other is not None:
                same = "" if other.name == exp.name else f" (as '{other.name}': names may not differ only in case)"
                raise ExperimentError(f"{_rel(exp.file)}:{exp.line}: experiment '{exp.name}' is already defined "
                                      f"at {_rel(other.file)}:{other.line}{same}; experiment names must be unique")
            found[exp.name.lower()] = exp
    return sorted(found.values(), key=lambda e: e.name)


def find_experiment(src_dir: Path, name: str) -> DiscoveredExperiment:
    exps = discover(src_dir)
    for e in exps:
        if e.name == name:
            return e
    known = ", ".join(e.name for e in exps) or f"none found under {src_dir}"
    raise ExperimentError(f"no experiment named {shown(name)} (experiments: {known})")


def _python_files(root: Path) -> list[Path]:
    """Every ``*.py`` under ``root``; symlinked directories are not followed (a loop would never end)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        out.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return out


def _rel(p: Path) -> str:
    """``p`` for a message: relative to the working directory, on one line whatever its name holds."""
    try:
        return one_line(str(p.relative_to(Path.cwd())), 300)
    except ValueError:
        return one_line(str(p), 300)


def _module_name(file: Path, root: Path) -> str:
    """The dotted name the node imports; ExperimentError when a part is not an identifier (``train.v2.py``)."""
    parts = list(file.relative_to(root).with_suffix("").parts)
    for part in parts:
        if not NAME_RE.fullmatch(part) or keyword.iskeyword(part):
            kind = "file" if part == parts[-1] else "directory"
            fixed = "".join(c if c.isalnum() and c.isascii() else "_" for c in part)
            fixed = fixed if fixed[:1].isalpha() or fixed[:1] == "_" else f"_{fixed}"
            raise ExperimentError(f"{_rel(file)}: it defines an experiment, but {kind} name {shown(part)} is not a "
                                  f"Python identifier, so the node cannot import it: rename it (e.g. "
                                  f"{shown(fixed + ('_' if keyword.iskeyword(fixed) else ''))})")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts:
        raise ExperimentError(f"{_rel(file)}: experiments cannot live in src/__init__.py: move them to a module "
                              "such as src/train.py")
    return ".".join(parts)


class _Aliases:
    """What names in one module refer to ``experiment``/``param`` or to the module itself."""

    def __init__(self) -> None:
        self.funcs: dict[str, str] = {}      # local name -> "experiment" | "param"
        self.modules: dict[str, str] = {}    # dotted prefix -> module (e.g. "hx" -> higgsfield.experiment)

    def visit(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    local = a.asname or a.name
                    if node.module == MODULE and a.name in ("experiment", "param"):
                        self.funcs[local] = a.name
                    elif full == MODULE:
                        self.modules[local] = MODULE
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == MODULE or MODULE.startswith(a.name + "."):
                        if a.asname:
                            if a.name == MODULE:
                                self.modules[a.asname] = MODULE
                        else:
                            self.modules[MODULE] = MODULE

    def resolve(self, func: ast.expr) -> str | None:
        """'experiment' / 'param' when ``func`` names one of ours, else None."""
        if isinstance(func, ast.Name):
            return self.funcs.get(func.id)
        if isinstance(func, ast.Attribute) and func.attr in ("experiment", "param"):
            prefix = _dotted(func.value)
            if prefix is not None and self.modules.get(prefix) == MODULE:
                return func.attr
        return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _parse_file(file: Path, root: Path) -> list[DiscoveredExperiment]:
    try:
        source = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ExperimentError(f"{_rel(file)}: byte 0x{e.object[e.start]:02x} at offset {e.start} is not UTF-8: "
                              "save the file as UTF-8") from None
    except OSError as e:
        raise ExperimentError(f"{_rel(file)}: cannot read: {e.strerror or e}") from None
    if "higgsfield" not in source:
        return []
    try:
        return _parse_source(file, root, source)
    except (RecursionError, MemoryError):
        # CPython's parser and ast.literal_eval/unparse give up on deeply nested code this way.
        raise ExperimentError(f"{_rel(file)}: an expression is nested too deeply for Python to parse; "
                              "simplify it") from None


def _parse_source(file: Path, root: Path, source: str) -> list[DiscoveredExperiment]:
    try:
        tree = ast.parse(source, filename=str(file))
    except SyntaxError as e:
        at = f":{e.lineno}" if e.lineno else ""   # a NUL byte: no line
        raise ExperimentError(f"{_rel(file)}{at}: syntax error: {one_line(str(e.msg), 200)}") from None
    except ValueError as e:  # "source code string cannot contain null bytes" (3.11, from compile())
        raise ExperimentError(f"{_rel(file)}: syntax error: {one_line(str(e), 200)}") from None
    aliases = _Aliases()
    aliases.visit(tree)
    if not aliases.funcs and not aliases.modules:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        exp_call: ast.Call | None = None
        param_calls: list[ast.Call] = []
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            kind = aliases.resolve(target)
            if kind is None:
                continue
            if not isinstance(dec, ast.Call):
                raise ExperimentError(f"{_rel(file)}:{dec.lineno}: @{kind} must be called, "
                                      f"e.g. @{kind}(\"name\", ...)")
            if kind == "experiment":
                if exp_call is not None:
                    raise ExperimentError(f"{_rel(file)}:{dec.lineno}: '{node.name}' has two @experiment decorators")
                exp_call = dec
            else:
                param_calls.append(dec)
        if exp_call is None:
            if param_calls:
                raise ExperimentError(f"{_rel(file)}:{param_calls[0].lineno}: '{node.name}' has @param but no "
                                      "@experiment; add @experiment(\"name\") or remove the @param")
            continue
        out.append(_build(file, root, node, exp_call, param_calls))
    return out


def _literal(file: Path, call: ast.Call, node: ast.expr, what: str) -> Any:
    if what == "type" and isinstance(node, ast.Name) and node.id in _TYPE_NAMES:
        return node.id
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ExperimentError(f"{_rel(file)}:{node.lineno}: {what} must be a literal value "
                              f"(a number, string, bool, None or list of them), not "
                              f"{shown(_source_of(node))}") from None


def _source_of(node: ast.expr) -> str:
    try:
        return ast.unparse(node)
    except (RecursionError, ValueError):
        return type(node).__name__


def _call_args(file: Path, call: ast.Call, names: tuple[str, ...], kind: str) -> dict[str, Any]:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise ExperimentError(f"{_rel(file)}:{call.lineno}: @{kind} arguments cannot use * or **")
    if len(call.args) > len(names):
        raise ExperimentError(f"{_rel(file)}:{call.lineno}: @{kind} takes at most {len(names)} positional "
                              f"arguments ({', '.join(names)})")
    out: dict[str, Any] = {}
    for name, arg in zip(names, call.args, strict=False):
        out[name] = _literal(file, call, arg, name)
    for kw in call.keywords:
        assert kw.arg is not None
        if kw.arg not in names:
            raise ExperimentError(f"{_rel(file)}:{call.lineno}: @{kind} has no argument '{kw.arg}' "
                                  f"(arguments: {', '.join(names)})")
        if kw.arg in out:
            raise ExperimentError(f"{_rel(file)}:{call.lineno}: @{kind} argument '{kw.arg}' is given twice")
        out[kw.arg] = _literal(file, call, kw.value, kw.arg)
    return out


def _build(file: Path, root: Path, func: ast.FunctionDef | ast.AsyncFunctionDef, exp_call: ast.Call,
           param_calls: list[ast.Call]) -> DiscoveredExperiment:
    loc = f"{_rel(file)}:{exp_call.lineno}"
    args = _call_args(file, exp_call, ("name", "seed"), "experiment")
    if "name" not in args:
        raise ExperimentError(f"{loc}: @experiment needs a name, e.g. @experiment(\"{func.name}\")")
    try:
        name = check_name(args["name"], "experiment name")
    except ValueError as e:
        raise ExperimentError(f"{loc}: {e}") from None
    seed = args.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ExperimentError(f"{loc}: @experiment('{name}') seed must be an integer (got {shown(seed)})")
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise ExperimentError(f"{loc}: @experiment('{name}') seed must fit in 64 bits (torch.manual_seed's range)")
    n_args = len(func.args.args) + len(func.args.posonlyargs)
    if n_args != 1 or func.args.vararg or func.args.kwonlyargs:
        raise ExperimentError(f"{_rel(file)}:{func.lineno}: experiment '{name}': function '{func.name}' must take "
                              "exactly one argument, params")
    if isinstance(func, ast.AsyncFunctionDef):
        raise ExperimentError(f"{_rel(file)}:{func.lineno}: experiment '{name}' must be a plain function, not async")
    specs: list[ParamSpec] = []
    for call in sorted(param_calls, key=lambda c: c.lineno):
        pargs = _call_args(file, call, ("name", "default", "description", "required", "type", "options"), "param")
        if "name" not in pargs:
            raise ExperimentError(f"{_rel(file)}:{call.lineno}: @param needs a name")
        try:
            spec = ParamSpec.build(**pargs)
        except ValueError as e:
            raise ExperimentError(f"{_rel(file)}:{call.lineno}: {e}") from None
        if any(s.name == spec.name for s in specs):
            raise ExperimentError(f"{_rel(file)}:{call.lineno}: @param '{spec.name}' is declared twice "
                                  f"on experiment '{name}'")
        specs.append(spec)
    return DiscoveredExperiment(name=name, params=tuple(specs), seed=seed, file=file.resolve(),
                                module=_module_name(file, root), function=func.name, line=exp_call.lineno)
