"""``higgsfield doctor --fabric`` wall time on 2 and on 4 nodes (gloo on CPU, one rank per node).

Each round times ``higgsfield doctor --fabric --json`` from the command's start to its exit:
the CLI's start, the SSH connections, the benchmark's launch through the run path (the
queue, torchrun and the rendezvous, the worker's torch import), the all-reduce sweep 8 B ..
64 MiB, the pairwise step (1 pair on 2 nodes, 6 on 4), the checkpoint-directory write and
the result read back from the log. The result is checked (every size, every pair, figures
positive) and its latency and peak busbw printed beside the wall time.

    .venv/bin/python bench/fabric_wall.py                     # process runtime, 3 rounds on 2 and on 4 nodes
    .venv/bin/python bench/fabric_wall.py --quick             # 1 round
    .venv/bin/python bench/fabric_wall.py --runtime docker    # the Docker runtime

Needs root and the test bed (``make testbed``); uses hosts hfnode30..33 (``bench/_bed.py``)
and stops their sshd at the end. On a GPU machine, compare its busbw with the hardware's
(public nccl-tests: about 450-480 GB/s for NVLink all-reduce on 8 x H100).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _bed

PROJECT = "bench_fabric"
NODES = 4


def _check(out: str, nodes: int) -> dict:  # type: ignore[type-arg]
    d = json.loads(out)
    if len(d["nodes"]) != nodes or len(d["pairs"]) != nodes * (nodes - 1) // 2:
        raise _bed.BenchError(f"fabric on {nodes} node(s): {len(d['nodes'])} nodes, {len(d['pairs'])} pairs")
    if d["allreduce"][0]["bytes"] != 8 or d["allreduce"][-1]["bytes"] != 64 << 20:
        raise _bed.BenchError(f"sizes {d['allreduce'][0]['bytes']}..{d['allreduce'][-1]['bytes']}")
    if not all(r["busbw_gbps"] > 0 and r["time_us"] > 0 for r in d["allreduce"]):
        raise _bed.BenchError("a figure is not positive")
    return d  # type: ignore[no-any-return]


def measure(project: _bed.Project, nodes: int, rounds: int) -> list[tuple[float, float, float]]:
    """(wall seconds, latency us, peak busbw GB/s) per round."""
    out = []
    for i in range(rounds):
        r = project.hf("doctor", "--fabric", "--json", "--nodes", str(nodes), timeout=600)
        d = _check(r.out, nodes)
        out.append((r.seconds, d["latency_us"], d["peak_busbw_gbps"]))
        _bed.say(f"{nodes} node(s): round {i + 1}: {r.seconds:.2f}s, latency {d['latency_us']:.0f} us, "
                 f"peak busbw {d['peak_busbw_gbps']:.3f} GB/s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round")
    ap.add_argument("--runtime", choices=["docker", "process"], default="process")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    results: dict[int, list[tuple[float, float, float]]] = {}
    project: _bed.Project | None = None
    try:
        with _bed.bench_hosts(NODES) as hosts:
            project = _bed.Project(PROJECT, hosts, runtime=args.runtime, nproc=1,
                                   sources={}, requirements=_bed.requirements_for(args.runtime))
            _bed.first_setup(project)
            r = project.hf("deploy", timeout=1500)
            _bed.say(f"deploy: {r.seconds:.1f}s")
            for n in (2, NODES):
                results[n] = measure(project, n, rounds)
    except _bed.BenchError as e:
        print(f"fabric_wall: error: {e}", file=sys.stderr)
        return 2
    finally:
        if project is not None:
            project.remove()
    print(f"\nhiggsfield doctor --fabric --json, runtime {args.runtime}, 1 rank per node, median of {rounds} "
          f"(load average {_bed.load_average()}; {Path('/proc/cpuinfo').read_text().count('processor')} cores)")
    rows = [[n, f"{_bed.median([w for w, _, _ in v]):.2f} s", f"{max(w for w, _, _ in v):.2f} s",
             f"{_bed.median([lat for _, lat, _ in v]):.0f} us", f"{_bed.median([b for _, _, b in v]):.3f} GB/s"]
            for n, v in results.items()]
    print(_bed.table(["nodes", "wall median", "wall max", "latency", "peak busbw"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
