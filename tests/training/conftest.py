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
