"""From ``@param`` declarations to the inputs of a GitHub ``workflow_dispatch`` form.

One input per ``@param``, typed the way GitHub's form can show it:

    options=[...]       -> choice (the options as text)
    bool                -> boolean (a checkbox)
    int, float          -> number
    str                 -> string

plus ``run_name`` and ``nodes`` first, and ``stall_timeout`` (the run's stall watchdog) last
where the form has room for it: the experiment's own params come first, and a form
without the field runs with higgsfield.yml's ``stall_timeout``. Each input reaches the job through its own
environment variable (``HIGGSFIELD_PARAM_<name>``), never through the script text.

A form holds at most :data:`MAX_INPUTS` inputs. An experiment with more params than
fit gets typed inputs for the first ones (required params first) and one
``more_params`` text input, ``name=value`` pairs, for the rest; the job checks those
exactly like the typed ones.

Use::

    for i in form_inputs(exp):
        i.name, i.type, i.default, i.env
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from higgsfield.contract.errors import ExperimentError
from higgsfield.contract.params import ParamSpec
from higgsfield.contract.text import shown
from higgsfield.control.project.discovery import DiscoveredExperiment
from higgsfield.control.workflows.ci_inputs import (
    ENV_MORE_PARAMS,
    ENV_NODES,
    ENV_PARAM_PREFIX,
    ENV_RUN_NAME,
    ENV_STALL_TIMEOUT,
)

#: Inputs a workflow_dispatch form may have: GitHub's limit as actionlint 1.7.7 checks it.
MAX_INPUTS = 10
MORE_PARAMS = "more_params"
STALL_TIMEOUT = "stall_timeout"
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


def form_inputs(exp: DiscoveredExperiment, when_empty: str | None = None,
                stall_default: float | None = None) -> list[FormInput]:
    """The inputs of ``exp``'s form: ``run_name``, ``nodes``, one per ``@param`` in declared order, then
    ``stall_timeout`` when there is room (and no @param of that name).

    ``when_empty`` is what an empty ``nodes`` means (``ci_inputs.form_nodes_when_empty``), ``stall_default``
    higgsfield.yml's ``stall_timeout`` (what an empty ``stall_timeout`` means).
    """
    every = when_empty or "every node in higgsfield.yml"
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
                                  "case or clash with a form field; GitHub form inputs are case-insensitive, "
                                  "rename it")
        seen[spec.name.lower()] = spec.name
    typed, more = split_params(exp)
    out.extend(_param_input(exp.name, spec) for spec in typed)
    if more:
        if MORE_PARAMS in seen:
            raise ExperimentError(f"experiment '{exp.name}': a @param named '{MORE_PARAMS}' clashes with the form "
                                  "field that carries the params beyond the form's limit; rename it")
        listing = " ".join(f"{s.name}=" + ("REQUIRED" if s.required else _shown(s.default)) for s in more)
        out.append(FormInput(MORE_PARAMS, "string",
                             "More params as NAME=VALUE, space-separated, quoted like a shell word when needed; "
                             f"empty: the defaults. Params and defaults: {listing}".replace(_EXPRESSION, "$ {{"),
                             False, "", None, ENV_MORE_PARAMS))
    if len(out) < MAX_INPUTS and STALL_TIMEOUT not in seen:
        yml = f"stall_timeout in higgsfield.yml ({stall_default:g})" if stall_default is not None \
            else "stall_timeout in higgsfield.yml"
        out.append(FormInput(STALL_TIMEOUT, "number", "Seconds without progress of any rank before the run "
                             f"counts as hung (0: never); empty: {yml}", False, None, None, ENV_STALL_TIMEOUT))
    return out


def split_params(exp: DiscoveredExperiment) -> tuple[list[ParamSpec], list[ParamSpec]]:
    """(params with their own form field, params carried by ``more_params``); required ones get fields first."""
    room = MAX_INPUTS - 2
    if len(exp.params) <= room:
        return list(exp.params), []
    room -= 1   # the more_params field
    ranked = sorted(exp.params, key=lambda s: not s.required)[:room]
    keep = {s.name for s in ranked}
    return [s for s in exp.params if s.name in keep], [s for s in exp.params if s.name not in keep]


def _shown(value: Any) -> str:
    return "(none)" if value is None else _text(value)


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
            raise ExperimentError(f"{where}: {shown(value)} contains '{_EXPRESSION}', which GitHub reads as an "
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
