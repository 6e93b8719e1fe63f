"""``higgsfield stacks`` wall time: every rank's stack of a live run, on 2 nodes and on 8 (2 ranks each).

The issue's budget: 16 ranks on 8 nodes within 5 s. A run of a probe whose ranks sleep
in a named function is started (``run --detach``) and, once every rank printed that it
is up, ``higgsfield stacks RUN --json`` is timed from the command's start to its exit
(the CLI's own start, the SSH connections, each node's ``invoker stacks`` signalling its
ranks and reading their dumps, all nodes at once). Each result is checked: every rank
is there, its main thread in the probe's function. Then the run is killed.

    .venv/bin/python bench/stacks_wall.py                    # Docker runtime, 3 rounds on 2 and on 8 nodes
    .venv/bin/python bench/stacks_wall.py --quick            # 1 round
    .venv/bin/python bench/stacks_wall.py --runtime process  # plain processes (deploy builds a venv per node)

Needs root and the test bed (``make testbed``); uses hosts hfnode30..37 (``bench/_bed.py``)
and stops their sshd at the end. Exit status 1 when 8 nodes miss the budget.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import time
from pathlib import Path

import _bed

PROJECT = "bench_stacks"
NODES = 8
NPROC = 2
BUDGET_S = 5.0
PROBE = '''\
"""Every rank says it is up, then waits in wait_here (where its stack is taken)."""
import time

from higgsfield.experiment import experiment


def wait_here():
    time.sleep(3600)


@experiment("stacks_probe")
def stacks_probe(params):
    print(f"rank-up {params.rank}", flush=True)
    wait_here()
'''
UP = re.compile(r"^rank-up (\d+)$", re.M)


def _up(project: _bed.Project, hosts: list, run: str, nodes: int, timeout: float) -> None:
    want = set(range(nodes * NPROC))
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        seen.clear()
        for h in hosts[:nodes]:
            for log in (project.run_dir(h, run) / "logs").glob("rank*.log"):
                try:
                    seen.update(int(m.group(1)) for m in UP.finditer(log.read_text(errors="replace")))
                except OSError:
                    continue
        if seen >= want:
            return
        time.sleep(0.2)
    raise _bed.BenchError(f"run {run}: ranks {sorted(want - seen)} not up after {timeout:g}s")


def _check(out: str, nodes: int) -> None:
    got = json.loads(out)
    ranks = sorted(s["rank"] for s in got)
    if ranks != list(range(nodes * NPROC)):
        raise _bed.BenchError(f"stacks on {nodes} node(s) named ranks {ranks}")
    for s in got:
        main = next((t for t in s["threads"] if t["name"] == "MainThread"), None)
        if main is None or not any(f["function"] == "wait_here" for f in main["frames"]):
            raise _bed.BenchError(f"rank {s['node']}/{s['rank']} is not in wait_here: {main}")


def measure(project: _bed.Project, hosts: list, nodes: int, rounds: int, timeout: float) -> list[float]:
    run = f"st{nodes}-{secrets.token_hex(3)}"
    project.hf("run", "stacks_probe", "--detach", "--nodes", str(nodes), "--run-name", run,
               "--stall-timeout", "0", timeout=timeout)
    try:
        _up(project, hosts, run, nodes, timeout)
        project.hf("stacks", run, "--json", timeout=60)   # warm: page cache, the invoker's imports
        walls = []
        for i in range(rounds):
            r = project.hf("stacks", run, "--json", timeout=60)
            _check(r.out, nodes)
            walls.append(r.seconds)
            _bed.say(f"{nodes} node(s), {nodes * NPROC} ranks: round {i + 1}: {r.seconds:.2f}s")
        return walls
    finally:
        project.hf("kill", run, timeout=120, check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round")
    ap.add_argument("--runtime", choices=["docker", "process"], default="docker")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a launch may take")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    results: dict[int, list[float]] = {}
    project: _bed.Project | None = None
    try:
        with _bed.bench_hosts(NODES) as hosts:
            project = _bed.Project(PROJECT, hosts, runtime=args.runtime, nproc=NPROC,
                                   sources={"stacks_probe.py": PROBE},
                                   requirements=_bed.requirements_for(args.runtime))
            _bed.first_setup(project)
            r = project.hf("deploy", timeout=1500)
            _bed.say(f"deploy: {r.seconds:.1f}s")
            for n in (2, NODES):
                results[n] = measure(project, hosts, n, rounds, args.timeout)
    except _bed.BenchError as e:
        print(f"stacks_wall: error: {e}", file=sys.stderr)
        return 2
    finally:
        if project is not None:
            project.remove()
    print(f"\nhiggsfield stacks RUN --json, runtime {args.runtime}, {NPROC} ranks per node, median of {rounds} "
          f"(load average {_bed.load_average()}; {Path('/proc/cpuinfo').read_text().count('processor')} cores)")
    rows = [[n, n * NPROC, f"{_bed.median(w):.2f} s", f"{max(w):.2f} s"] for n, w in results.items()]
    print(_bed.table(["nodes", "ranks", "median", "max"], rows))
    worst = max(results[NODES])
    ok = worst <= BUDGET_S
    print(f"{NODES} nodes, {NODES * NPROC} ranks: worst {worst:.2f} s (budget <= {BUDGET_S:g} s): "
          f"{'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
