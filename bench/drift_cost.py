"""What the drift check adds to ``higgsfield run`` on healthy nodes (issue 19): target <= 0.5 s.

On the bench's own test-bed hosts (``bench/_bed.py``: hfnode30.., the process runtime, the
CPU torch wheel), after one real ``setup`` and ``deploy``, in one script:

1. the check alone: :func:`higgsfield.control.backends.nodes.drift.admit` over the connections
   a run holds (one ``invoker facts`` per node, concurrently, then the comparison), timed
   ``--rounds`` times against the same start without it (``--allow-drift`` skips it: no round trip);
2. the whole start as a user sees it: ``higgsfield run probe --detach`` with the check, against
   ``--allow-drift`` (without it), alternating, each run left to end before the next.

    sudo .venv/bin/python bench/drift_cost.py              # 2 nodes, 5 rounds; exit 1 over the target
    sudo .venv/bin/python bench/drift_cost.py --nodes 4 --rounds 9
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bed  # noqa: E402

PROJECT = "bench_drift"
TARGET_S = 0.5
PROBE = '''\
from higgsfield.experiment import experiment


@experiment("probe")
def probe(params):
    print(f"rank={params.rank}", flush=True)
'''


async def _check_only(project: _bed.Project, rounds: int) -> tuple[list[float], list[float]]:
    """(seconds of admit() with the check, without it) over one connected group, ``rounds`` each."""
    from higgsfield.control.backends.nodes.drift import admit
    from higgsfield.control.backends.nodes.start import plan_run
    from higgsfield.control.config import load_config
    from higgsfield.control.remote import open_group

    cfg = load_config(project.dir / "higgsfield.yml")
    plan = plan_run(cfg, "probe", {})
    free = dataclasses.replace(plan, allow_drift=True)
    on, off = [], []
    async with open_group(cfg, plan.connect_to) as group:
        await admit(group, cfg, plan)   # warm-up: page cache, the first session's set-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            _, _, notes = await admit(group, cfg, plan)
            on.append(time.perf_counter() - t0)
            assert not notes, notes
            t0 = time.perf_counter()
            await admit(group, cfg, free)
            off.append(time.perf_counter() - t0)
    return on, off


def _start(project: _bed.Project, *flags: str) -> float:
    """Seconds of ``run probe --detach`` (CLI start to its return); waits until the run ended everywhere."""
    r = project.hf("run", "probe", "--detach", *flags, timeout=300)
    run = r.out.strip().splitlines()[-1]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = {x["run"]: x for x in json.loads(project.hf("status", "--json").out)["runs"]}
        if runs.get(run, {}).get("state") in ("succeeded", "failed", "killed"):
            break
        time.sleep(0.5)
    return r.seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    project: _bed.Project | None = None
    try:
        with _bed.bench_hosts(args.nodes, docker=False) as hosts:
            project = _bed.Project(PROJECT, hosts, runtime="process", sources={"probe.py": PROBE},
                                   requirements=_bed.requirements_for("process"))
            _bed.first_setup(project)
            _bed.say(f"deploy: {project.hf('deploy', timeout=1200).seconds:.1f}s")
            on, off = asyncio.run(_check_only(project, args.rounds * 4))
            _start(project)   # warm-up, not timed
            with_check, without = [], []
            for i in range(args.rounds):
                with_check.append(_start(project))
                without.append(_start(project, "--allow-drift"))
                _bed.say(f"round {i + 1}: run start {with_check[-1]:.2f}s with the check, {without[-1]:.2f}s without")
    except _bed.BenchError as e:
        print(f"drift_cost: error: {e}", file=sys.stderr)
        return 2
    finally:
        if project is not None:
            project.remove()
    med = statistics.median
    check = med(on) - med(off)
    whole = med(with_check) - med(without)
    print(f"\ndrift check, {args.nodes} nodes, process runtime (load average {_bed.load_average()})")
    print(_bed.table(["what", "with the check", "without", "added"], [
        [f"the check alone (median of {len(on)})", f"{med(on):.3f} s", f"{med(off):.3f} s", f"{check:.3f} s"],
        [f"run --detach (median of {args.rounds})", f"{med(with_check):.2f} s", f"{med(without):.2f} s",
         f"{whole:.2f} s"]]))
    ok = check <= TARGET_S
    print(f"added by the check: {check:.3f} s (target <= {TARGET_S} s): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
