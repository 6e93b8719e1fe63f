"""How long ``higgsfield --help`` takes to start, next to a bare ``python -c pass``.

The control-side CLI must feel instant on a laptop, so it imports neither torch
nor pydantic/rich/asyncssh for ``--help`` (see higgsfield/control/cli/__init__.py). This
times the console script of the venv that runs this file, best and median of
N runs after a warm-up, and the bare interpreter start as a baseline, so the
figure can be read as a ratio on any machine. Target: best <= 0.15 s.

    .venv/bin/python bench/cli_start.py            # exit 1 when over the target
    .venv/bin/python bench/cli_start.py --runs 20 --target 0.2
    .venv/bin/python bench/cli_start.py --against /tmp/before   # and a tree of another commit, same venv

``--against DIR`` also times ``python -m higgsfield --help`` with DIR (a checkout, e.g.
``git worktree add /tmp/before COMMIT``) first on ``PYTHONPATH`` and this checkout the same
way, runs alternating, so a change to the package's layout is compared with what it
replaced on the same interpreter, dependencies and load.

When it is slow, see what is imported and what it costs:

    .venv/bin/python -X importtime -c "from higgsfield.control.cli import main; main(['--help'])" 2>&1 | sort -t'|' -k2 -n | tail
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def time_command(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of ``runs`` executions of ``argv`` after one untimed warm-up.

    CPU time (user + system of the child) barely moves when other jobs share the
    machine, so it is the figure to compare across runs on a busy box.
    """
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.15, help="seconds the best run may take")
    ap.add_argument("--against", type=Path, help="another checkout to compare `python -m higgsfield --help` with")
    args = ap.parse_args(argv)
    if args.against is not None:
        return compare(args.against, args.runs)

    script = Path(sys.executable).parent / "higgsfield"
    if not script.exists():
        print(f"{script} not found: install the package in this venv (pip install -e .)", file=sys.stderr)
        return 2
    cli, cli_cpu = time_command([str(script), "--help"], args.runs)
    bare, bare_cpu = time_command([sys.executable, "-c", "pass"], args.runs)

    best, median = min(cli), statistics.median(cli)
    bare_best, bare_median = min(bare), statistics.median(bare)
    print(f"higgsfield --help   best {best:.3f} s   median {median:.3f} s   cpu {min(cli_cpu):.3f} s   "
          f"({args.runs} runs, {script})")
    print(f"python -c pass      best {bare_best:.3f} s   median {bare_median:.3f} s   cpu {min(bare_cpu):.3f} s")
    print(f"ratio (best)        {best / bare_best:.1f}x bare interpreter start; "
          f"overhead {best - bare_best:.3f} s")
    ok = best <= args.target
    print(f"target              best <= {args.target:.2f} s: {'ok' if ok else 'SLOW'}")
    return 0 if ok else 1


def compare(other: Path, runs: int) -> int:
    """``python -m higgsfield --help`` from ``other`` and from this checkout, alternating rounds."""
    here = Path(__file__).resolve().parents[1]
    trees = {"against": other.resolve(), "this checkout": here}
    wall: dict[str, list[float]] = {k: [] for k in trees}
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(runs):
        for name, root in trees.items():
            w, c = _module_help(root)
            wall[name] += w
            cpu[name] += c
    base = min(cpu["against"])
    for name, root in trees.items():
        print(f"{name:14s} best {min(wall[name]):.3f} s   median {statistics.median(wall[name]):.3f} s   "
              f"cpu best {min(cpu[name]):.3f} s   cpu ratio {min(cpu[name]) / base:.2f}   ({root})")
    return 0


def _module_help(root: Path) -> tuple[list[float], list[float]]:
    import os

    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "higgsfield", "--help"]
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [wall], [after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime]


if __name__ == "__main__":
    sys.exit(main())
