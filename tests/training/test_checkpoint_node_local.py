"""Checkpoints on nodes that share no disk: 2 "nodes" x 2 ranks on one machine, each with its own directory.

Two torchrun agents (``--nnodes 2 --node_rank 0/1`` on 127.0.0.1) run tiny_llama
with a different ``HIGGSFIELD_CHECKPOINT_DIR`` each, so no rank of node 1 can see
a file of node 0: a load that needed one would fail. What must hold: each node
keeps only its own ranks' shards (plus its own metadata, trainer state, rng and
marker); a worker of node 1 that dies makes torchrun (``--max-restarts 1``) restart
the workers of both nodes, which go on from the last step complete on both with the
losses the dead attempt had; a restart of both resumes from the last step complete
on both with the losses of an uninterrupted run (the interrupted run itself, which
ran on to step 9 past its last save at 8, and saved asynchronously in the FSDP
case); in the FSDP case that restart finds the newest step missing on node 1, so
its load falls back to the step before on every rank, and with nothing in common
every rank stops with one line naming node 1 and its directory. Keep-last-k prunes
on both nodes. The last step, merged as ``pull`` merges it and converted as
``pull --hf`` converts it, loads in ``transformers`` with the trained model's logits.
Launches are the suite's cost (about 20 s each here, DeepSpeed's 40 s): no
separate uninterrupted reference run is made, and one restart is both the fall-back
and the resume (each was a launch of its own until then).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hf_check import export_and_compare
from trainutil import finish_two_nodes, losses, start_two_nodes

pytestmark = pytest.mark.slow

STEPS, EVERY = 12, 4
BASE = {"steps": STEPS, "checkpoint_every": EVERY, "precision": "fp32"}


def two_nodes(tmp: Path, params: dict[str, Any], run: str, timeout: float = 400, max_restarts: int = 0
              ) -> tuple[list[subprocess.CompletedProcess[str]], list[dict[str, Any]]]:
    """tiny_llama on 2 torchrun agents x 2 ranks, node N's checkpoints in ``tmp/nodeN``; rank 0's metrics."""
    return finish_two_nodes(*start_two_nodes(tmp, params, run, max_restarts=max_restarts), timeout=timeout)


def _resumed(lines: list[dict[str, Any]], at: int) -> None:
    """Attempt 0 crashed; torchrun's restart (attempt 1) went on from step ``at`` with attempt 0's losses."""
    first = {m["step"]: m["loss"] for m in lines if m["attempt"] == 0}
    again = {m["step"]: m["loss"] for m in lines if m["attempt"] == 1}
    assert again and min(again) == at, f"the restarted workers began at {min(again, default=None)}, not {at}"
    _close(first, again, range(at, max(first) + 1))


def _ok(procs: list[subprocess.CompletedProcess[str]]) -> None:
    for n, p in enumerate(procs):
        assert p.returncode == 0, f"node {n}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"


def _steps(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("step_")) if d.is_dir() else []


def _close(a: dict[int, float], b: dict[int, float], steps: range) -> None:
    for s in steps:
        assert math.isclose(a[s], b[s], rel_tol=1e-5, abs_tol=1e-6), f"step {s}: {a[s]} != {b[s]}\n{a}\n{b}"


@pytest.mark.timeout(900)
def test_fsdp_node_local_saves_resume_fall_back_and_prune(tmp_path):
    # Rank 3 (node 1) dies at step 8 with the save after step 3 complete and the one after step 7 still in flight
    # (saves are written in the background): torchrun restarts the workers of both nodes, which go on from step 4,
    # each node reading only its own part. Cut after step 9: each node holds its own part.
    procs, first = two_nodes(tmp_path, {**BASE, "engine": "fsdp", "stop_after": 9, "async_save": True,
                                        "crash_at": 8}, run="cut", max_restarts=1)
    _ok(procs)
    _resumed(first, 4)
    ref = losses(first)   # the restarted run up to step 9: what a resume at step 4 must give again
    assert sorted(ref) == list(range(10))
    node0, node1 = tmp_path / "node0" / "cut", tmp_path / "node1" / "cut"
    assert _steps(node0) == _steps(node1) == ["step_00000004", "step_00000008"]
    for node, ranks in ((node0, (0, 1)), (node1, (2, 3))):
        part = node / "step_00000008"
        names = {p.name for p in part.iterdir()}
        assert {".metadata", "trainer.pt", "COMPLETE"} <= names, names
        assert {f"rng_rank{r}.pt" for r in range(4) if f"rng_rank{r}.pt" in names} == \
            {f"rng_rank{r}.pt" for r in ranks}
        assert {n for n in names if n.endswith(".distcp")} == {f"__{r}_0.distcp" for r in ranks}, names
        marker = json.loads((part / "COMPLETE").read_text())
        assert marker["mode"] == "node-local" and marker["ranks"] == list(ranks), marker

    # Both restart, and node 1 lost its part of the newest step (8), and node 0 its buddy copy of it (or it never
    # arrived): the load falls back to step 4 on every rank, each node reading only its own files, and the run
    # matches the uninterrupted one. (With the copy, test_checkpoint_buddy.py restores it.)
    shutil.rmtree(node1 / "step_00000008")
    shutil.rmtree(node0 / ".replicas" / "step_00000008", ignore_errors=True)
    saved = tmp_path / "logits.pt"
    procs, second = two_nodes(tmp_path, {**BASE, "engine": "fsdp", "logits_file": saved}, run="cut")
    _ok(procs)
    assert "checkpoint step 8 is not complete on node 1" in procs[0].stderr
    assert sorted(losses(second)) == list(range(4, STEPS))
    _close(ref, losses(second), range(4, 10))
    assert _steps(node0) == _steps(node1) == ["step_00000008", "step_00000012"]  # keep-last-2 on both
    # `pull --hf` of the last step (both nodes' parts merged): transformers loads it, with the trained logits
    check = export_and_compare([node0 / "step_00000012", node1 / "step_00000012"], tmp_path, saved)
    assert check["max_diff"] < 1e-4 and check["sum"] == "12+34=", check

    # Node 1 holds nothing (a replaced node) and node 0 no copy of its part: every rank raises the same one
    # line, naming node 1 and where.
    shutil.rmtree(node1)
    shutil.rmtree(node0 / ".replicas", ignore_errors=True)
    procs, _ = two_nodes(tmp_path, {**BASE, "engine": "fsdp"}, run="cut")
    want = (f"checkpoint step 12 is not complete on node 1 (fake1: no step_00000012 in {node1}): "
            "no node holds a buddy copy of the missing part, and no mirror is set (checkpoint.mirror)")
    for n, p in enumerate(procs):
        assert p.returncode != 0, f"node {n} should have failed"
        assert p.stderr.count(want) >= 2, f"node {n}: both its ranks must say it\n{p.stderr[-4000:]}"


@pytest.mark.timeout(900)
def test_deepspeed_zero3_node_local_resumes_from_each_nodes_own_files(tmp_path):
    """ZeRO-3 writes every rank's model and optimizer partition itself; a node's lead adds trainer state."""
    params = {**BASE, "engine": "deepspeed", "zero_stage": 3}
    # a worker of node 1 dies at step 6: torchrun restarts both nodes' workers from the save after step 3
    procs, first = two_nodes(tmp_path, {**params, "stop_after": 9, "crash_at": 6}, run="cut", max_restarts=1)
    _ok(procs)
    _resumed(first, 4)
    node0, node1 = tmp_path / "node0" / "cut", tmp_path / "node1" / "cut"
    assert _steps(node0) == _steps(node1) == ["step_00000004", "step_00000008"]
    for node, ranks in ((node0, (0, 1)), (node1, (2, 3))):
        part = node / "step_00000008" / "deepspeed"
        assert {p.name for p in part.iterdir() if p.name.startswith("zero_pp_rank_")} == \
            {f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in ranks for kind in ("model", "optim")}
    saved = tmp_path / "logits.pt"
    procs, second = two_nodes(tmp_path, {**params, "logits_file": saved}, run="cut")
    _ok(procs)
    assert sorted(losses(second)) == list(range(8, STEPS))
    _close(losses(first), losses(second), range(8, 10))   # the cut (restarted) run was uninterrupted from 4 to 9
    # `pull --hf` of ZeRO-3 partitions (each node wrote its ranks' own): consolidated, the trained logits
    check = export_and_compare([node0 / "step_00000012", node1 / "step_00000012"], tmp_path, saved)
    assert check["max_diff"] < 1e-4 and check["sum"] == "12+34=", check
