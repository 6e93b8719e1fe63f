"""Checkpoints on nodes that share no disk: 2 "nodes" x 2 ranks on one machine, each with its own directory.

Two torchrun agents (``--nnodes 2 --node_rank 0/1`` on 127.0.0.1) run tiny_llama
with a different ``HIGGSFIELD_CHECKPOINT_DIR`` each, so no rank of node 1 can see
a file of node 0: a load that needed one would fail. What must hold: each node
keeps only its own ranks' shards (plus its own metadata, trainer state, rng and
marker), a restart of both resumes from the last step complete on both with the
loss of an uninterrupted run, a step missing on node 1 makes the load fall back
to the previous one, and with nothing in common every rank stops with one line
naming node 1 and its directory. Keep-last-k prunes on both nodes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hf_check import export_and_compare
from trainutil import LAUNCH, ROOT, TINY, losses

pytestmark = pytest.mark.slow

STEPS, EVERY = 12, 4
BASE = {"steps": STEPS, "checkpoint_every": EVERY, "precision": "fp32"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(tmp: Path, params: dict[str, Any], run: str,
              timeout: float = 400) -> tuple[list[subprocess.CompletedProcess[str]], list[dict[str, Any]]]:
    """tiny_llama on 2 torchrun agents x 2 ranks, node N's checkpoints in ``tmp/nodeN``; rank 0's metrics."""
    metrics = tmp / f"metrics-{run}-{len(list(tmp.glob('metrics-*')))}.jsonl"
    args = [f"{k}={v}" for k, v in {**TINY, **params, "metrics_file": str(metrics)}.items()]
    port = _port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(LAUNCH), "tiny_llama", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PROJECT_NAME": "test", "EXPERIMENT_NAME": "tiny_llama",
               "RUN_NAME": run, "HIGGSFIELD_CHECKPOINT_DIR": str(tmp / f"node{node}" / run),
               "HIGGSFIELD_NODE": f"fake{node}", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,  # noqa: S603
                                      stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return done, lines


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
    saved = tmp_path / "logits.pt"
    procs, full = two_nodes(tmp_path, {**BASE, "engine": "fsdp", "logits_file": saved}, run="full")
    _ok(procs)
    ref = losses(full)
    assert sorted(ref) == list(range(STEPS))
    # `pull --hf` of the last step (both nodes' parts merged): transformers loads it, with the trained logits
    last = [tmp_path / f"node{n}" / "full" / f"step_{STEPS:08d}" for n in (0, 1)]
    check = export_and_compare(last, tmp_path, saved)
    assert check["max_diff"] < 1e-4 and check["sum"] == "12+34=", check

    # Cut after step 9 (saves after steps 3 and 7): each node holds its own part.
    procs, first = two_nodes(tmp_path, {**BASE, "engine": "fsdp", "stop_after": 9}, run="cut")
    _ok(procs)
    assert sorted(losses(first)) == list(range(10))
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

    # Both restart: resume at 8 (only from their own files) and match the uninterrupted run.
    procs, second = two_nodes(tmp_path, {**BASE, "engine": "fsdp"}, run="cut")
    _ok(procs)
    assert sorted(losses(second)) == list(range(8, STEPS))
    _close(ref, losses(second), range(8, STEPS))
    assert _steps(node0) == _steps(node1) == ["step_00000008", "step_00000012"]  # keep-last-2 on both

    # Node 1 lost its part of the newest step: the load falls back to step 8 on every rank.
    shutil.rmtree(node1 / "step_00000012")
    procs, third = two_nodes(tmp_path, {**BASE, "engine": "fsdp"}, run="cut")
    _ok(procs)
    assert sorted(losses(third)) == list(range(8, STEPS))
    _close(ref, losses(third), range(8, STEPS))
    assert "checkpoint step 12 is not complete on node 1" in procs[0].stderr

    # Node 1 holds nothing (a replaced node): every rank raises the same one line, naming node 1 and where.
    shutil.rmtree(node1)
    procs, _ = two_nodes(tmp_path, {**BASE, "engine": "fsdp"}, run="cut")
    want = (f"checkpoint step 12 is not complete on node 1 (fake1: no step_00000012 in {node1}): "
            "resume on the same nodes, or from a mirror")
    for n, p in enumerate(procs):
        assert p.returncode != 0, f"node {n} should have failed"
        assert p.stderr.count(want) >= 2, f"node {n}: both its ranks must say it\n{p.stderr[-4000:]}"


@pytest.mark.timeout(900)
def test_deepspeed_zero3_node_local_resumes_from_each_nodes_own_files(tmp_path):
    """ZeRO-3 writes every rank's model and optimizer partition itself; a node's lead adds trainer state."""
    params = {**BASE, "engine": "deepspeed", "zero_stage": 3}
    saved = tmp_path / "logits.pt"
    procs, full = two_nodes(tmp_path, {**params, "logits_file": saved}, run="full")
    _ok(procs)
    # `pull --hf` of ZeRO-3 partitions (each node wrote its ranks' own): consolidated, the trained logits
    last = [tmp_path / f"node{n}" / "full" / f"step_{STEPS:08d}" for n in (0, 1)]
    check = export_and_compare(last, tmp_path, saved)
    assert check["max_diff"] < 1e-4 and check["sum"] == "12+34=", check
    procs, _ = two_nodes(tmp_path, {**params, "stop_after": 9}, run="cut")
    _ok(procs)
    node0, node1 = tmp_path / "node0" / "cut", tmp_path / "node1" / "cut"
    assert _steps(node0) == _steps(node1) == ["step_00000004", "step_00000008"]
    for node, ranks in ((node0, (0, 1)), (node1, (2, 3))):
        part = node / "step_00000008" / "deepspeed"
        assert {p.name for p in part.iterdir() if p.name.startswith("zero_pp_rank_")} == \
            {f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in ranks for kind in ("model", "optim")}
    procs, second = two_nodes(tmp_path, params, run="cut")
    _ok(procs)
    assert sorted(losses(second)) == list(range(8, STEPS))
    _close(losses(full), losses(second), range(8, STEPS))
