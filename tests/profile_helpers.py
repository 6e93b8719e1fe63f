"""The experiment ``higgsfield profile`` is tested on, and what its losses must be.

``steps`` trains a ``Linear(32, 32)`` with SGD, all-reducing its gradients each step (gloo), until
``steps`` or until the file ``RUN_DIR/<gate>`` exists (every node's: the ranks must agree), and
reports ``higgsfield.training.progress(step)`` as a loop without a StepTimer must; every rank draws
the same batches, so the summed gradient is ``world_size`` times one rank's and :func:`expected_losses`
computes the run's losses in this process: profiling must leave them as they are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

STEPS = '''
import os
import time
from pathlib import Path

from higgsfield.experiment import experiment, param


@experiment("steps", seed=0)
@param("steps", default=60)
@param("step_sleep", default=0.1)
@param("gate", default="")
def steps(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import init_distributed, progress

    init_distributed()
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    for step in range(params.steps):
        loss = model(torch.randn(16, 32, generator=g)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        progress(step)
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if params.gate:   # the test's switch, agreed by every rank (one all_reduce), so all stop at one step
            stop = torch.tensor([float((Path(os.environ["HIGGSFIELD_RUN_DIR"]) / params.gate).exists())])
            dist.all_reduce(stop)
            if stop.item() > 0:
                return
        time.sleep(params.step_sleep)
'''

LOSS = re.compile(r"step (\d+) loss ([-\d.e]+)")


def expected_losses(world: int, steps: int) -> list[float]:
    """The losses of ``steps`` on ``world`` ranks, computed here (every rank's batches are the same)."""
    import torch

    from higgsfield.experiment import seed_everything

    seed_everything(0)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        loss = model(torch.randn(16, 32, generator=g)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            p.grad.mul_(world)
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def losses(text: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in LOSS.finditer(text)}


def check_traces(dest: Path, ranks: list[int], steps: int) -> dict[str, Any]:
    """Each rank's Chrome trace in ``dest`` holds ``steps`` ProfilerStep ranges; the merged timeline holds every
    rank as a named process; returns the merged trace."""
    for r in ranks:
        trace = json.loads((dest / f"rank{r}.trace.json").read_text())
        names = [e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        assert len(names) == steps, (r, names)
        assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])
    merged = json.loads((dest / "merged.trace.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    for r in ranks:
        assert any(n.endswith(f" rank {r}") for n in procs.values()), procs
    return dict(merged)
