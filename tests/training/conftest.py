"""Fixtures for the training library: in-process single-rank setup and a torchrun helper.

Multi-process tests run ``tests/training/launch.py`` (the stand-in for
``higgsfield.node.entrypoint``) under torchrun on CPU with gloo and read the
per-step metrics tiny_llama appends to a JSON-lines file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def single_rank() -> None:
    """A one-process gloo group in this pytest process (what init_distributed makes without torchrun)."""
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        if var in os.environ:
            pytest.skip("running under torchrun")
    from higgsfield.training import init_distributed
    init_distributed()


@pytest.fixture(scope="session")
def tiny_llama_module() -> Any:
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "src" / "tiny_llama.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def full_2x2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One launch two modules start from, as launches are the suite's cost: tiny_llama under FSDP's default
    (full) sharding on 2 "nodes" x 2 ranks (``trainutil.start_two_nodes``), run ``cut``: 12 steps cut after
    step 9, a checkpoint every 4 written to each node's own directory and to a path mirror.

    test_checkpoint_mirror.py goes on from it (and then changes its directories); test_hybrid_sharding.py
    compares a hybrid run with its startup line and losses. Returns ``tmp`` (node N's checkpoints in
    ``tmp/nodeN/cut``), ``mirror`` (its environment), ``stderr`` (node 0's) and ``losses`` (step -> loss).
    """
    from trainutil import SHARED_CUT, SHARED_EVERY, SHARED_STEPS, finish_two_nodes, losses, start_two_nodes

    tmp = tmp_path_factory.mktemp("full-2x2")
    mirror = {"HIGGSFIELD_CHECKPOINT_MIRROR": f"file://{tmp / 'mirror'}"}
    params = {"steps": SHARED_STEPS, "checkpoint_every": SHARED_EVERY, "precision": "fp32", "engine": "fsdp",
              "stop_after": SHARED_CUT}
    done, lines = finish_two_nodes(*start_two_nodes(tmp, params, "cut", mirror))
    for n, d in enumerate(done):
        assert d.returncode == 0, f"node {n}: exit {d.returncode}\n{d.stdout[-3000:]}\n{d.stderr[-6000:]}"
    return {"tmp": tmp, "mirror": mirror, "stderr": done[0].stderr, "losses": losses(lines)}
