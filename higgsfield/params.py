"""Typed experiment parameters, shared by the decorators, AST discovery and the CLI.

A :class:`ParamSpec` is what ``@param(...)`` declares. Values arrive as text (from
``--param k=v``, a GitHub form, an environment variable) or as Python values, and
:meth:`ParamSpec.coerce` turns them into the declared type: ``"false"`` is False,
``"3"`` is 3 for an int, and an option outside ``options`` is refused.

No torch here: the control side uses this module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from higgsfield.errors import ParamError

NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: Run names: safe as a directory name, a container name part and a shell word.
RUN_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$")
MAX_NAME = 64
TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
#: Names the runtime or the GitHub form already use; a @param may not take them.
RESERVED = frozenset({"rank", "world_size", "local_rank", "project_name", "experiment_name", "run_name",
                      "nodes", "seed"})
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
    raise ValueError(f"expected true or false, got {value!r}")


def check_run_name(name: str, what: str = "--run-name") -> str:
    """``name`` if it is a valid run name; raises ParamError saying what is allowed."""
    if not RUN_NAME_RE.match(name):
        raise ParamError(f"{what} {name!r} is not valid: use 1-64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def check_name(name: Any, what: str = "name") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise ValueError(f"{what} {name!r} is not valid: use 1-{MAX_NAME} letters, digits and _, "
                         "not starting with a digit")
    return name


def _convert(type_name: str, value: Any) -> Any:
    if type_name == "bool":
        return parse_bool(value)
    if type_name == "int":
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                try:
                    f = float(value.strip())
                except ValueError:
                    pass
                else:
                    if f.is_integer():
                        return int(f)
        raise ValueError(f"expected an integer, got {value!r}")
    if type_name == "float":
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        try:
            f = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {value!r}") from None
        if not math.isfinite(f):
            raise ValueError(f"expected a finite number, got {value!r}")
        return f
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {value!r}")


@dataclass(frozen=True)
class ParamSpec:
    """One ``@param``: name, type, default, description, required, options."""

    name: str
    type: str = "str"
    default: Any = None
    description: str = ""
    required: bool = False
    options: tuple[Any, ...] | None = field(default=None)

    @classmethod
    def build(cls, name: Any, default: Any = None, description: Any = "", required: Any = False,
              type: Any = None, options: Any = None) -> ParamSpec:
        """Validate what a ``@param`` call declared; raises ValueError with a readable message."""
        check_name(name, "@param name")
        if name in RESERVED:
            raise ValueError(f"@param name '{name}' is reserved (reserved: {', '.join(sorted(RESERVED))})")
        if type in (int, float, str, bool):  # a builtin type object rather than its name
            type = type.__name__
        if type is None:
            if options:
                type = _infer(options[0])
            else:
                type = _infer(default) if default is not None else "str"
        if type not in TYPES:
            raise ValueError(f"@param '{name}': type must be int, float, str or bool (got {type!r})")
        if not isinstance(description, str):
            raise ValueError(f"@param '{name}': description must be a string")
        if not isinstance(required, bool):
            raise ValueError(f"@param '{name}': required must be True or False")
        opts: tuple[Any, ...] | None = None
        if options is not None:
            if not isinstance(options, (list, tuple)) or not options:
                raise ValueError(f"@param '{name}': options must be a non-empty list")
            try:
                opts = tuple(_convert(type, o) for o in options)
            except ValueError as e:
                raise ValueError(f"@param '{name}': option {e}") from None
            if len(set(opts)) != len(opts):
                raise ValueError(f"@param '{name}': options repeat a value")
        if default is not None:
            if isinstance(default, (list, dict, set, tuple)):
                raise ValueError(f"@param '{name}': default must be an int, float, str or bool "
                                 f"(got {default!r})")
            try:
                default = _convert(type, default)
            except ValueError as e:
                raise ValueError(f"@param '{name}': default {e}") from None
            if opts is not None and default not in opts:
                raise ValueError(f"@param '{name}': default {default!r} is not one of the options {list(opts)}")
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
            raise ParamError(f"param '{self.name}': {out!r} is not one of {list(self.options)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "default": self.default, "description": self.description,
                "required": self.required, "options": list(self.options) if self.options is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParamSpec:
        opts = d.get("options")
        return cls(name=d["name"], type=d["type"], default=d.get("default"), description=d.get("description", ""),
                   required=bool(d.get("required", False)), options=tuple(opts) if opts is not None else None)


def _infer(value: Any) -> str:
    for name, t in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, t):
            return name
    raise ValueError(f"cannot infer a type from {value!r}: pass type=int|float|str|bool")


def parse_assignments(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["lr=0.1", "name=a=b"]`` -> ``{"lr": "0.1", "name": "a=b"}``; raises ParamError on a bad pair."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ParamError(f"--param {pair!r}: expected NAME=VALUE")
        key = key.strip()
        if key in out:
            raise ParamError(f"--param {key} is given twice")
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
        raise ParamError(f"{where}unknown param '{unknown[0]}' (params: {known})")
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
