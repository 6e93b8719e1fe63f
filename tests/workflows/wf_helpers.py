"""Shared helpers for the workflow tests: a project on disk, rendered workflows, YAML access."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

CONFIG = """\
name: demo
nodes:
  - host: gpu-1.example.com
  - host: gpu-2.example.com
    port: 2201
secrets: [WANDB_API_KEY, HF_TOKEN]
"""

#: Values a hostile (or careless) experiment author could put in a form.
INJECTIONS = ['"; rm -rf ~ #', "$(touch {marker})", "`touch {marker}`", "${{{{ secrets.SSH_KEY }}}}",
              "a'b\"c\\d", "line1\nline2: x", "::error::fake annotation"]

EXPERIMENT = '''\
from higgsfield.experiment import experiment, param


@experiment("alpaca", seed=1)
@param("lr", default=0.001, description="Learning rate")
@param("steps", default=100, type=int, description="Optimizer steps")
@param("size", default="7b", options=["7b", "13b", "70b"], description="Model size")
@param("shards", default=2, options=[1, 2, 4])
@param("fast", default=False, description="Use the fast path")
@param("data", required=True, type=str, description="Dataset path")
@param("note", default={note!r}, description={desc!r})
@param("on", type=bool)
def train(params):
    pass


@experiment("tiny")
def tiny(params):
    pass
'''


def make_project(root: Path, *, config: str = CONFIG, experiment: str | None = None,
                 marker: Path | None = None) -> Path:
    """A project with higgsfield.yml and src/train.py (alpaca + tiny) under ``root``."""
    marker = marker or root / "pwned"
    root.mkdir(parents=True, exist_ok=True)
    (root / "higgsfield.yml").write_text(config)
    (root / "src").mkdir(exist_ok=True)
    if experiment is None:
        experiment = EXPERIMENT.format(note=f'"; rm -rf ~ # $(touch {marker})',
                                       desc=f"$(touch {marker}) `id` ${{{{ secrets.SSH_KEY }}}}")
    (root / "src" / "train.py").write_text(textwrap.dedent(experiment))
    return root


def load(text: str) -> dict[str, Any]:
    """Parse a workflow; PyYAML (YAML 1.1) reads the key ``on`` as True, so put it back."""
    data = yaml.safe_load(text)
    if True in data:
        data["on"] = data.pop(True)
    return data


def steps(workflow: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job, step) for job, spec in workflow["jobs"].items() for step in spec["steps"]]
