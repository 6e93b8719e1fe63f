"""The experiment API: ``@experiment`` and ``@param``.

::

    from higgsfield.experiment import experiment, param

    @experiment("alpaca", seed=42)
    @param("size", default="7b", options=["7b", "13b", "70b"])
    @param("lr", default=1e-5, description="peak learning rate")
    @param("fast", default=False)
    def train(params):
        print(params.size, params.lr, params.rank, params.run_name)

The decorators stack in any order and return the function unchanged (it stays
callable). ``higgsfield build-experiments`` and ``higgsfield run`` find experiments
by parsing the source (:mod:`higgsfield.control.project.discovery`), never by importing it; this
module is what runs inside the training processes. It does not import torch.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from higgsfield.contract.errors import ExperimentError
from higgsfield.contract.params import ParamSpec, check_name, resolve

__all__ = ["experiment", "param", "Params", "Experiment", "registry"]

_ATTR_PARAMS = "__higgsfield_params__"
_ATTR_EXPERIMENT = "__higgsfield_experiment__"


class Params(dict):  # type: ignore[type-arg]
    """The typed param values, readable as ``params.lr`` or ``params["lr"]``.

    Also carries ``rank``, ``world_size``, ``local_rank``, ``project_name``,
    ``experiment_name``, ``run_name`` (and ``seed`` when the experiment sets one), and ``data``:
    each entry of ``data:`` in higgsfield.yml as its read-only path on this node (``params.data["corpus"]``).
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"params has no '{name}' (has: {', '.join(self)})") from None


@dataclass
class Experiment:
    """A registered experiment: its name, seed, function and declared params."""

    name: str
    func: Callable[[Params], Any]
    seed: int | None = None

    @property
    def params(self) -> list[ParamSpec]:
        return list(getattr(self.func, _ATTR_PARAMS, []))

    def build_params(self, given: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Params:
        """Typed params plus the distributed context read from ``env`` (default os.environ)."""
        env = os.environ if env is None else env
        values = resolve(self.params, given, self.name)
        ctx = {
            "rank": int(env.get("RANK", "0")),
            "world_size": int(env.get("WORLD_SIZE", "1")),
            "local_rank": int(env.get("LOCAL_RANK", "0")),
            "project_name": env.get("PROJECT_NAME", ""),
            "experiment_name": env.get("EXPERIMENT_NAME", self.name),
            "run_name": env.get("RUN_NAME", ""),
        }
        if self.seed is not None:
            ctx["seed"] = self.seed
        if "data" not in values:   # data: entries of higgsfield.yml, each a read-only directory on this node
            ctx["data"] = _data_paths(env)
        return Params({**values, **ctx})

    def __call__(self, given: Mapping[str, Any] | None = None) -> Any:
        params = self.build_params(given or {})
        if self.seed is not None:
            seed_everything(self.seed)
        return self.func(params)


def _data_paths(env: Mapping[str, str]) -> dict[str, str]:
    """``HIGGSFIELD_DATA`` (JSON: entry name -> path) as a dict; {} when unset or not an object of strings."""
    import json

    from higgsfield.contract.data import DATA_VAR

    try:
        paths = json.loads(env.get(DATA_VAR, "") or "{}")
    except ValueError:
        return {}
    if not isinstance(paths, dict):
        return {}
    return {str(k): str(v) for k, v in paths.items() if isinstance(v, str)}


_REGISTRY: dict[str, Experiment] = {}


def registry() -> dict[str, Experiment]:
    """Experiments registered by the modules imported so far."""
    return dict(_REGISTRY)


def experiment(name: str, *, seed: int | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function taking ``params`` as the experiment ``name``."""
    try:
        check_name(name, "experiment name")
    except ValueError as e:
        raise ExperimentError(str(e)) from None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ExperimentError(f"@experiment('{name}'): seed must be an integer")

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        existing = _REGISTRY.get(name)
        if existing is not None and _qualname(existing.func) != _qualname(func):
            raise ExperimentError(f"experiment '{name}' is defined twice: {_qualname(existing.func)} "
                                  f"and {_qualname(func)}")
        if not hasattr(func, _ATTR_PARAMS):
            setattr(func, _ATTR_PARAMS, [])
        exp = Experiment(name=name, func=func, seed=seed)
        setattr(func, _ATTR_EXPERIMENT, exp)
        _REGISTRY[name] = exp
        return func

    return wrap


def param(name: str, default: Any = None, description: str = "", required: bool = False,
          type: Any = None, options: list[Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a typed param of the experiment (above or below ``@experiment``)."""
    try:
        spec = ParamSpec.build(name, default=default, description=description, required=required,
                               type=type, options=options)
    except ValueError as e:
        raise ExperimentError(str(e)) from None

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        specs: list[ParamSpec] = getattr(func, _ATTR_PARAMS, None) or []
        if any(s.name == spec.name for s in specs):
            raise ExperimentError(f"@param '{spec.name}' is declared twice on {_qualname(func)}")
        # Decorators apply bottom-up: prepend so the list reads in source order.
        setattr(func, _ATTR_PARAMS, [spec, *specs])
        return func

    return wrap


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators when those are importable."""
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (2**32))
    except ImportError:
        pass
    try:
        import torch
        torch.manual_seed(seed)
    except ImportError:
        pass


def _qualname(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
