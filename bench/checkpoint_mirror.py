"""What a checkpoint mirror costs training: a step that saves, node-local vs mirrored (a path, S3 on moto).

    .venv/bin/python bench/checkpoint_mirror.py                 # 2 "nodes" x 1 rank, 3 modes
    .venv/bin/python bench/checkpoint_mirror.py --width 2048 --saves 6

Two torchrun agents on 127.0.0.1 with their own checkpoint directory each (the
node-local layout: no shared disk) train an FSDP2 MLP (``--layers`` x
``--width``², AdamW, so a checkpoint holds about 12 bytes a parameter) and save
every ``--every`` steps with ``Checkpoint.maybe_save``. Per mode, rank 0 times
every step as training sees it: a plain step, and a step that saves (compute +
the save up to its agreed COMPLETE; the mirror's upload runs behind, in the
node lead's thread, and costs training only what it takes from the CPUs). The
modes alternate for ``--rounds`` rounds, each launch on fresh directories and a
run name of its own (so no launch resumes from another's mirror); S3 is moto's
server on loopback (in this process). Prints the medians over all rounds, the
save's own cost (saving step minus plain step, which cancels a machine that is
slower or faster during one launch), and the target: what the mirror adds to a
step that saves, (cost mirrored - cost node-local) / saving step node-local,
is <= 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.05


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from higgsfield.checkpoint import Checkpoint

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckpt = Checkpoint(model, opt, every=args.every, keep_last=2)
    x = torch.randn(args.batch, args.width)
    plain: list[float] = []
    saving: list[float] = []
    for step in range(args.every * (args.saves + 1)):
        t0 = time.perf_counter()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        saved = ckpt.maybe_save(step)
        dt = time.perf_counter() - t0
        if step >= args.every:  # the first save also finds the layout: left out
            (saving if saved else plain).append(dt)
    t0 = time.perf_counter()
    ckpt.wait_uploads()
    drain = time.perf_counter() - t0
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"plain": plain, "saving": saving, "drain": drain}))
    from higgsfield.node.entrypoint import leave

    leave(0)  # as a rank under higgsfield ends (no finalization, where gloo threads can abort it)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_mode(args: argparse.Namespace, tmp: Path, mode: str, env: dict[str, str]) -> dict[str, Any]:
    out = tmp / f"{mode}.json"
    port = _port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(Path(__file__).resolve()), "--worker", "--out", str(out), "--width", str(args.width),
               "--layers", str(args.layers), "--batch", str(args.batch), "--every", str(args.every),
               "--saves", str(args.saves)]
        full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PROJECT_NAME": "bench",
                "EXPERIMENT_NAME": "mirror", "RUN_NAME": mode, "HIGGSFIELD_NODE": f"fake{node}",
                "HIGGSFIELD_CHECKPOINT_DIR": str(tmp / mode / f"node{node}"), **env}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE,  # noqa: S603
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        text, _ = p.communicate(timeout=1800)
        if p.returncode:
            raise SystemExit(f"{mode}: a node exited {p.returncode}\n{text[-3000:]}")
        for line in text.splitlines():
            if "checkpoint mirror" in line:
                print(f"  [{mode}] {line}")
    return dict(json.loads(out.read_text()))


def s3_server() -> tuple[Any, dict[str, str]]:
    import boto3
    from moto.server import ThreadedMotoServer

    port = _port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    boto3.client("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], aws_access_key_id="bench",
                 aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="bench")
    return server, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="the modes alternate this many times")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    params = args.layers * args.width * (args.width + 1)
    print(f"checkpoint mirror: 2 nodes x 1 rank, {params / 1e6:.1f}M params (~{params * 12 / 2**20:.0f} MiB a "
          f"checkpoint), a save every {args.every} steps, {args.saves} timed saves")
    server, s3 = s3_server()
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            off = {"HIGGSFIELD_CHECKPOINT_BUDDIES": "0"}   # the mirror's own cost (bench/buddy_copy.py: the copies')
            modes = {"node-local": off, "path mirror": {**off, "HIGGSFIELD_CHECKPOINT_MIRROR": str(tmp / "mirror")},
                     "s3 mirror (moto)": {**off, **s3, "HIGGSFIELD_CHECKPOINT_MIRROR": "s3://bench/ckpt"}}
            results: dict[str, dict[str, Any]] = {m: {"plain": [], "saving": [], "drain": []} for m in modes}
            for k in range(args.rounds):
                for m, env in modes.items():
                    r = one_mode(args, tmp, f"{m.split()[0]}-r{k}", env)
                    results[m]["plain"] += r["plain"]
                    results[m]["saving"] += r["saving"]
                    results[m]["drain"].append(r["drain"])
    finally:
        server.stop()

    def cost(r: dict[str, Any]) -> float:
        return statistics.median(r["saving"]) - statistics.median(r["plain"])

    base_saving = statistics.median(results["node-local"]["saving"])
    base_cost = cost(results["node-local"])
    print(f"{'mode':<18} {'plain step':>11} {'saving step':>12} {'save cost':>10} {'added':>7} {'upload drain':>13}")
    worst = float("-inf")
    for mode, r in results.items():
        added = (cost(r) - base_cost) / base_saving
        if mode != "node-local":
            worst = max(worst, added)
        print(f"{mode:<18} {statistics.median(r['plain']) * 1e3:>9.1f}ms {statistics.median(r['saving']) * 1e3:>10.1f}ms "
              f"{cost(r) * 1e3:>8.1f}ms {added:>+7.1%} {statistics.median(r['drain']) * 1e3:>11.0f}ms")
    print(f"target: the mirror adds <= {TARGET:.0%} to a step that saves: "
          f"{'met' if worst <= TARGET else 'NOT met'} (worst {worst:+.1%})")


if __name__ == "__main__":
    main()
