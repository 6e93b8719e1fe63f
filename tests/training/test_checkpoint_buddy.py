"""Buddy copies: a node's checkpoint part outlives its disk, on a spare or on fewer nodes, with no mirror.

Three torchrun agents x 1 rank on this machine, each "node" with its own checkpoint
directory (``HIGGSFIELD_CHECKPOINT_DIR``), so no node sees another's files: what a
node lacks can only come over the run's own process group. What must hold:

- after each save every node holds the part of the node before it in the ring
  (``.replicas/step_*/part<i>`` with its manifest), and a step whose copy arrived
  is marked ``BUDDY`` on the node it came from; keep-last-k prunes the copies;
- node 1's disk is lost and a spare takes its place (3 nodes again): the survivor
  that held node 1's copy becomes node 1, the spare gets node 2's part from it, and
  the run resumes with the losses of the uninterrupted run. The newest copy of node
  1's part was damaged on disk (one byte): it is refused in one line, and the run
  resumes from the step before, whose copy is whole;
- the spare is lost too, and the run goes on on the 2 survivors (world size 3 -> 2):
  every node puts all 3 parts of the newest step together from its own part and its
  copies, and the losses are those of the 3-node run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainutil import LAUNCH, ROOT, TINY, free_port, kill_sessions

from higgsfield._lib.buddy_plan import Held, Move, plan

STEPS, EVERY = 16, 4
BASE = {"steps": STEPS, "checkpoint_every": EVERY, "precision": "fp32", "global_batch": 12}


def _nodes(tmp: Path, dirs: list[Path], params: dict[str, Any], run: str, timeout: float = 300
           ) -> tuple[list[subprocess.CompletedProcess[str]], dict[int, float]]:
    """tiny_llama on ``len(dirs)`` torchrun agents x 1 rank, node N's checkpoints in ``dirs[N]``; step -> loss."""
    metrics = tmp / f"metrics-{len(list(tmp.glob('metrics-*')))}.jsonl"
    args = [f"{k}={v}" for k, v in {**TINY, **params, "metrics_file": str(metrics)}.items()]
    port = free_port()
    procs = []
    for node, d in enumerate(dirs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(dirs)), "--node_rank", str(node),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(LAUNCH), "tiny_llama", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PROJECT_NAME": "test", "EXPERIMENT_NAME": "tiny_llama",
               "RUN_NAME": run, "HIGGSFIELD_CHECKPOINT_DIR": str(d), "HIGGSFIELD_NODE": d.parent.name,
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONPATH": str(ROOT)}
        env.pop("HIGGSFIELD_CHECKPOINT_MIRROR", None)
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,  # noqa: S603
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    except subprocess.TimeoutExpired:
        kill_sessions(procs)
        raise
    for n, p in enumerate(done):
        assert p.returncode == 0, f"node {n}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-5000:]}"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    return done, {m["step"]: m["loss"] for m in lines}


def _close(a: dict[int, float], b: dict[int, float], steps: range, rel: float = 1e-5) -> None:
    for s in steps:
        assert abs(a[s] - b[s]) <= rel * max(1.0, abs(a[s])), f"step {s}: {a[s]} != {b[s]}"


