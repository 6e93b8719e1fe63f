"""``Llama(diloco=DiLoCo(...))``: nodes that meet every H steps (torchft's DiLoCo over our own node groups).

Two launches of 2 torchrun agents x 2 ranks on this machine (each agent a "node" with its own
GROUP_RANK and its own checkpoint directory, as in test_hybrid_sharding.py: the ranks of an agent
form one node's mesh row, and the nodes' traffic goes over TCP between the agents; what no test here
can show is a slow link, which bench/slow_link.py throttles for real on the test bed):

1. tiny_llama with DiLoCo (H=5, int8 pseudo-gradients) for 30 steps: it converges on the shipped
   data; its metrics carry cross-node bytes on the outer steps only; a worker of node 1 dies after
   step 11 and torchrun restarts both nodes, which resume from the save after step 6 (2 inner steps
   into an outer loop) and repeat the first attempt's losses (rel 1e-5) through the outer step after
   step 9, which needs the restored global weights and outer momentum.
2. ``diloco_equiv.py``: H=1, outer lr 1, no momentum, inner SGD equals hybrid data parallelism.

The fast tests: the options' one-line refusals (in-process, and through the real worker entrypoint:
exit 2, no traceback) and the int8 code.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainutil import LAUNCH, ROOT, finish_two_nodes, free_port, losses, ok, start_two_nodes

from higgsfield._lib import diloco, diloco_quant
from higgsfield._lib.diloco import DiLoCo, DiLoCoError

EVERY, CKPT, CRASH, STEPS = 5, 7, 12, 30


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_diloco_converges_meters_its_bytes_and_resumes_mid_outer_loop(tmp_path: Path) -> None:
    params = {"steps": STEPS, "checkpoint_every": CKPT, "precision": "fp32", "diloco_every": EVERY,
              "diloco_quantize": "int8", "crash_at": CRASH}
    procs, lines = finish_two_nodes(*start_two_nodes(tmp_path, params, "dl", max_restarts=1))
    for p in procs:
        ok(p)
    want = ("higgsfield: DiLoCo across 2 nodes: FSDP within each node's 2 ranks, an outer step every 5 steps "
            "(outer lr 0.7, Nesterov momentum 0.9, int8 pseudo-gradients)")
    assert want in procs[0].stderr, procs[0].stderr[-3000:]
    first = {m["step"]: m for m in lines if m["attempt"] == 0}
    again = {m["step"]: m for m in lines if m["attempt"] == 1}
    # node 0 may finish step 12 before node 1's worker dies there: inner steps wait on no other node
    assert sorted(first)[:CRASH] == list(range(CRASH)) and sorted(again) == list(range(CKPT, STEPS)), (first, again)
    for s in range(CKPT, CRASH):   # steps 7, 8 inner; 9 the outer step; 10, 11 from the new global weights
        assert math.isclose(first[s]["loss"], again[s]["loss"], rel_tol=1e-5), (s, first[s], again[s])
    loss = losses(lines)
    windows = [sum(loss[s] for s in range(w, w + EVERY)) / EVERY for w in range(0, STEPS, EVERY)]
    assert windows[-1] < 0.85 * windows[0] and windows[-1] < windows[2] < windows[0], (windows, loss)
    for s, m in again.items():   # bytes cross the network on the outer steps only
        outer = (s + 1) % EVERY == 0
        assert (m["cross_node_bytes"] > 0) == outer, (s, m)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_h1_without_momentum_equals_data_parallelism(tmp_path: Path) -> None:
    out = tmp_path / "equiv.json"
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(LAUNCH.parent / "diloco_equiv.py"), str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: S603
                                      text=True, start_new_session=True))
    done, _ = finish_two_nodes(procs, tmp_path / "none.jsonl", timeout=240)
    for p in done:
        ok(p)
    got = json.loads(out.read_text())
    plain, per_rank = got["plain"], got["diloco"]
    assert per_rank[0] == per_rank[1] and per_rank[2] == per_rank[3]   # a node's ranks report its loss
    assert per_rank[0] != per_rank[2]                                  # the nodes trained on their own rows
    for s, want in enumerate(plain):
        mean = (per_rank[0][s] + per_rank[2][s]) / 2   # equal tokens per node: the global mean
        assert math.isclose(mean, want, rel_tol=1e-5), (s, mean, want, got)
    assert plain[-1] < plain[0]


# -- the options, refused in one line ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "match"), [
    ({"every": 0}, r"every \(H, inner steps between outer steps\) must be a whole number of at least 1, got 0"),
    ({"every": -3}, r"at least 1, got -3"),
    ({"every": 2.5}, r"at least 1, got 2.5"),
    ({"quantize": "int4"}, r"unknown quantize 'int4': choose None \(fp32\), 'bf16' or 'int8'"),
    ({"outer_lr": 0.0}, r"outer_lr must be positive"),
    ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
])
def test_bad_options_are_one_line(kw, match):
    with pytest.raises(DiLoCoError, match=match) as err:
        DiLoCo(**kw)
    assert "\n" not in str(err.value) and isinstance(err.value, ValueError) and err.value.exit_code == 2


@pytest.mark.parametrize(("args", "match"), [
    (("full", "fsdp", 3), r"use sharding='hybrid' \(or 'auto'\) with it, not 'full'"),
    (("hybrid", "deepspeed", 3), r"DiLoCo runs with engine='fsdp'"),
    (("auto", "fsdp", 0), r"use zero_stage=2 or 3, not 0"),
])
def test_diloco_with_what_it_cannot_go_with_is_one_line(args, match):
    with pytest.raises(DiLoCoError, match=match):
        diloco.check_with(DiLoCo(), *args)
    assert diloco.check_with(DiLoCo(), "auto", "fsdp", 3) == "hybrid"
    assert diloco.check_with(None, "full", "fsdp", 3) == "full"
    with pytest.raises(DiLoCoError, match=r"DiLoCo needs 2 nodes or more and this run has 1: leave diloco out"):
        diloco.check_nodes(DiLoCo(), (1, 4))
    diloco.check_nodes(DiLoCo(), (2, 4))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bad_options_exit_2_in_one_line_through_the_worker_entrypoint(tmp_path: Path) -> None:
    """H < 1, an unknown quantization and DiLoCo on one node, each as a rank of a run meets it (the node's
    entrypoint, one process), concurrently: exit 2, one ``error:`` line naming the option, no traceback."""
    cases = {"h0": {"diloco_every": -1}, "mode": {"diloco_every": 5, "diloco_quantize": "int4"},
             "one": {"diloco_every": 5, "steps": 2}}
    procs = {}
    for name, params in cases.items():
        rd = tmp_path / name
        (rd / "logs").mkdir(parents=True)
        (rd / "spec.json").write_text(json.dumps({
            "project": "p", "experiment": "tiny_llama", "run": name, "module": "tiny_llama", "code_dir": str(ROOT),
            "params": {**{k: str(v) for k, v in params.items()}, "hidden": "32", "layers": "1"}, "version": 1,
            "node": "localhost", "node_rank": 0, "nodes": ["localhost"], "master_addr": "127.0.0.1",
            "submitted_at": 0}))
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(OMP_NUM_THREADS="1", HIGGSFIELD_CHECKPOINT_DIR=str(rd / "ckpt"))
        procs[name] = subprocess.Popen([sys.executable, "-m", "higgsfield.node.entrypoint", str(rd)], env=env)  # noqa: S603
    want = {"h0": "DiLoCo: every (H, inner steps between outer steps) must be a whole number of at least 1, got -1",
            "mode": "DiLoCo: unknown quantize 'int4'",
            "one": "DiLoCo needs 2 nodes or more and this run has 1"}
    for name, p in procs.items():
        assert p.wait(timeout=100) == 2, name
        log = (tmp_path / name / "logs" / "rank0.log").read_text()
        errors = [ln for ln in log.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and want[name] in errors[0], log[-2000:]
        assert "Traceback" not in log, log[-2000:]
        record = json.loads((tmp_path / name / "logs" / "rank0.error.json").read_text())
        assert record["code"] == 2 and want[name] in record["error"], record


# -- the int8 pseudo-gradient -----------------------------------------------------------------------------------


def test_int8_keeps_each_value_within_half_a_step_of_its_block():
    t = torch.randn(3000) * torch.linspace(0.01, 10, 3000)
    t[2000:2100] = 0.0
    q, scale = diloco_quant.quantize_int8(t)
    assert q.dtype == torch.int8 and q.numel() == t.numel() and scale.numel() == 3
    back = diloco_quant.dequantize_int8(q, scale, t.numel())
    step = scale.repeat_interleave(diloco_quant.BLOCK)[: t.numel()]
    assert torch.all((back - t).abs() <= step / 2 + 1e-6)
    zeros = diloco_quant.dequantize_int8(*diloco_quant.quantize_int8(torch.zeros(5)), 5)
    assert torch.equal(zeros, torch.zeros(5))
    assert q.numel() + 4 * scale.numel() < 1.01 * t.numel()   # a quarter of fp32's 4 bytes a value, and 0.4 %


# -- the step metrics: what the dashboard and `higgsfield metrics` read ---------------------------------------------


def test_step_metrics_carry_the_cross_node_bytes_and_time(single_rank, monkeypatch, tmp_path):
    from higgsfield._lib import comm_meter
    from higgsfield.metrics import METRICS_FILE, StepMetrics, decode_line, point
    from higgsfield.node.observe.metrics import read_metrics
    from higgsfield.node.state.home import NodeState
    from higgsfield.node.state.records import RunDir
    from higgsfield.training import StepTimer

    for key, value in (("armed", False), ("bytes", 0), ("seconds", 0.0)):
        monkeypatch.setitem(comm_meter._state, key, value)
    timer = StepTimer(log=None)
    quiet = timer.step(0, 2.0, 10)
    assert quiet.cross_node_bytes is None and quiet.comm_s is None   # nothing metered: no figure, not 0
    comm_meter.arm()
    comm_meter.add(1_500_000, 0.25)
    m = timer.step(1, 2.0, 10)
    assert (m.cross_node_bytes, m.comm_s) == (1_500_000.0, 0.25)      # x the world size (1 here)
    assert "cross-node 1.5 MB in 0.25 s" in str(m)
    assert timer.step(2, 2.0, 10).cross_node_bytes == 0              # an inner step: none
    back = decode_line(m.to_json())
    assert (back.cross_node_bytes, back.comm_s) == (1_500_000.0, 0.25)
    rd = RunDir(NodeState(tmp_path), "p", "r")   # the node's reader, what `metrics` and the dashboard get
    rd.make()
    (rd.path / METRICS_FILE).write_text(m.to_json() + "\n")
    (read,) = [x for x in read_metrics(rd) if isinstance(x, StepMetrics)]
    assert point(read)["cross_node_bytes"] == 1_500_000.0 and point(read)["comm_s"] == 0.25
