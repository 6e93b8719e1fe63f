"""``Llama(sharding=...)``: full, hybrid (HSDP: shard within a node, replicate across) and replicate.

The slow tests run tiny_llama three times (launches are the cost: 11 s each here, DeepSpeed's 30 s):
2 "nodes" x 2 ranks with ``sharding=hybrid``, which must build a (2, 2) mesh (its startup
line says so, so a silent fall-back to full fails the test), its losses those of the same
with the default sharding, which must be full: that run is conftest.py's ``full_2x2``, the launch
test_checkpoint_mirror.py starts from, so the hybrid run keeps its schedule (12 steps cut after
step 9); 1 node x 4 ranks resuming the hybrid run's node-local checkpoint, its parts merged as
``pull`` merges them, under full sharding (DCP reshards), with the hybrid run's losses; and
DeepSpeed's hybrid (ZeRO++ hpZ) resuming its node-local checkpoint after a crash. The fast tests hold the pure
choice (:func:`higgsfield._lib.mesh.plan_mesh`) and its one-line refusals.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from hf_check import merge_local
from trainutil import (
    SHARED_CUT,
    SHARED_EVERY,
    SHARED_STEPS,
    finish_two_nodes,
    losses,
    ok,
    start_two_nodes,
    torchrun,
)

from higgsfield._lib import mesh
from higgsfield._lib.deepspeed import make_config

STEPS, EVERY, CUT = SHARED_STEPS, SHARED_EVERY, SHARED_CUT   # the shared full run's schedule (conftest.py)
BASE = {"steps": STEPS, "checkpoint_every": EVERY, "precision": "fp32", "engine": "fsdp"}
DS_STEPS, DS_EVERY = 10, 5


def _close(a: dict[int, float], b: dict[int, float], steps: range, rtol: float = 1e-4) -> None:
    for s in steps:
        assert math.isclose(a[s], b[s], rel_tol=rtol, abs_tol=1e-6), f"step {s}: {a[s]} != {b[s]}\n{a}\n{b}"


def _two_nodes(tmp: Path, params: dict[str, Any], run: str) -> tuple[str, dict[int, float]]:
    """tiny_llama on 2 agents x 2 ranks; node 0's stderr (rank 0's lines) and rank 0's losses."""
    began = time.monotonic()
    procs, lines = finish_two_nodes(*start_two_nodes(tmp, params, run))
    for p in procs:
        ok(p)
    print(f"launch {run}: {time.monotonic() - began:.1f} s")
    return procs[0].stderr, losses(lines)


@pytest.fixture(scope="module")
def two_node_runs(tmp_path_factory: pytest.TempPathFactory, full_2x2: dict[str, Any]) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hybrid")
    hybrid = _two_nodes(tmp, {**BASE, "sharding": "hybrid", "stop_after": CUT}, "hybrid")
    full = full_2x2["stderr"], full_2x2["losses"]  # the default: full (the shared launch, conftest.py)
    return {"tmp": tmp, "hybrid": hybrid, "full": full}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hybrid_on_two_nodes_is_a_2x2_mesh_and_trains_as_the_default_full(two_node_runs):
    (hybrid_err, hybrid), (full_err, full) = two_node_runs["hybrid"], two_node_runs["full"]
    assert "higgsfield: FSDP mesh (2, 2) replicate x shard (hybrid: asked, 2 nodes x 2 ranks)" in hybrid_err, \
        hybrid_err[-3000:]
    assert "higgsfield: FSDP mesh (4,) shard (full: the default)" in full_err, full_err[-3000:]
    assert sorted(hybrid) == sorted(full) == list(range(CUT + 1))
    _close(hybrid, full, range(CUT + 1))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hybrid_checkpoint_resumes_under_full_on_one_node_of_four(two_node_runs):
    from torch.distributed.checkpoint import FileSystemReader

    tmp, (_, hybrid) = two_node_runs["tmp"], two_node_runs["hybrid"]
    parts = [tmp / f"node{n}" / "hybrid" / f"step_{EVERY:08d}" for n in (0, 1)]
    # Hybrid shards are replicated across the nodes: each node's part holds the whole model and optimizer in
    # its own ranks' files, and its .metadata points only at them.
    covered = []
    for n, part in enumerate(parts):
        own = {f"__{r}_0.distcp" for r in (2 * n, 2 * n + 1)}
        assert {p.name for p in part.glob("*.distcp")} == own
        storage = FileSystemReader(str(part)).read_metadata().storage_data
        assert {info.relative_path for info in storage.values()} <= own, (n, storage)
        covered.append({(index.fqn, tuple(index.offset or ())) for index in storage})
    assert covered[0] == covered[1]
    merge_local(parts, tmp / "ckpt" / "moved" / parts[0].name)
    began = time.monotonic()
    proc, lines = torchrun(4, tmp, {**BASE, "sharding": "full"}, run="moved")
    ok(proc)
    print(f"launch moved: {time.monotonic() - began:.1f} s")
    assert "higgsfield: FSDP mesh (4,) shard (full: asked)" in proc.stderr, proc.stderr[-3000:]
    moved = losses(lines)
    assert sorted(moved) == list(range(EVERY, STEPS)), "the resume must start at the hybrid run's checkpoint"
    _close(hybrid, moved, range(EVERY, CUT + 1))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deepspeed_hybrid_is_hpz_and_resumes_from_its_checkpoint(tmp_path):
    # ZeRO-3 with hpZ over each node's 2 ranks; a worker of node 1 dies at step 9 and torchrun restarts both nodes,
    # which resume from the save after step 4 (each node's own files) with the dead attempt's losses: 4 steps, so
    # that a state restored wrong (the LR schedule's shows from the third step on) changes some.
    began = time.monotonic()
    procs, lines = finish_two_nodes(*start_two_nodes(
        tmp_path, {**BASE, "steps": DS_STEPS, "checkpoint_every": DS_EVERY, "engine": "deepspeed", "sharding": "hybrid",
                   "crash_at": 9}, "ds", max_restarts=1))
    for p in procs:
        ok(p)
    print(f"launch ds: {time.monotonic() - began:.1f} s")
    want = "higgsfield: DeepSpeed ZeRO++ hpZ, parameters gathered within each node's 2 ranks (hybrid: asked, "
    assert want in procs[0].stderr, procs[0].stderr[-3000:]
    first = {m["step"]: m["loss"] for m in lines if m["attempt"] == 0}
    again = {m["step"]: m["loss"] for m in lines if m["attempt"] == 1}
    assert sorted(first) == list(range(9)) and sorted(again) == list(range(DS_EVERY, DS_STEPS)), (first, again)
    _close(first, again, range(DS_EVERY, 9), rtol=1e-5)


