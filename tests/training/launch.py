"""Run an experiment from src/ under torchrun, as ``higgsfield.node.entrypoint`` will.

    torchrun --nproc_per_node 2 tests/training/launch.py tiny_llama steps=50 metrics_file=/tmp/m.jsonl

Stands in for the entrypoint in these tests: import ``src/<module>.py``, build
the params from ``key=value`` arguments and the environment, seed, call.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from higgsfield.contract.params import parse_assignments
from higgsfield.experiment import registry, seed_everything
from higgsfield.node.runtime.attempts import isolate_restart_store

SRC = Path(__file__).resolve().parents[2] / "src"


def main(argv: list[str]) -> None:
    name, pairs = argv[0], argv[1:]
    isolate_restart_store()   # as the entrypoint does: a restarted worker keys the store by its attempt
    spec = importlib.util.spec_from_file_location(name, SRC / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exp = registry()[name]
    params = exp.build_params(parse_assignments(pairs))
    if exp.seed is not None:
        seed_everything(exp.seed)
    exp.func(params)


if __name__ == "__main__":
    main(sys.argv[1:])
    from higgsfield.node.entrypoint import leave

    leave(0)  # as a rank under higgsfield ends: no finalization, where gloo threads can abort it
