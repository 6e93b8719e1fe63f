"""``higgsfield profile``: what a profile costs the run, and how long until the traces are on the laptop.

    .venv/bin/python bench/profile_cost.py                  # 4 ranks on localhost, 3 profiles of 5 steps
    .venv/bin/python bench/profile_cost.py --rounds 5 --steps 3

A ``localhost`` node (process runtime, no SSH: the node side, the ranks and the fetch are the
real ones) runs 4 ranks of a small MLP trained with ``StepTimer`` (tokens/s per step in
``metrics.jsonl``) and a gradient all_reduce each step. While it trains, ``higgsfield profile
RUN --steps S`` is timed ``--rounds`` times, from the command's start to its exit (CLI start,
the request, each rank reaching a step boundary, S steps, the traces written, fetched, merged
and summarized). Then the run is stopped by a gate file and its metrics read back:

- tokens/s of the unarmed steps against the armed ones (the profiled steps but their first and
  last: the profiler's start and the trace export land there, reported apart as a one-time cost);
- the wall time of each ``profile`` and that time less the S profiled steps (target <= 10 s).

Rank 0's figures: every rank's step lasts as long as the slowest's (the all_reduce).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

MLP = '''
import os
from pathlib import Path

from higgsfield.experiment import experiment, param


@experiment("mlp", seed=0)
@param("width", default=384)
@param("batch", default=128)
def mlp(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import StepTimer, init_distributed

    init_distributed()
    model = torch.nn.Sequential(torch.nn.Linear(params.width, 4 * params.width), torch.nn.GELU(),
                                torch.nn.Linear(4 * params.width, params.width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timer = StepTimer(optimizer=opt)
    gate = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / "enough"
    step = 0
    while True:
        x = torch.randn(params.batch, params.width)
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        timer.step(step, loss, params.batch)
        stop = torch.tensor([float(gate.exists())])
        dist.all_reduce(stop)
        if stop.item() > 0:
            return
        step += 1
'''


def hf(proj: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=proj, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def metrics(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        out[int(m["step"])] = float(m["tokens_per_s"])
    return out


def wait_step(run_dir: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if max(metrics(run_dir), default=-1) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"the run did not reach step {step}")


def main() -> None:
    from helpers_project import local_project

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=4)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    proj = local_project(base, "benchprof", {"mlp.py": MLP}, nproc=args.nproc)
    run = "prof-bench"
    run_dir = base / "state" / "runs" / "benchprof" / run
    r = hf(proj, "run", "mlp", "--run-name", run, "-d")
    if r.returncode:
        raise SystemExit(r.stderr)
    walls: list[float] = []
    windows: list[list[int]] = []
    try:
        wait_step(run_dir, 20)
        for i in range(args.rounds):
            t0 = time.monotonic()
            r = hf(proj, "profile", run, "--steps", str(args.steps), "--out", str(base / f"p{i}"))
            walls.append(time.monotonic() - t0)
            if r.returncode:
                raise SystemExit(r.stderr)
            traces = sorted((base / f"p{i}").glob("rank*.trace.json"))
            assert len(traces) == args.nproc, traces
            ids = sorted(p.parent.name for p in (run_dir / "profile").glob("*/rank0.done.json"))
            done = run_dir / "profile" / ids[-1] / "rank0.done.json"
            windows.append(json.loads(done.read_text())["steps"])
            wait_step(run_dir, max(windows[-1]) + 15)
    finally:
        (run_dir / "enough").write_text("")   # the ranks agree to stop at their next step
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run_dir / "logs" / "rank0.done").exists():
        time.sleep(0.3)
    tps = metrics(run_dir)
    armed = {s for w in windows for s in w}
    edges = {min(w) - 1 for w in windows} | {max(w) for w in windows}   # profiler start, trace export
    inner = [tps[s] for s in armed - edges if s in tps]
    idle = [v for s, v in tps.items() if s >= 5 and s not in armed and s not in edges]
    step_s = statistics.median(1 / v for v in idle) * 128 * args.nproc if idle else 0.0
    edge_s = [128 * args.nproc / tps[s] - step_s for s in sorted(edges) if s in tps]
    print(f"{args.nproc} ranks on localhost, {args.rounds} profiles of {args.steps} steps; "
          f"machine load {os.getloadavg()[0]:.1f}")
    print(f"tokens/s unarmed (median of {len(idle)} steps): {statistics.median(idle):,.0f}")
    print(f"tokens/s armed   (median of {len(inner)} steps): {statistics.median(inner):,.0f}  "
          f"ratio {statistics.median(inner) / statistics.median(idle):.2f}")
    print(f"profiler start and trace export: {statistics.median(edge_s) * 1000:+.0f} ms on a step (median of "
          f"{len(edge_s)}; unarmed step {step_s * 1000:.1f} ms)")
    print("higgsfield profile wall: " + ", ".join(f"{w:.1f}s" for w in walls)
          + f"; less the profiled steps: median {statistics.median(w - args.steps * step_s for w in walls):.1f}s"
          + " (target <= 10 s)")


if __name__ == "__main__":
    main()
