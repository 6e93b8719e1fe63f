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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from higgsfield.errors import ExperimentError
from higgsfield.params import ParamSpec, check_name

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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "file": str(self.file), "module": self.module,
                "function": self.function, "line": self.line, "params": [p.to_dict() for p in self.params]}


def discover(src_dir: Path) -> list[DiscoveredExperiment]:
    """Every experiment under ``src_dir``; raises ExperimentError (file:line: ...) on any problem."""
    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise ExperimentError(f"{src_dir}: no such directory; experiments live in src/ of the project")
    found: dict[str, DiscoveredExperiment] = {}
    for file in sorted(_python_files(src_dir)):
        for exp in _parse_file(file, src_dir):
            other = found.get(exp.name)
            if other is not None:
                raise ExperimentError(f"{_rel(exp.file)}:{exp.line}: experiment '{exp.name}' is already defined "
                                      f"at {_rel(other.file)}:{other.line}; experiment names must be unique")
            found[exp.name] = exp
    return sorted(found.values(), key=lambda e: e.name)


def find_experiment(src_dir: Path, name: str) -> DiscoveredExperiment:
    exps = discover(src_dir)
    for e in exps:
        if e.name == name:
            return e
    known = ", ".join(e.name for e in exps) or f"none found under {src_dir}"
    raise ExperimentError(f"no experiment named '{name}' (experiments: {known})")


def _python_files(root: Path) -> list[Path]:
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel[:-1]):
            continue
        out.append(p)
    return out


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _module_name(file: Path, root: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
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
    except (OSError, UnicodeDecodeError) as e:
        raise ExperimentError(f"{_rel(file)}: cannot read: {e}") from None
    if "higgsfield" not in source:
        return []
    try:
        tree = ast.parse(source, filename=str(file))
    except SyntaxError as e:
        raise ExperimentError(f"{_rel(file)}:{e.lineno}: syntax error: {e.msg}") from None
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
                              f"'{ast.unparse(node)}'") from None


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
        raise ExperimentError(f"{loc}: @experiment('{name}') seed must be an integer (got {seed!r})")
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
