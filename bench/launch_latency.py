"""Launch latency: from ``higgsfield run --detach`` to every rank started, on 1 node and on 8.

A tiny experiment whose ranks print ``rank-started <time.time()>`` as their first act
(no torch work: the time is what launching costs, not training). The clock is this
machine's on both sides (the test-bed nodes are local users), so
``max(rank start) - t(command started)`` is exact. Per node count the script also
reports where the time goes, from the nodes' own run records (read from disk):

- CLI returned: ``run --detach`` exited (every node accepted the run);
- node records: the last node wrote its run record (its invoker's ``start`` ran);
- runtime up: the last node's torchrun (``runtime: process``) or container (``docker``) started;
- all ranks: the last rank printed its start line;
- run CPU: CPU seconds of the run's processes on all nodes (torchrun, the container's
  launcher, the ranks; sampled from /proc), and that divided by this machine's cores:
  the least time the launch can take here, however concurrent the fan-out.

Target: all-ranks(8) / all-ranks(1) <= 1.3. The eight nodes share this machine's CPU
(2 cores here), so every per-node cost that is CPU (python start-up, torchrun, a
container) is paid eight times over on two cores; the CLI and record columns show
the control side's share, which a real cluster would not multiply.

    .venv/bin/python bench/launch_latency.py                    # runtime process, 3 rounds of 1 vs 8 nodes
    .venv/bin/python bench/launch_latency.py --quick            # 1 round
    .venv/bin/python bench/launch_latency.py --runtime docker   # a container per node instead

The first run on this machine builds each node's project venv (deploy; torch from
the machine's CPU wheel, about 2 minutes and 0.9 GB per node); later runs reuse it.

Needs root and the test bed (``make testbed``); uses hosts hfnode30..37 and stops their
sshd at the end. Exit status 1 when the ratio misses its target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import _bed

PROJECT = "bench_runs"  # shared with log_stream.py: one project venv / image per node
NODES = 8
TARGET_RATIO = 1.3
TERMINAL = ("succeeded", "failed", "killed")
PROBE = '''\
"""Prints when the rank started (a UNIX time), then ends: the launch, without training."""
import time

from higgsfield.experiment import experiment


@experiment("launch_probe")
def launch_probe(params):
    print(f"rank-started {time.time():.6f} rank={params.rank}", flush=True)
    time.sleep(1.0)  # lets the bench's CPU sampler see the processes' last CPU ticks
'''
STARTED = re.compile(r"^rank-started (\d+\.\d+) rank=(\d+)$", re.M)


@dataclass
class Launch:
    nodes: int
    cli: float          # run --detach returned
    records: float      # the last node's run record was created
    runtime: float      # the last node's torchrun / container started
    ranks: float        # the last rank started
    first_rank: float
    cpu: float          # CPU seconds of the run's processes (torchrun, launcher, ranks), all nodes


class CPUSampler:
    """CPU seconds used by one run's processes on every node (those whose environment names its run dir).

    Sampled from /proc every 0.1 s (root sees every user's processes, also inside
    containers): each process's own utime + stime at its last sample. Shows whether
    a launch is bound by the CPU its nodes share on this machine.
    """

    def __init__(self, project: str, run: str) -> None:
        self._needle = f"/runs/{project}/{run}".encode()
        self._ticks: dict[int, int] = {}
        self._skip: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _ours(self, pid: int) -> bool:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return any(e.startswith(b"HIGGSFIELD_RUN_DIR=") and e.endswith(self._needle) for e in env.split(b"\0"))

    def _loop(self) -> None:
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) in self._skip:
                    continue
                pid = int(entry)
                if pid not in self._ticks and not self._ours(pid):
                    self._skip.add(pid)
                    continue
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                self._ticks[pid] = max(self._ticks.get(pid, 0), int(fields[11]) + int(fields[12]))
            self._stop.wait(0.1)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=10)
        return sum(self._ticks.values()) / os.sysconf("SC_CLK_TCK")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def launch_once(project: _bed.Project, hosts: list, nodes: int, nproc: int, timeout: float) -> Launch:
    run = f"lp{nodes}-{secrets.token_hex(3)}"
    sampler = CPUSampler(project.name, run)
    t0 = time.time()
    try:
        project.hf("run", "launch_probe", "--detach", "--nodes", str(nodes), "--run-name", run, timeout=timeout)
        return _wait(project, hosts, run, nodes, nproc, timeout, t0, sampler)
    finally:
        sampler.stop()


def _wait(project: _bed.Project, hosts: list, run: str, nodes: int, nproc: int, timeout: float, t0: float,
          sampler: CPUSampler) -> Launch:
    cli = time.time() - t0  # run --detach has returned by now
    dirs = [project.run_dir(h, run) for h in hosts[:nodes]]
    want = nodes * nproc
    deadline = time.monotonic() + timeout
    starts: dict[int, float] = {}
    records: list[dict] = []
    while True:
        starts.clear()
        for d in dirs:
            for log in d.glob("logs/rank*.log"):
                try:
                    text = log.read_text(errors="replace")
                except OSError:
                    continue
                for m in STARTED.finditer(text):
                    starts[int(m.group(2))] = float(m.group(1))
        records = [r for r in (_read_json(d / "run.json") for d in dirs) if r]
        done = len(records) == nodes and all(r.get("state") in TERMINAL for r in records)
        if done:
            break
        if time.monotonic() > deadline:
            raise _bed.BenchError(f"run {run} on {nodes} node(s): {len(starts)} of {want} ranks started, "
                                  f"states {[r.get('state') for r in records]} after {timeout:g}s")
        time.sleep(0.05)
    bad = [r for r in records if r.get("state") != "succeeded"]
    if bad or len(starts) != want:
        why = "; ".join(f"{r.get('node')}: {r.get('state')} {r.get('reason') or ''}".strip() for r in bad)
        try:  # torchrun's own last words on the first node, e.g. "No module named 'torch'"
            tail = (dirs[0] / "logs" / "launcher.log").read_text(errors="replace").strip().splitlines()[-1]
        except (OSError, IndexError):
            tail = ""
        raise _bed.BenchError(f"run {run} on {nodes} node(s) did not succeed with {want} ranks "
                              f"({len(starts)} started): {why}" + (f"\n{hosts[0].name} launcher.log: {tail}"
                                                                   if tail else ""))
    return Launch(nodes, cli,
                  records=max(r["created_at"] for r in records) - t0,
                  runtime=max(r.get("started_at") or float("nan") for r in records) - t0,
                  ranks=max(starts.values()) - t0, first_rank=min(starts.values()) - t0,
                  cpu=sampler.stop())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (1 node, 8 nodes); medians reported")
    ap.add_argument("--quick", action="store_true", help="1 round")
    ap.add_argument("--runtime", choices=["process", "docker"], default="process")
    ap.add_argument("--nproc", type=int, default=1, help="processes per node (default 1)")
    ap.add_argument("--delay", type=float, default=None,
                    help="seconds every SSH session waits (sshd ForceCommand); default none")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one launch may take")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds

    results: list[Launch] = []
    info: list[str] = []
    project: _bed.Project | None = None
    try:
        with _bed.bench_hosts(NODES, delay=args.delay) as hosts:
            project = _bed.Project(PROJECT, hosts, runtime=args.runtime, nproc=args.nproc,
                                   sources={"launch_probe.py": PROBE},
                                   requirements=_bed.requirements_for(args.runtime))
            info.append(f"first setup {_bed.first_setup(project).seconds:.1f}s")
            r = project.hf("deploy", timeout=1200)
            info.append(f"deploy {r.seconds:.1f}s")
            _bed.say(f"deploy: {r.seconds:.1f}s; warm-up launch on {NODES} nodes")
            launch_once(project, hosts, NODES, args.nproc, args.timeout)  # page cache, image layers: not timed
            for i in range(rounds):
                for n in (1, NODES):
                    res = launch_once(project, hosts, n, args.nproc, args.timeout)
                    _bed.say(f"round {i + 1}: {n} node(s): all ranks {res.ranks:.2f}s (CLI {res.cli:.2f}s)")
                    results.append(res)
    except _bed.BenchError as e:
        print(f"launch_latency: error: {e}", file=sys.stderr)
        return 2
    finally:
        if project is not None:
            project.remove()

    def med(n: int, attr: str) -> float:
        return _bed.median([getattr(r, attr) for r in results if r.nodes == n])

    print(f"\nlaunch latency, runtime {args.runtime}, {args.nproc} process(es) per node, "
          f"median of {rounds} (load average {_bed.load_average()}; {', '.join(info)})")
    cores = os.cpu_count() or 1
    cols = ("cli", "records", "runtime", "first_rank", "ranks")
    rows: list[list[object]] = []
    for n in (1, NODES):
        rows.append([n, *(f"{med(n, c):.2f} s" for c in cols), f"{med(n, 'cpu'):.1f} s",
                     f"{med(n, 'cpu') / cores:.1f} s"])
    rows.append([f"{NODES}/1", *(f"{med(NODES, c) / med(1, c):.2f}" for c in cols),
                 f"{med(NODES, 'cpu') / med(1, 'cpu'):.2f}", ""])
    print(_bed.table(["nodes", "CLI returned", "node records", "runtime up", "first rank", "all ranks",
                      "run CPU", f"CPU / {cores} cores"], rows))
    ratio = med(NODES, "ranks") / med(1, "ranks")
    ok = ratio <= TARGET_RATIO
    print(f"all ranks started: t({NODES})/t(1) = {ratio:.2f} (target <= {TARGET_RATIO}): "
          f"{'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
