"""Cost of progress reporting (``higgsfield.training.progress``, called by ``StepTimer.step`` on every rank).

    .venv/bin/python bench/progress_overhead.py                 # tokens/s on vs off, and ns per call
    .venv/bin/python bench/progress_overhead.py --rounds 7 --steps 400

One process trains a small MLP (a few ms a step on CPU: short steps make any
overhead show) with ``StepTimer`` timing every step, alternating short rounds with progress
on (``HIGGSFIELD_RUN_DIR`` set: the file is written at most once a second) and off
(outside a run: the call returns at once), so noise from other work hits both alike.
Prints median tokens/s of each and the median ratio on/off of adjacent rounds
(target >= 0.99), then the cost
of one ``progress()`` call in each mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()

    import torch

    from higgsfield import training

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width)
    run_dir = tempfile.mkdtemp(prefix="hf-progress-")

    def mode(on: bool) -> None:
        training._progress = training._Progress()
        if on:
            os.environ["HIGGSFIELD_RUN_DIR"] = run_dir
            os.environ["RANK"] = "0"
        else:
            os.environ.pop("HIGGSFIELD_RUN_DIR", None)

    def round_(on: bool) -> float:
        mode(on)
        timer = training.StepTimer(log=None)
        t0 = time.perf_counter()
        for step in range(args.steps):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            timer.step(step, loss, args.batch)
        return args.steps * args.batch / (time.perf_counter() - t0)

    round_(False)   # warm-up
    rates: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for i in range(args.rounds):   # adjacent pairs, the order alternating: each ratio sees the same noise
        pair = {}
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            pair[on] = round_(on)
            rates[on].append(pair[on])
        ratios.append(pair[True] / pair[False])
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"tokens/s  progress on: {on:,.0f}   off: {off:,.0f}   "
          f"ratio on/off (median of {len(ratios)} adjacent pairs): {statistics.median(ratios):.4f}  (target >= 0.99)")

    step_s = args.batch / off
    for label, enabled in (("on", True), ("off", False)):
        mode(enabled)
        n = 200_000
        t0 = time.perf_counter()
        for step in range(n):
            training.progress(step)
        call = (time.perf_counter() - t0) / n
        print(f"progress() call, {label}: {call * 1e9:.0f} ns = {call / step_s:.5%} of a {step_s * 1e3:.2f} ms step")
    written = Path(run_dir, "progress", "rank0").read_text().split()
    print(f"progress file: step {written[0]} at {written[1]}")


if __name__ == "__main__":
    main()
