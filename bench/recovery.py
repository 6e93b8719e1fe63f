"""A lost node recovered by the nodes: seconds from the power cut to the first step on the survivors.

    .venv/bin/python bench/recovery.py                 # 3 bench hosts, Docker, 5 cuts, ~10M params
    .venv/bin/python bench/recovery.py --rounds 2 --width 512
    .venv/bin/python bench/recovery.py --cut 0         # node 0 lost: its coordinator taken over by node 1

Three bench hosts (``bench/_bed.py``: hfnode30-32) run an FSDP2 MLP of ``--layers`` x
``--width``² (about 10M parameters by default, AdamW) with ``higgsfield run --min-nodes 2
--detach``: no laptop, no mirror, checkpoints node-local with buddy copies every
``--every`` steps. Three steps past the second checkpoint, node 2 (``--cut``) is cut: its sshd and
sessions stop, every process of its user is SIGKILLed, its container killed (what a power
cut leaves). Each rank prints the UNIX time of its steps, of its load and of its resume;
the survivors' records give the regroup (the new attempt's ``at``) and the new torchrun's
start. Per cut, split into:

- **detect + agree**: the cut to the regroup (the coordinator saw the connection drop,
  stopped the survivors and waited for their last word; with ``--cut 0`` the survivors saw the
  coordinator's drop, and node 1 took it over on its standby port before they joined it there);
- **start**: the regroup to the experiment's first line (admission, the container, torch's
  import, the rendezvous);
- **load**: that line to the resume (the layout, the parts and buddy copies moved and put
  together, the DCP load);
- **first step**: the resume to the end of the first step on the survivors.

Prints the median of each over ``--rounds`` cuts, the steps redone (the step reached when
cut less the step resumed from) and the target: at most 30 s from the cut to the first step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bed import BenchError, Project, bench_hosts, first_setup, load_testbed, median, say, table  # noqa: E402

TARGET_S = 30.0

EXPERIMENT = '''\
"""An FSDP2 MLP that checkpoints and says, with the time, where it loads, resumes and steps."""
import time

from higgsfield.experiment import experiment, param


@experiment("mlp", seed=0)
@param("steps", default=400)
@param("every", default=5)
@param("width", default=1024)
@param("layers", default=10)
@param("step_sleep", default=0.1)
def mlp(params):
    import torch
    from torch.distributed.fsdp import fully_shard

    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import init_distributed

    init_distributed()
    print(f"loading at {time.time():.3f}", flush=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(params.width, params.width) for _ in range(params.layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckpt = Checkpoint(model, opt, every=params.every, keep_last=2)
    start = ckpt.load_latest()
    print(f"resumes at step {start} at {time.time():.3f}", flush=True)
    x = torch.randn(16, params.width)
    for step in range(start, params.steps):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} at {time.time():.3f}", flush=True)
        if ckpt.maybe_save(step):
            print(f"saved step_{step + 1:08d}", flush=True)
        time.sleep(params.step_sleep)
    ckpt.wait()
'''


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _record(p: Project, host: Any, run: str) -> dict[str, Any]:
    try:
        return dict(json.loads((p.run_dir(host, run) / "run.json").read_text()))
    except (OSError, ValueError):
        return {}


def _wait(pred: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")


def _cut(host: Any, project: str, run: str) -> None:
    """What a power cut leaves: no sshd, no session, no process of the node user, no container."""
    import psutil

    tb = load_testbed()
    tb.stop_host(host, kill_sessions=True)
    for proc in psutil.process_iter(["username"]):
        if proc.info["username"] == host.user:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
    names = subprocess.run(["docker", "ps", "-q", "--filter", f"label=org.higgsfield.run={run}",  # noqa: S607
                            "--filter", f"name={host.name}"], capture_output=True, text=True).stdout.split()
    if names:
        subprocess.run(["docker", "kill", *names], capture_output=True)  # noqa: S607


def one_cut(p: Project, args: argparse.Namespace, k: int) -> dict[str, float]:
    hosts = p.hosts
    run = f"cut{k}-{int(time.time())}"
    p.hf("run", "mlp", "-p", f"every={args.every}", "-p", f"width={args.width}", "-p", f"layers={args.layers}",
         "--run-name", run, "--min-nodes", "2", "--detach", timeout=300)
    logs = [p.run_dir(h, run) / "logs" / f"rank{i}.log" for i, h in enumerate(hosts)]
    saved = f"saved step_{2 * args.every:08d}"
    _wait(lambda: all(saved in _read(f) for f in logs), 600, f"{saved} on every node")
    past = f"step {2 * args.every + 2} at"   # cut mid-interval: 3 steps past the save are redone
    _wait(lambda: past in _read(logs[0]), 300, past)
    reached = max(int(m) for m in re.findall(r"^step (\d+) at", _read(logs[0]), re.M))
    heir = 1 if args.cut == 0 else 0   # the survivor that is node 0 of the next attempt (rank 0's log)
    new_log = p.run_dir(hosts[heir], run) / "logs" / "rank0.log"
    before = len(re.findall(r"resumes at step", _read(new_log)))
    t0 = time.time()
    _cut(hosts[args.cut], p.name, run)

    def resumed() -> bool:
        return len(re.findall(r"resumes at step", _read(new_log))) > before and \
            bool(re.search(r"^step \d+ at", _read(new_log).rsplit("resumes at step", 1)[-1], re.M))

    _wait(resumed, 300, "the survivors' first step after the regroup")
    rec = _record(p, hosts[heir], run)
    after = _read(new_log).rsplit("loading at", 1)[-1]
    loading = float(after.split()[0])
    resume_step, resume_at = re.search(r"resumes at step (\d+) at ([\d.]+)", after).groups()  # type: ignore[union-attr]
    first = float(re.search(r"^step \d+ at ([\d.]+)", after, re.M).group(1))  # type: ignore[union-attr]
    regroup_at = rec["attempts"][-1]["at"]
    p.hf("kill", run, timeout=120, check=False)
    load_testbed().start_host(hosts[args.cut])
    return {"detect + agree": regroup_at - t0, "start": loading - regroup_at, "load": float(resume_at) - loading,
            "first step": first - float(resume_at), "cut to first step": first - t0,
            "steps redone": float(reached + 1 - int(resume_step))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--cut", type=int, default=2, choices=(0, 1, 2),
                    help="the node cut (0: node 0, which hosts the coordinator: the next node takes it over)")
    args = ap.parse_args()
    params = args.layers * args.width * (args.width + 1)
    print(f"recovery: 3 nodes x 1 rank (Docker), {params / 1e6:.1f}M params, a checkpoint every {args.every} "
          f"steps, node {args.cut} cut {args.rounds} times")
    with bench_hosts(3) as hosts:
        p = Project("benchrecovery", hosts, sources={"mlp.py": EXPERIMENT})
        try:
            first_setup(p)
            p.hf("deploy", timeout=900)
            cuts = []
            for k in range(args.rounds):
                cuts.append(one_cut(p, args, k))
                say(f"cut {k + 1}: " + ", ".join(f"{n} {v:.1f}" for n, v in cuts[-1].items()))
        finally:
            p.remove()
    names = list(cuts[0])
    print(table(["phase", "median", "min", "max"],
                [[n, f"{median([c[n] for c in cuts]):.1f}", f"{min(c[n] for c in cuts):.1f}",
                  f"{max(c[n] for c in cuts):.1f}"] for n in names]))
    total = median([c["cut to first step"] for c in cuts])
    print(f"target: the first step on the survivors within {TARGET_S:.0f}s of the cut: "
          f"{'met' if total <= TARGET_S else 'NOT met'} (median {total:.1f}s)")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        raise SystemExit(f"bench: {e}") from None
