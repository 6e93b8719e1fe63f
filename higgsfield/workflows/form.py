"""From ``@param`` declarations to the inputs of a GitHub ``workflow_dispatch`` form.

One input per ``@param``, typed the way GitHub's form can show it:

    options=[...]       -> choice (the options as text)
    bool                -> boolean (a checkbox)
    int, float          -> number
    str                 -> string

plus ``run_name`` and ``nodes``. Each input reaches the job through its own
environment variable (``HIGGSFIELD_PARAM_<name>``), never through the script text.

Use::

    for i in form_inputs(exp):
        i.name, i.type, i.default, i.env
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from higgsfield.discovery import DiscoveredExperiment
from higgsfield.errors import ExperimentError
from higgsfield.params import ParamSpec
from higgsfield.workflows.ci_inputs import ENV_NODES, ENV_PARAM_PREFIX, ENV_RUN_NAME

#: GitHub's limit on workflow_dispatch inputs (raised from 10 to 25 in December 2025).
MAX_INPUTS = 25
_EXPRESSION = "${{"


@dataclass(frozen=True)
class FormInput:
    """One input of a run form, ready to render."""

    name: str
    type: str                    # "string" | "number" | "boolean" | "choice"
    description: str
    required: bool
    default: str | int | float | bool | None
    options: tuple[str, ...] | None
    env: str                     # the environment variable the job step reads it from


def form_inputs(exp: DiscoveredExperiment, total_nodes: int | None = None) -> list[FormInput]:
    """The inputs of ``exp``'s form: ``run_name``, ``nodes``, then one per ``@param`` in declared order."""
    every = "every node in higgsfield.yml" + (f" ({total_nodes})" if total_nodes else "")
    out = [
        FormInput("run_name", "string", "Name of this run (letters, digits, _ . -); empty: a generated name",
                  False, "", None, ENV_RUN_NAME),
        FormInput("nodes", "number", f"How many nodes to run on, from the first; empty: {every}",
                  False, None, None, ENV_NODES),
    ]
    seen = {i.name.lower(): i.name for i in out}
    for spec in exp.params:
        other = seen.get(spec.name.lower())
        if other is not None:
            # GitHub matches input names case-insensitively, so 'lr' and 'LR' would be one input.
            raise ExperimentError(f"experiment '{exp.name}': @param '{spec.name}' and '{other}' differ only in "
                                  "case; GitHub form inputs are case-insensitive, rename one")
        seen[spec.name.lower()] = spec.name
        out.append(_param_input(exp.name, spec))
    if len(out) > MAX_INPUTS:
        raise ExperimentError(f"experiment '{exp.name}' has {len(exp.params)} params; a GitHub form holds at most "
                              f"{MAX_INPUTS} inputs ({MAX_INPUTS - 2} params besides run_name and nodes)")
    return out


def _param_input(experiment: str, spec: ParamSpec) -> FormInput:
    where = f"experiment '{experiment}': @param '{spec.name}'"
    options = None
    default: str | int | float | bool | None = spec.default
    if spec.options is not None:
        kind = "choice"
        options = tuple(_text(o) for o in spec.options)
        default = _text(spec.default) if spec.default is not None else None
    elif spec.type == "bool":
        kind = "boolean"
    elif spec.type in ("int", "float"):
        kind = "number"
    else:
        kind = "string"
    for value in (default, *(options or ())):
        if isinstance(value, str) and _EXPRESSION in value:
            raise ExperimentError(f"{where}: {value!r} contains '{_EXPRESSION}', which GitHub reads as an "
                                  "expression; a form cannot carry it")
    description = spec.description.strip() or f"{spec.type} parameter"
    # GitHub shows descriptions only, but keep anything that looks like an expression inert all the same.
    description = description.replace(_EXPRESSION, "$ {{")
    return FormInput(spec.name, kind, description, spec.required, default, options, ENV_PARAM_PREFIX + spec.name)


def _text(value: Any) -> str:
    """An option as the form shows it and sends it back: exactly what ``ParamSpec.coerce`` reads."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float_text(value)
    return str(value)


def _float_text(value: float) -> str:
    """A float that YAML 1.1 and 1.2 both read as a float (``1e-05`` is a string to YAML 1.1)."""
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text
