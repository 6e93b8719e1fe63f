"""How soon a slow rank is named, and that a healthy run names no one (issue 33; targets: <= 20 steps, 0).

    .venv/bin/python bench/straggler.py                    # 1.3x and 2x, 5 runs each, then 1,000 healthy steps
    .venv/bin/python bench/straggler.py --factors 1.3 --runs 1 --healthy-steps 0
    .venv/bin/python bench/straggler.py --record DIR       # also keep each run's per-rank work reports (JSON)
    .venv/bin/python bench/straggler.py --overhead-only    # the probe's cost per step, on and off

A project on ``localhost`` (the process runtime: the real invoker, supervisor,
coordinator, gang wire and torchrun, no SSH) runs the ``slowrank`` experiment on
``--nproc`` ranks (4 by default, on this 2-core machine: the loaded bed). Every rank
does the same fixed work each step (``--work`` seconds: a fixed number of 128x128
matmuls, the rest a sleep), all-reduces and reports its step; from step
``--slow-from`` on, rank ``--nproc - 1`` does ``factor`` times that work. The figure is
the number of steps the run made between the slowdown and the coordinator naming the
rank (its record's ``stragglers``, ``at`` against rank 0's step timeline). A healthy run
of ``--healthy-steps`` steps must name no one.

The probe's own cost comes first (:func:`overhead`). The other half of issue 33's bench, the
cost of ``higgsfield profile``, is ``bench/profile_cost.py`` (item 2's; not ``profile.py``,
which would shadow the standard library's module).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = '''\
import os
import time

from higgsfield.experiment import experiment, param


@experiment("slowrank", seed=0)
@param("steps", default=60)
@param("work", default=0.2, description="seconds of own work per step")
@param("matmuls", default=20, description="128x128 matmuls in each step's work (the rest is a sleep)")
@param("slow_rank", default=-1)
@param("slow_from", default=30)
@param("factor", default=1.3)
def slowrank(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import init_distributed, progress

    init_distributed()
    rank = dist.get_rank()
    a, t = torch.randn(128, 128), torch.ones(4096)
    timeline = None
    if rank == 0:
        timeline = open(os.path.join(os.environ["HIGGSFIELD_RUN_DIR"], "timeline.txt"), "a", buffering=1)
    for step in range(1, params.steps + 1):
        f = params.factor if rank == params.slow_rank and step >= params.slow_from else 1.0
        t0 = time.perf_counter()
        for _ in range(int(params.matmuls * f)):
            a = torch.tanh(a @ a)
        time.sleep(max(0.0, params.work * f - (time.perf_counter() - t0)))
        dist.all_reduce(t)
        progress(step)
        if timeline is not None:
            timeline.write(f"{step} {time.time():.3f}\\n")
    print(f"slowrank: rank {rank} done", flush=True)
'''


def project(tmp: Path, nproc: int) -> tuple[Path, Path]:
    proj, state = tmp / "benchstraggler", tmp / "state"
    (proj / "src").mkdir(parents=True, exist_ok=True)
    (proj / "src" / "slowrank.py").write_text(JOB)
    (proj / "higgsfield.yml").write_text(f"name: benchstraggler\nnodes:\n  - host: localhost\nnproc_per_node: {nproc}\n"
                                         f"runtime: process\nstate_dir: {state}\n")
    return proj, state


def record_work(rd: Path, out: list[dict[str, float]], stop: threading.Event) -> None:
    """Every rank's work reports as the node reads them (what the recorded series of the tests are)."""
    sys.path.insert(0, str(ROOT))
    from higgsfield.contract.straggler import parse_work

    seen: dict[int, int] = {}
    while not stop.wait(0.25):
        for p in sorted((rd / "progress").glob("work*")):
            try:
                got = parse_work(int(p.name[4:]), p.read_bytes())
            except (OSError, ValueError):
                continue
            if got is not None and seen.get(got[0].rank) != got[0].step:
                w, at = got
                seen[w.rank] = w.step
                out.append({"rank": w.rank, "step": w.step, "steps": w.steps, "own_s": w.own_s,
                            "step_s": w.step_s, "at": at})


