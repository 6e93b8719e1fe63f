"""The fabric benchmark: a built-in experiment that ``doctor --fabric`` starts like any run.

Why an experiment: it then goes through the very launch path of a training run (the run's
runtime, its image or project venv, torchrun, the rendezvous range, the queue), so what it
measures is what a run will get, and a node that cannot start a run fails here first.
The entrypoint imports this module by name (``RunSpec.module`` is
:data:`~higgsfield.contract.fabric.MODULE`); it lives in the installed package, not in ``src/``.

What every rank does, with nccl on GPUs and gloo on CPU:

1. the all-reduce sweep over :func:`~higgsfield.contract.fabric.sizes` (8 B .. 64 MiB by powers
   of 4), timed per size after a warm-up; the slowest rank's mean counts, as in nccl-tests;
2. each node's own figure: its ranks all-reduce among themselves (with more than one rank);
3. the pairwise step: one rank of each node (its local rank 0) all-reduces with one other
   node's, pair by pair in rounds of disjoint pairs (:func:`~higgsfield.contract.fabric.rounds`);
4. per node (local rank 0): the checkpoint directory's write throughput (a file written,
   fsync'd and removed), and per GPU its free memory and health from nvidia-smi.

Rank 0 gathers it all and prints one line, :data:`~higgsfield.contract.fabric.MARKER` and the
JSON of :class:`~higgsfield.contract.fabric.FabricResult`, which the control side reads from
the run's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from higgsfield.contract.fabric import (
    EXPERIMENT,
    MARKER,
    PAIR_BYTES,
    VERSION,
    busbw,
    iterations,
    rounds,
    sizes,
)
from higgsfield.contract.layout import CHECKPOINT_DIR_VAR, NODE_VAR, RUN_DIR_VAR
from higgsfield.experiment import experiment, param

_SMI_FIELDS = ("index,name,memory.free,memory.total,ecc.errors.uncorrected.volatile.total,"
               "clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.sw_thermal_slowdown")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_allreduce(buf: torch.Tensor, iters: int, device: torch.device, group: Any = None) -> float:
    """Seconds per all-reduce of ``buf`` on ``group``: one warm-up, then ``iters`` timed."""
    dist.all_reduce(buf, group=group)
    _sync(device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf, group=group)
    _sync(device)
    return (time.perf_counter() - start) / iters


def _slowest(seconds: float, device: torch.device, group: Any = None) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _sweep(lo: int, hi: int, device: torch.device, gpu: bool) -> list[dict[str, Any]]:
    world = dist.get_world_size()
    rows = []
    for size in sizes(lo, hi):
        count = max(1, size // 4)
        buf = torch.ones(count, dtype=torch.float32, device=device)
        secs = _slowest(_time_allreduce(buf, iterations(size, gpu), device), device)
        alg = count * 4 / secs / 1e9
        rows.append({"bytes": count * 4, "count": count, "time_us": secs * 1e6, "algbw_gbps": alg,
                     "busbw_gbps": busbw(alg, world)})
        del buf
    return rows


def _intra(node: int, per_node: int, nnodes: int, nbytes: int, device: torch.device, gpu: bool) -> float | None:
    """This node's ranks all-reducing among themselves (busbw); None with one rank a node."""
    if per_node < 2:  # the same on every rank, so either all ranks make the groups or none does
        return None
    groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nnodes)]
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    secs = _slowest(_time_allreduce(buf, iterations(nbytes, gpu), device, groups[node]), device, groups[node])
    return busbw(nbytes / secs / 1e9, per_node)


def _pairwise(node: int, per_node: int, nnodes: int, nbytes: int, device: torch.device,
              gpu: bool) -> list[dict[str, Any]]:
    """Each pair of nodes alone, through their local rank 0s; returns (on every rank) this rank's pair rows."""
    leader = dist.get_rank() == node * per_node
    mine = []
    for this_round in rounds(nnodes):
        groups = {(a, b): dist.new_group([a * per_node, b * per_node]) for a, b in this_round}
        for (a, b), g in groups.items():
            if leader and node in (a, b):
                buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
                secs = _slowest(_time_allreduce(buf, iterations(nbytes, gpu), device, g), device, g)
                if node == a:
                    alg = nbytes / secs / 1e9
                    mine.append({"a": a, "b": b, "bytes": nbytes, "time_us": secs * 1e6,
                                 "busbw_gbps": busbw(alg, 2)})
        dist.barrier()
    return mine


def _ckpt_write_mbps(directory: Path, mib: int) -> float | None:
    """Write ``mib`` MiB into ``directory``, fsync, remove: MB/s (10^6 bytes), None if it cannot be written."""
    block = os.urandom(1 << 20)
    path = directory / f".higgsfield-fabric-{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(mib):
                os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        return mib * (1 << 20) / (time.perf_counter() - start) / 1e6
    except OSError:
        return None
    finally:
        path.unlink(missing_ok=True)


