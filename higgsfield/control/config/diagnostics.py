"""A validation error of the schema, said as one line a user can act on.

pydantic reports every problem with a location tuple, a type code and an English
message written for programmers. A user gets the first problem only, with the file
and line of the value (looked up by the loader that parsed it), the field as written
in YAML (``nodes[1].port``), a message in plain words, and how many more there are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from higgsfield.contract.text import shown
from higgsfield.control.config.fields import Misplaced
from higgsfield.control.config.schema import Config

__all__ = ["describe"]


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_FRIENDLY = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "model_type": "expected a mapping of keys",
    "dict_type": "expected a mapping of keys",
    "bool_parsing": "expected true or false",
}


def describe(err: ValidationError, line_of: Callable[[tuple[Any, ...]], int | None], path: Path) -> str:
    """The first of ``err``'s problems as one line: ``file:line: field: message (and N more problems)``."""
    e = err.errors()[0]
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p in ("int", "literal['auto']",
                                                                         "function-after[_positive(), int]")))
    kind = e["type"]
    ctx_err = (e.get("ctx") or {}).get("error")
    if isinstance(ctx_err, Misplaced):   # a model validator's problem: the field it belongs to
        loc = ctx_err.loc
    given = e.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        msg = f"unknown key {shown(loc[-1])}" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    elif kind == "missing":
        msg = "is required"
    elif kind in ("greater_than_equal", "less_than_equal") and loc and loc[-1] == "port":
        msg = f"must be between 1 and 65535 (got {shown(given)})"
    elif kind in _FRIENDLY:
        msg = f"{_FRIENDLY[kind]} (got {shown(given)})"
    elif kind in ("literal_error", "enum"):   # a Literal's choices, or a contract enum's (on_stall)
        msg = f"must be {e['ctx']['expected']} (got {shown(given)})"
    elif kind == "too_short" and loc == ("nodes",):
        msg = "list at least one node"
    elif kind == "value_error":
        msg = str(ctx_err) if ctx_err else e["msg"]
    else:
        msg = e["msg"][0].lower() + e["msg"][1:]
        if given is not None and not isinstance(given, (dict, list)):
            msg += f" (got {shown(given)})"
    line = line_of(loc)
    where = f"{path}:{line}" if line else str(path)
    field = _field_path(loc)
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{where}: {field + ': ' if field else ''}{msg}{tail}"


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys of the mapping at ``loc`` (a path of keys and list indexes), for "unknown key" messages."""
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        ann = getattr(info, "annotation", None)
        inner = getattr(ann, "__args__", (ann,))
        for cand in (ann, *inner):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
        else:
            return []
    return [k for k in model.model_fields if k != "path"]
