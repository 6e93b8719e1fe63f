"""Typed experiment parameters, shared by the decorators, AST discovery and the CLI.

A :class:`ParamSpec` is what ``@param(...)`` declares. Values arrive as text (from
``--param k=v``, a GitHub form, an environment variable) or as Python values, and
:meth:`ParamSpec.coerce` turns them into the declared type: ``"false"`` is False,
``"3"`` is 3 for an int, and an option outside ``options`` is refused.

No torch here: the control side uses this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import rule
from higgsfield.contract.errors import ParamError
from higgsfield.contract.names import MAX_NAME, NAME_RE, RUN_NAME_RE, check_identifier
from higgsfield.contract.text import shown

__all__ = ["MAX_NAME", "NAME_RE", "RUN_NAME_RE", "ParamSpec", "check_name", "check_run_name", "parse_assignments",
           "parse_bool", "resolve"]

TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
#: Names the runtime or the GitHub form already use; a @param may not take them.
RESERVED = frozenset({"rank", "world_size", "local_rank", "project_name", "experiment_name", "run_name",
                      "nodes", "seed"})
#: ``params.keys`` is the dict method, never a param: names a ``Params`` attribute already has.
SHADOWED = frozenset(name for name in dir(dict) if not name.startswith("_"))
#: Longest text value a param takes (it travels to every node and into the run record).
MAX_VALUE = 64 * 1024
_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def parse_bool(value: Any) -> bool:
    """True/False from a bool, 0/1, or true/false/yes/no/on/off/1/0 in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    raise ValueError(f"expected true or false, got {shown(value)}")


