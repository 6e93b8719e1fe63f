"""torchrun's environment, built in one place (higgsfield.node.runtime.env): an SSH node's runtimes and a Slurm
node's task give a run the same variables, named by the contract, and keep the same basics of the node's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from higgsfield.contract import layout
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.slurmjob import PinnedSlurmRun
from higgsfield.node import slurm_task
from higgsfield.node.runtime import torchrun
from higgsfield.node.runtime.env import KEPT_ENV, kept_basics, run_variables
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import NodeRun, Placement
from higgsfield.node.state.records import RunDir

pytestmark = pytest.mark.timeout(30)

BASE = {"PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "TZ": "UTC", "CUDA_VISIBLE_DEVICES": "0,1",
        "SSH_AUTH_SOCK": "/tmp/agent", "SLURM_JOB_ID": "7", "PYTHONPATH": "/elsewhere", "A_KEY": "v"}


def _spec(**changes: object) -> RunSpec:
    fields: dict[str, object] = {
        "project": "p", "experiment": "e", "run": "r", "module": "m", "code_dir": "/c", "params": {},
        "node": "n1", "node_rank": 0, "nodes": ("n1", "n2"), "master_addr": "n1", "submitted_at": time.time(),
        "nproc": 2, "runtime": "process", **changes}
    return RunSpec(**fields)  # type: ignore[arg-type]


def test_the_kept_basics_are_the_named_ones_and_the_locale() -> None:
    assert kept_basics(BASE) == {"PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
    assert kept_basics(BASE, also=("CUDA_VISIBLE_DEVICES",))["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_VISIBLE_DEVICES" not in KEPT_ENV   # the process runtime sets its own from the run's slots


@pytest.mark.parametrize(("ckpt", "mirror"), [("", ""), ("/w/ckpt/p/r", "s3://b/ckpt")])
def test_the_runs_variables_are_named_by_the_contract(ckpt: str, mirror: str) -> None:
    env = run_variables(project="p", experiment="e", run="r", run_dir="/s/runs/p/r", node="n2",
                        checkpoint_dir=ckpt, checkpoint_mirror=mirror)
    assert env == {"PROJECT_NAME": "p", "EXPERIMENT_NAME": "e", "RUN_NAME": "r",
                   layout.RUN_DIR_VAR: "/s/runs/p/r", layout.NODE_VAR: "n2", "PYTHONUNBUFFERED": "1",
                   "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                   **({layout.CHECKPOINT_DIR_VAR: ckpt} if ckpt else {}),
                   **({layout.CHECKPOINT_MIRROR_VAR: mirror} if mirror else {})}
    assert layout.RUN_DIR_VAR == "HIGGSFIELD_RUN_DIR" and layout.NODE_VAR == "HIGGSFIELD_NODE"
    assert layout.CHECKPOINT_DIR_VAR == "HIGGSFIELD_CHECKPOINT_DIR"
    assert layout.CHECKPOINT_MIRROR_VAR == "HIGGSFIELD_CHECKPOINT_MIRROR"


def test_an_ssh_node_and_a_slurm_node_give_the_run_the_same_environment(tmp_path: Path) -> None:
    """The Slurm task's node env is the process runtime's, less the run's GPU slots (Slurm sets those) and with
    the secrets the batch step named; both carry this node's name, not node 0's."""
    spec = _spec(checkpoint_mirror="s3://b/ckpt")
    rd = RunDir(NodeState(tmp_path), "p", "r")
    ssh = NodeRun(spec.replace(node="n2", node_rank=1),
                  Placement(gpus=0, cache_dir="/w/cache", checkpoint_dir="/w/ckpt", container=""))
    slurm = PinnedSlurmRun(spec, checkpoint_dir="/w/ckpt", python="/venv/bin/python")
    base = {**BASE, slurm_task.SECRET_NAMES_VAR: "A_KEY"}
    on_slurm = slurm_task.node_env(slurm, rd, "n2", base)
    on_ssh = torchrun.process_env(ssh, rd, {"A_KEY": "v"}, base=BASE)
    assert on_slurm == {**on_ssh, "CUDA_VISIBLE_DEVICES": "0,1"}
    assert on_ssh[layout.NODE_VAR] == "n2" and on_ssh[layout.CHECKPOINT_MIRROR_VAR] == "s3://b/ckpt"
    assert torchrun.container_env(ssh, rd).items() >= torchrun.run_vars(ssh, rd).items()
