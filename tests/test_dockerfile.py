"""The repo's own Dockerfile builds on the real engine and runs an experiment's entrypoint inside."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.docker]


def test_training_image_builds_and_runs_an_experiment(testbed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tag = "higgsfield-test-training:latest"
    build = subprocess.run(
        ["docker", "build", "--network", "host", "-t", tag,
         "--build-arg", f"BASE_IMAGE={testbed.base_image}", "--build-arg", "INSTALL_REQUIREMENTS=false",
         str(REPO)], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-3000:]
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    (rd / "spec.json").write_text(json.dumps({
        "project": "higgsfield", "experiment": "regression", "run": "img", "module": "regression",
        "code_dir": "/workspace", "params": {"steps": "8"}, "version": 1,   # a RunSpec (higgsfield.contract.runspec)
        "node": "n", "node_rank": 0, "nodes": ["n"], "master_addr": "127.0.0.1", "submitted_at": 0}))
    run = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", "--ipc", "host", "-v", f"{rd}:{rd}",
         "-e", "PROJECT_NAME=higgsfield", "-e", "EXPERIMENT_NAME=regression", "-e", "RUN_NAME=img",
         tag, "python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "higgsfield.node.entrypoint", str(rd)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    losses = [float(line.split()[-1]) for line in (rd / "logs" / "rank0.log").read_text().splitlines()
              if line.startswith("step ")]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert (rd / "logs" / "rank1.log").read_text().count("loss") == 8
