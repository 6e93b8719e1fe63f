"""What the Slurm tests share: the experiment the jobs run, the secret, a synchronous engine driver."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

SECRET = "slurm-s3cret-4e1d9c"

EXPERIMENT = '''\
"""Ranks of a Slurm run: an all_reduce, a failing rank, a checkpoint that a requeue resumes from."""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from higgsfield.experiment import experiment, param


@experiment("probe")
@param("sleep", default=0.0)
@param("fail_rank", default=-1)
@param("gate", default="")
@param("steps", default=0)
@param("crash_at", default=-1)
def probe(params):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"started rank={rank} world={world} node={os.environ.get('HIGGSFIELD_NODE')} "
          f"secret_len={len(os.environ.get('HF_SLURM_SECRET', ''))} t={time.time():.3f}", flush=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t.item()
    print(f"all_reduce ok sum={t.item():.0f}", flush=True)
    if params.fail_rank == rank:
        time.sleep(0.5)
        raise RuntimeError(f"boom on rank {rank}")
    if params.steps:
        ckpt = Path(os.environ["HIGGSFIELD_CHECKPOINT_DIR"]) / "step"
        start = int(ckpt.read_text()) if ckpt.exists() else 0
        print(f"resumed at step {start}", flush=True)
        for step in range(start, params.steps):
            if step == params.crash_at and start == 0 and rank == 1:  # the first start only
                raise RuntimeError(f"crash at step {step}")
            dist.barrier()
            if rank == 0:
                ckpt.write_text(str(step + 1))
            dist.barrier()
    gate = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / params.gate if params.gate else None
    end = time.time() + params.sleep
    while (gate is not None and not gate.exists()) or time.time() < end:
        time.sleep(0.1)
    dist.barrier()
    print(f"done rank={rank}", flush=True)
'''


class Cluster:
    """A SlurmCluster on the bed, driven from a private event loop (tests stay synchronous)."""

    def __init__(self, settings: Any, known_hosts: Path) -> None:
        from higgsfield.remote.hostkeys import PinnedHosts
        from higgsfield.remote.ssh import SSHTransport
        from higgsfield.slurm import SlurmCluster

        lg = settings.login
        self.loop = asyncio.new_event_loop()
        self.transport = SSHTransport(lg.name, lg.host, user=lg.user, port=lg.port, identity_file=lg.identity_file,
                                      pins=PinnedHosts(known_hosts))
        self.engine = SlurmCluster(self.transport, settings)
        self.settings = settings

    def __call__(self, coro: Any, timeout: float = 120) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        self.loop.run_until_complete(self.transport.close())
        self.loop.close()