# -- the pure choice and its refusals (fast) -------------------------------------------------------------------


@pytest.mark.parametrize(("args", "kw", "want"), [
    (("auto", 4, 2, 3), {}, ("full", (4,), ("shard",))),            # the default: what zero_stage implies
    (("auto", 6, None, 3), {"uneven": "the nodes differ"}, ("full", (6,), ("shard",))),
    (("auto", 4, 2, 0), {}, ("replicate", (4, 1), ("replicate", "shard"))),
    (("replicate", 4, 2, 0), {}, ("replicate", (4, 1), ("replicate", "shard"))),
    (("full", 4, 2, 3), {}, ("full", (4,), ("shard",))),
    (("hybrid", 4, 2, 3), {}, ("hybrid", (2, 2), ("replicate", "shard"))),
    (("hybrid", 16, 8, 2), {}, ("hybrid", (2, 8), ("replicate", "shard"))),
    (("hybrid", 4, 4, 3), {}, ("hybrid", (1, 4), ("replicate", "shard"))),
    (("auto", 4, 2, 3), {"engine": "deepspeed"}, ("full", (4,), ("shard",))),
    (("hybrid", 4, 2, 3), {"engine": "deepspeed"}, ("hybrid", (2, 2), ("replicate", "shard"))),
    (("auto", 1, 1, 3), {}, ("full", (1,), ("shard",))),            # python train.py: one process
])
def test_plan_mesh(args, kw, want):
    plan = mesh.plan_mesh(*args, **kw)
    assert (plan.sharding, plan.shape, plan.names) == want
    assert plan.why and "\n" not in plan.describe()


@pytest.mark.parametrize(("sharding", "stage", "engine", "match"), [
    ("hsdp", 3, "fsdp", r"unknown sharding 'hsdp': choose one of auto, full, hybrid, replicate"),
    ("hybrid", 0, "fsdp", r"sharding='hybrid' shards the model and zero_stage=0 shards nothing"),
    ("full", 0, "fsdp", r"sharding='full' shards the model and zero_stage=0"),
    ("replicate", 3, "fsdp", r"sharding='replicate' .* which is zero_stage=0: pass zero_stage=0"),
    ("hybrid", 2, "deepspeed", r"sharding='hybrid' with engine='deepspeed' is ZeRO\+\+ hpZ, which is ZeRO-3 only"),
])
def test_bad_sharding_is_one_line(sharding, stage, engine, match):
    from higgsfield.llama import _check_args

    for check in (lambda: mesh.check_sharding(sharding, stage, engine),
                  lambda: _check_args("fp32", engine, stage, sharding)):
        with pytest.raises(ValueError, match=match) as err:
            check()
        assert "\n" not in str(err.value)


def test_explicit_hybrid_on_uneven_nodes_is_refused():
    size, why = mesh.ranks_per_node(["a", "a", "a", "b"], [3, 3, 3, 1])
    assert size is None and why == "the nodes have different numbers of ranks (1, 3)"
    with pytest.raises(ValueError, match=r"sharding='hybrid' needs the same number of ranks on every node and "
                                         r"the nodes have different numbers of ranks \(1, 3\): start as many"):
        mesh.plan_mesh("hybrid", 4, size, 3, uneven=why)


def test_ranks_per_node():
    assert mesh.ranks_per_node(["0", "0", "1", "1"], [2] * 4) == (2, "")
    assert mesh.ranks_per_node(["host"], [1]) == (1, "")
    assert mesh.ranks_per_node(["0", "1", "0", "1"], [2] * 4) == (None, "the ranks are not numbered node after node")
    assert mesh.ranks_per_node(["0", "0", "1", "1"], [4] * 4)[0] is None   # LOCAL_WORLD_SIZE disagrees


def test_deepspeed_hybrid_is_hpz_over_a_node():
    assert make_config(3, "bf16", False, None, hpz=8)["zero_optimization"]["zero_hpz_partition_size"] == 8
    assert "zero_hpz_partition_size" not in make_config(3, "bf16", False, None)["zero_optimization"]