def check_run_name(name: str, what: str = "--run-name") -> str:
    """``name`` if it is a valid run name; raises ParamError saying what is allowed."""
    if not isinstance(name, str) or not RUN_NAME_RE.fullmatch(name):
        raise ParamError(f"{what} {shown(name)} is not valid: use 1-96 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def check_name(name: Any, what: str = "name") -> str:
    """An experiment or param name: an identifier (not a keyword) of at most MAX_NAME chars; else ValueError."""
    return check_identifier(name, what)


def _convert(type_name: str, value: Any) -> Any:
    if type_name == "bool":
        return parse_bool(value)
    if type_name == "int":
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {shown(value)}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and len(value) <= 100:   # int() of a 10 MB string is slow, not useful
            try:
                return int(value.strip())
            except ValueError:
                try:
                    f = float(value.strip())
                except ValueError:
                    pass
                else:
                    if math.isfinite(f) and f.is_integer():
                        return int(f)
        raise ValueError(f"expected an integer, got {shown(value)}")
    if type_name == "float":
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {shown(value)}")
        try:
            if isinstance(value, str) and len(value) > 100:
                raise ValueError(value)
            f = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"expected a number, got {shown(value)}") from None
        if not math.isfinite(f):
            raise ValueError(f"expected a finite number, got {shown(value)}")
        return f
    if isinstance(value, str):
        return _text_value(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {shown(value)}")


def _text_value(value: str) -> str:
    # A NUL cannot be in an environment variable or an argv word, and a value travels as both on a node.
    if "\x00" in value:
        raise ValueError(f"a NUL character cannot be a param value (got {shown(value)})")
    if len(value) > MAX_VALUE:
        raise ValueError(f"a text value is at most {MAX_VALUE} characters (got {len(value)})")
    return value


def _one_of_types(v: str) -> None:
    if v not in TYPES:
        raise ValueError(f"must be one of {', '.join(TYPES)}")


@dataclass(frozen=True)
class ParamSpec:
    """One ``@param``: name, type, default, description, required, options."""

    WHAT: ClassVar[str] = "param"

    name: str
    type: str = field(default="str", metadata=rule(check=_one_of_types))
    default: Any = None
    description: str = ""
    required: bool = False
    options: tuple[Any, ...] | None = field(default=None)

    @classmethod
    def build(cls, name: Any, default: Any = None, description: Any = "", required: Any = False,
              type: Any = None, options: Any = None) -> ParamSpec:
        """Validate what a ``@param`` call declared; raises ValueError with a readable message."""
        check_name(name, "@param name")
        if name in SHADOWED or name.startswith("__"):
            raise ValueError(f"@param name '{name}' is taken by the params object itself (params.{name} is a "
                             "method of dict): choose another name")
        if name in RESERVED:
            raise ValueError(f"@param name '{name}' is reserved (reserved: {', '.join(sorted(RESERVED))})")
        if options is not None and (not isinstance(options, (list, tuple)) or not options):
            raise ValueError(f"@param '{name}': options must be a non-empty list")
        if type in (int, float, str, bool):  # a builtin type object rather than its name
            type = type.__name__
        if type is None:
            if options:
                type = _infer(options[0])
            else:
                type = _infer(default) if default is not None else "str"
        if not isinstance(type, str) or type not in TYPES:
            raise ValueError(f"@param '{name}': type must be int, float, str or bool (got {shown(type)})")
        if not isinstance(description, str):
            raise ValueError(f"@param '{name}': description must be a string")
        if not isinstance(required, bool):
            raise ValueError(f"@param '{name}': required must be True or False")
        opts: tuple[Any, ...] | None = None
        if options is not None:
            try:
                opts = tuple(_convert(type, o) for o in options)
            except ValueError as e:
                raise ValueError(f"@param '{name}': option {e}") from None
            if len(set(opts)) != len(opts):
                raise ValueError(f"@param '{name}': options repeat a value")
        if default is not None:
            if isinstance(default, (list, dict, set, tuple)):
                raise ValueError(f"@param '{name}': default must be an int, float, str or bool "
                                 f"(got {shown(default)})")
            try:
                default = _convert(type, default)
            except ValueError as e:
                raise ValueError(f"@param '{name}': default {e}") from None
            if opts is not None and default not in opts:
                raise ValueError(f"@param '{name}': default {shown(default)} is not one of the options {shown(list(opts))}")
        if required and default is not None:
            raise ValueError(f"@param '{name}': a required param cannot have a default")
        return cls(name=name, type=type, default=default, description=description, required=required,
                   options=opts)

    def coerce(self, value: Any) -> Any:
        """Convert one value to this param's type; raises ParamError naming the param."""
        try:
            out = _convert(self.type, value)
        except ValueError as e:
            raise ParamError(f"param '{self.name}': {e}") from None
        if self.options is not None and out not in self.options:
            raise ParamError(f"param '{self.name}': {shown(out)} is not one of {shown(list(self.options))}")
        return out



def _infer(value: Any) -> str:
    for name, t in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, t):
            return name
    raise ValueError(f"cannot infer a type from {shown(value)}: pass type=int|float|str|bool")


def parse_assignments(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["lr=0.1", "name=a=b"]`` -> ``{"lr": "0.1", "name": "a=b"}``; raises ParamError on a bad pair."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ParamError(f"--param {shown(pair)}: expected NAME=VALUE")
        key = key.strip()
        if key in out:
            raise ParamError(f"--param {key if NAME_RE.fullmatch(key) else shown(key)} is given twice")
        out[key] = value
    return out


def resolve(specs: list[ParamSpec] | tuple[ParamSpec, ...], given: Mapping[str, Any],
            experiment: str = "") -> dict[str, Any]:
    """Typed values for every declared param: given values coerced, defaults filled, required enforced."""
    by_name = {s.name: s for s in specs}
    where = f"experiment '{experiment}': " if experiment else ""
    unknown = [k for k in given if k not in by_name]
    if unknown:
        known = ", ".join(by_name) or "none"
        raise ParamError(f"{where}unknown param {shown(unknown[0])} (params: {known})")
    values: dict[str, Any] = {}
    for spec in specs:
        if spec.name in given and given[spec.name] is not None:
            try:
                values[spec.name] = spec.coerce(given[spec.name])
            except ParamError as e:
                raise ParamError(f"{where}{e}") from None
        elif spec.required:
            raise ParamError(f"{where}param '{spec.name}' is required: pass --param {spec.name}=VALUE")
        else:
            values[spec.name] = spec.default
    return values