def one_run(proj: Path, state: Path, run: str, params: dict[str, object], record: Path | None) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HIGGSFIELD_NO_PY_SPY": "1"}
    rd = state / "runs" / "benchstraggler" / run
    series: list[dict[str, float]] = []
    stop = threading.Event()
    rec = threading.Thread(target=record_work, args=(rd, series, stop), daemon=True)
    rec.start()
    argv = [sys.executable, "-m", "higgsfield", "run", "slowrank", "--run-name", run]
    for k, v in params.items():
        argv += ["--param", f"{k}={v}"]
    r = subprocess.run(argv, cwd=proj, env=env, capture_output=True, text=True, timeout=1800)
    stop.set()
    rec.join()
    if r.returncode != 0:
        raise SystemExit(f"run {run} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    record_json = json.loads((rd / "run.json").read_text())
    timeline = read_timeline(rd)
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
        (record / f"{run}.json").write_text(json.dumps({"params": params, "series": series,
                                                        "stragglers": record_json.get("stragglers", [])}))
    return {"record": record_json, "timeline": timeline, "series": series}


def read_timeline(rd: Path) -> list[tuple[int, float]]:
    """Rank 0's ``timeline.txt`` in the run directory: (step, wall time it closed)."""
    return [(int(s), float(t)) for s, t in (ln.split() for ln in (rd / "timeline.txt").read_text().splitlines())]


def step_at(timeline: list[tuple[int, float]], at: float) -> int:
    """The step rank 0 had closed by ``at``."""
    return max((s for s, t in timeline if t <= at), default=0)


def detection(args: argparse.Namespace, proj: Path, state: Path) -> dict[float, list[int]]:
    delays: dict[float, list[int]] = {}
    slow = args.nproc - 1
    for factor in args.factors:
        for i in range(args.runs):
            run = f"slow{str(factor).replace('.', '')}-{i}-{int(time.time())}"
            got = one_run(proj, state, run, {"steps": args.slow_from + 40, "work": args.work, "matmuls": args.matmuls,
                                             "slow_rank": slow, "slow_from": args.slow_from, "factor": factor},
                          args.record)
            named = [s for s in got["record"].get("stragglers", []) if s["rank"] == slow]   # type: ignore[union-attr]
            others = [s for s in got["record"].get("stragglers", []) if s["rank"] != slow]  # type: ignore[union-attr]
            if not named:
                print(f"  {factor}x run {i}: rank {slow} NOT named", flush=True)
                delays.setdefault(factor, []).append(10**6)
                continue
            d = step_at(got["timeline"], named[0]["at"]) - args.slow_from  # type: ignore[arg-type]
            delays.setdefault(factor, []).append(d)
            print(f"  {factor}x run {i}: named after {d} steps (since step {named[0]['since_step']}, ratio "
                  f"{named[0]['ratio']}); others named: {len(others)}", flush=True)
    return delays


def healthy(args: argparse.Namespace, proj: Path, state: Path) -> tuple[int, float]:
    """False positives over ``--healthy-steps`` steps (the rule's ranks named, and the highest ratio seen)."""
    run = f"healthy-{int(time.time())}"
    got = one_run(proj, state, run, {"steps": args.healthy_steps, "work": args.work, "matmuls": args.matmuls},
                  args.record)
    named = got["record"].get("stragglers", [])  # type: ignore[union-attr]
    worst = _worst_ratio(got["series"])  # type: ignore[arg-type]
    return len(named), worst


def _worst_ratio(series: list[dict[str, float]]) -> float:
    """The highest own work / the other ranks' median seen in a recorded series (after 5 warm-up steps)."""
    sys.path.insert(0, str(ROOT))
    from higgsfield.contract.straggler import RankWork
    from higgsfield.node.gang.stragglers import StragglerRule

    rule, worst = StragglerRule(), 0.0
    for x in series:
        w = RankWork(rank=int(x["rank"]), step=int(x["step"]), steps=int(x["steps"]), own_s=x["own_s"],
                     step_s=x["step_s"])
        rule.report([w], x["at"])
        ratio = rule.ratio_of(w.rank)
        if ratio is not None and w.step > 10:
            worst = max(worst, ratio)
    return worst


def overhead(steps: int = 10, blocks: int = 24) -> tuple[float, float, float, float]:
    """The probe's cost in one process. (1) The sampler's own CPU: the process's CPU time over 2 s while the
    training thread sleeps, probe on less probe off. (2) A step of 200 matmuls plus a Python loop, timed with
    the probe sampling and without, in alternating blocks of ``steps`` (the machine's other load falls on
    both; the best block of each). (3) One ``step`` call while off. Returns (CPU % of one core, best step ms
    off, best step ms on, ns per call off)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from higgsfield._lib.straggler_probe import Probe

    torch.set_num_threads(1)
    a = torch.randn(128, 128)

    def step() -> None:
        nonlocal a
        for _ in range(200):
            a = torch.tanh(a @ a)
        sum(i * i for i in range(20000))

    def idle_cpu(probe: Probe | None) -> float:
        if probe is not None:
            probe.step(0)
        c0, t0 = time.process_time(), time.monotonic()
        while time.monotonic() - t0 < 2.0:
            time.sleep(0.05)
            if probe is not None:
                probe.step(int((time.monotonic() - t0) * 20) + 1)
        return (time.process_time() - c0) / (time.monotonic() - t0)

    best: dict[bool, float] = {False: float("inf"), True: float("inf")}
    with tempfile.TemporaryDirectory() as d:
        cpu_off = idle_cpu(None)
        on = Probe(run_dir=d, rank=1)
        cpu_on = idle_cpu(on)
        on.close()
        for b in range(blocks):
            sampling = b % 2 == 1
            probe = Probe(run_dir=d, rank=0) if sampling else None
            t0 = time.perf_counter()
            for i in range(steps):
                step()
                if probe is not None:
                    probe.step(i)
            best[sampling] = min(best[sampling], (time.perf_counter() - t0) / steps)
            if probe is not None:
                probe.close()
    off = Probe()
    off._off = True
    t0 = time.perf_counter()
    for i in range(100000):
        off.step(i)
    per_call = (time.perf_counter() - t0) / 100000 * 1e9
    return (cpu_on - cpu_off) * 100, best[False] * 1e3, best[True] * 1e3, per_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--factors", type=float, nargs="+", default=[1.3, 2.0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--healthy-steps", type=int, default=1000)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--work", type=float, default=0.2)
    ap.add_argument("--matmuls", type=int, default=400)
    ap.add_argument("--slow-from", type=int, default=30)
    ap.add_argument("--record", type=Path, default=None)
    ap.add_argument("--overhead-only", action="store_true")
    args = ap.parse_args()
    cpu, off_ms, on_ms, per_call = overhead()
    print(f"probe overhead: the sampler takes {cpu:.2f}% of a core; best step {off_ms:.2f} ms off, {on_ms:.2f} ms on "
          f"({(on_ms / off_ms - 1) * 100:+.2f}%); {per_call:.0f} ns per step() while off", flush=True)
    if args.overhead_only:
        return
    tmp = Path(tempfile.mkdtemp(prefix="hf-stragglerbench-"))
    proj, state = project(tmp, args.nproc)
    print(f"{args.nproc} ranks on localhost (process runtime), {args.work}s of own work per step "
          f"({args.matmuls} matmuls), slowdown at step {args.slow_from}", flush=True)
    delays = detection(args, proj, state)
    for factor, ds in delays.items():
        print(f"{factor}x: median {statistics.median(ds)} steps over {len(ds)} runs {sorted(ds)} (target <= 20)")
    if args.healthy_steps:
        n, worst = healthy(args, proj, state)
        print(f"healthy: {n} rank(s) named over {args.healthy_steps} steps (target 0); highest ratio seen {worst:.3f}")


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"({time.monotonic() - t0:.0f}s in all)")