def _gpus() -> list[dict[str, Any]] | None:
    """Per GPU of this node: free memory and health (nvidia-smi); None on a CPU node."""
    if not torch.cuda.is_available():
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:  # torch sees GPUs but there is no nvidia-smi: memory from torch, health unknown
        out = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            out.append({"index": i, "name": torch.cuda.get_device_name(i), "free_mib": free / 2**20,
                        "total_mib": total / 2**20, "health": "n/a (no nvidia-smi)"})
        return out
    try:
        text = subprocess.run([smi, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [{"index": -1, "name": "?", "free_mib": 0.0, "total_mib": 0.0, "health": f"nvidia-smi failed: {e}"}]
    out = []
    for line in text.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7:
            continue
        problems = []
        if f[4] not in ("0", "[N/A]", "N/A"):
            problems.append(f"{f[4]} uncorrected ECC errors")
        if f[5] == "Active":
            problems.append("hardware slowdown")
        if f[6] == "Active":
            problems.append("thermal slowdown")
        out.append({"index": int(f[0]), "name": f[1], "free_mib": _num(f[2]), "total_mib": _num(f[3]),
                    "health": "; ".join(problems) or "ok"})
    return out


def _num(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return 0.0


@experiment(EXPERIMENT)
@param("min_bytes", default=8, description="smallest all-reduce message")
@param("max_bytes", default=64 << 20, description="largest all-reduce message")
@param("pair_bytes", default=PAIR_BYTES, description="the message of the pairwise step")
@param("ckpt_mib", default=64, description="MiB written to measure the checkpoint directory")
def fabric(params: Any) -> None:
    started = time.monotonic()
    gpu = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    node = int(os.environ.get("GROUP_RANK", "0"))
    if gpu:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo")
    world = dist.get_world_size()
    nnodes = world // per_node

    sweep = _sweep(int(params.min_bytes), int(params.max_bytes), device, gpu)
    intra = _intra(node, per_node, nnodes, int(params.pair_bytes), device, gpu)
    pairs = _pairwise(node, per_node, nnodes, int(params.pair_bytes), device, gpu)
    mine: dict[str, Any] | None = None
    if local == 0:
        ckpt = Path(os.environ.get(CHECKPOINT_DIR_VAR) or os.environ.get(RUN_DIR_VAR) or ".")
        mine = {"index": node, "node": os.environ.get(NODE_VAR, f"node{node}"), "ranks": per_node,
                "intra_busbw_gbps": intra, "ckpt_write_mbps": _ckpt_write_mbps(ckpt, int(params.ckpt_mib)),
                "ckpt_dir": str(ckpt), "gpus": _gpus(), "pairs": pairs}
    gathered = _gather_json(mine, device)
    if dist.get_rank() == 0:
        print(MARKER + json.dumps(_result(gathered, sweep, world, "nccl" if gpu else "gloo", started)), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _gather_json(obj: Any, device: torch.device) -> list[Any]:
    """Every rank's ``obj`` (JSON-able), on every rank: bytes in tensors, since ``all_gather_object``
    needs numpy, which an environment without the training library may lack."""
    data = bytearray(json.dumps(obj).encode())
    world = dist.get_world_size()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    top = max(int(x.item()) for x in sizes)
    buf = torch.zeros(top, dtype=torch.uint8, device=device)
    buf[:len(data)] = torch.frombuffer(data, dtype=torch.uint8).to(device)
    bufs = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(bufs, buf)
    return [json.loads(bytes(b[:int(n.item())].cpu().tolist())) for b, n in zip(bufs, sizes, strict=True)]


def _result(gathered: list[Any], sweep: list[dict[str, Any]], world: int, backend: str,
            started: float) -> dict[str, Any]:
    nodes = sorted((g for g in gathered if g is not None), key=lambda g: g["index"])
    names = [n["node"] for n in nodes]
    pairs = [{**p, "a": names[p["a"]], "b": names[p["b"]]} for n in nodes for p in n["pairs"]]
    per_node = []
    for n in nodes:
        links = [p["busbw_gbps"] for p in pairs if n["node"] in (p["a"], p["b"])]
        per_node.append({"node": n["node"], "ranks": n["ranks"], "intra_busbw_gbps": n["intra_busbw_gbps"],
                         "link_busbw_gbps": max(links) if links else None, "ckpt_write_mbps": n["ckpt_write_mbps"],
                         "ckpt_dir": n["ckpt_dir"], "gpus": n["gpus"]})
    return {"version": VERSION, "backend": backend, "nodes": names, "world_size": world, "allreduce": sweep,
            "pairs": pairs, "per_node": per_node, "seconds": time.monotonic() - started}
