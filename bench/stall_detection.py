"""How soon a hung run is found: detection latency minus the stall timeout (target <= 10 s).

    .venv/bin/python bench/stall_detection.py                  # stall timeouts 3, 6 and 10 s
    .venv/bin/python bench/stall_detection.py --timeouts 5 --nproc 2

A project on ``localhost`` (the process runtime: the real invoker, supervisor,
coordinator and torchrun, no SSH) runs the ``stall`` experiment: every rank
all-reduces each step and reports its progress; at step 3 rank 1 freezes in libc
``sleep`` (a C call that holds the GIL). For each stall timeout T it prints, from the
run's record: the last progress any rank reported, when the coordinator found the
stall (``stalled_at``), when the run had failed (``ended_at``); the figure is
``stalled_at - last progress - T`` (the baseline is T itself: a watchdog cannot fire
before it), and the failure the run ended with.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STALL = '''\
import ctypes
import time

from higgsfield.experiment import experiment, param


@experiment("stall", seed=0)
@param("steps", default=1000)
@param("freeze_rank", default=1)
@param("freeze_step", default=3)
def stall(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import init_distributed, progress

    init_distributed()
    t = torch.ones(1)
    for step in range(params.steps):
        if dist.get_rank() == params.freeze_rank and step == params.freeze_step:
            libc = ctypes.PyDLL(None)
            while True:
                libc.sleep(3600)   # holds the GIL; the stacks signal ends a sleep early: sleep again
        dist.all_reduce(t)
        progress(step)
        time.sleep(0.2)
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeouts", type=float, nargs="+", default=[3.0, 6.0, 10.0])
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hf-stallbench-"))
    proj, state = tmp / "benchstall", tmp / "state"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "stall.py").write_text(STALL)
    (proj / "higgsfield.yml").write_text(f"name: benchstall\nnodes:\n  - host: localhost\nnproc_per_node: {args.nproc}\n"
                                         f"runtime: process\nstate_dir: {state}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HIGGSFIELD_NO_PY_SPY": "1"}
    print(f"{'timeout':>8} {'detected after T':>17} {'failed after last progress':>27}  reason")
    worst = 0.0
    for i, timeout in enumerate(args.timeouts):
        run = f"stall-{i}"
        subprocess.run([sys.executable, "-m", "higgsfield", "run", "stall", "--stall-timeout", str(timeout),
                        "--run-name", run], cwd=proj, env=env, capture_output=True, text=True, timeout=600)
        rd = state / "runs" / "benchstall" / run
        rec = json.loads((rd / "run.json").read_text())
        last = max(float(p.read_text().split()[1]) for p in (rd / "progress").glob("rank*"))
        late = rec["stalled_at"] - last - timeout
        worst = max(worst, late)
        print(f"{timeout:>7.0f}s {late:>16.2f}s {rec['ended_at'] - last:>26.2f}s  {rec['reason'][:90]}")
    print(f"worst detection latency minus stall timeout: {worst:.2f}s (target <= 10 s)")


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"({time.monotonic() - t0:.0f}s in all)")