def _copies(d: Path) -> list[str]:
    root = d / ".replicas"
    return sorted(f"{s.name}/{p.name}" for s in root.iterdir() for p in s.iterdir()) if root.is_dir() else []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_lost_disk_resumes_on_a_spare_and_on_fewer_nodes_from_buddy_copies(tmp_path: Path) -> None:
    n0, n1, n2, n3 = (tmp_path / f"node{i}" / "run" for i in range(4))

    # 3 nodes, saves after steps 3 and 7, cut after step 9: the uninterrupted reference up to step 9.
    _, ref = _nodes(tmp_path, [n0, n1, n2], {**BASE, "stop_after": 9}, "run")
    assert sorted(ref) == list(range(10))
    for d, prev in ((n0, 2), (n1, 0), (n2, 1)):
        assert _copies(d) == [f"step_00000004/part{prev}", f"step_00000008/part{prev}"], (d, _copies(d))
        manifest = json.loads((d / ".replicas" / "step_00000008" / f"part{prev}" / "REPLICA").read_text())
        assert manifest["marker"]["node"] == prev and any(f.endswith(".distcp") for f in manifest["files"])
    for d, buddy in ((n0, "node1"), (n1, "node2"), (n2, "node0")):   # step 4's copies were whole by save 8
        assert json.loads((d / "step_00000004" / "BUDDY").read_text())["copy_on"] == buddy

    # Node 1's disk is lost; node 2's copy of its newest part is damaged; a spare (node3) joins as node 2.
    shutil.rmtree(n1)
    bad = next((n2 / ".replicas" / "step_00000008" / "part1").glob("*.distcp"))
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    procs, spare = _nodes(tmp_path, [n0, n2, n3], {**BASE, "stop_after": 13}, "run")
    err = procs[0].stderr
    assert "the buddy copy of part 1 of step_00000008 on node 1 is not used" in err and "checksum mismatch" in err
    assert "resuming from step_00000004, put together from the nodes' parts and buddy copies" in err, err[-3000:]
    assert min(spare) == 4
    _close(ref, spare, range(4, 10))   # the same run as the uninterrupted one
    for d in (n0, n2, n3):   # keep-last-2 pruned the copies with their steps
        assert {c.split("/")[0] for c in _copies(d)} <= {"step_00000008", "step_00000012"}, (d, _copies(d))

    # The spare is lost too: the 2 survivors go on (3 ranks -> 2) from all parts of step 12, put together.
    shutil.rmtree(n3)
    procs, fewer = _nodes(tmp_path, [n0, n2], BASE, "run")
    err = procs[0].stderr
    assert "resuming from step_00000012, put together from the nodes' parts and buddy copies (all 3 parts" in err, \
        err[-3000:]
    assert sorted(fewer) == list(range(12, STEPS))
    _close(spare, fewer, range(12, 14), rel=1e-4)   # 2 ranks or 3, the same global batch: the same run
    marker = json.loads((n0 / "step_00000012" / "COMPLETE").read_text())
    assert marker["mode"] == "assembled" and marker["world_size"] == 3, marker   # a whole step, in one place


def test_the_plan_takes_the_newest_step_every_part_of_which_some_node_holds() -> None:
    def held(node: int, step: int, part: int, copy: bool = False, world: int = 3) -> Held:
        return Held(node=node, step=step, part=part, parts=3, world_size=world, ranks=(part,), copy=copy)

    # Same shape: node 1 (a survivor that held node 1's copy) and a spare as node 2.
    h = [held(0, 8, 0), held(1, 8, 2), held(1, 8, 1, copy=True), held(0, 8, 2, copy=True)]
    p = plan(h, [[0], [1], [2]])
    assert p is not None and p.step == 8 and p.same_shape
    assert p.moves == (Move(part=2, src=1, dst=2),)   # its own part before a copy
    assert p.copies_used == ((1, 1),)
    # A part nobody holds: the step before.
    h2 = [held(0, 12, 0), held(1, 12, 2), *h]
    assert plan(h2, [[0], [1], [2]]).step == 8   # type: ignore[union-attr]
    assert plan(h2, [[0], [1], [2]], newer_than=8) is None
    # Fewer nodes: every node needs every part.
    p = plan(h, [[0], [1]])
    assert p is not None and not p.same_shape and p.needs == ((0, 1, 2), (0, 1, 2))
    assert set(p.moves) == {Move(0, 0, 1), Move(1, 1, 0)}
    # Every node holds its own part: the ordinary resume.
    assert plan([held(0, 4, 0), held(1, 4, 1), held(2, 4, 2)], [[0], [1], [2]]).local   # type: ignore[union-attr]
    # DeepSpeed's format loads on its own world size only.
    ds = [Held(node=n, step=4, part=n, parts=3, world_size=3, ranks=(n,), engine="deepspeed") for n in range(3)]
    assert plan(ds, [[0], [1]]) is None
