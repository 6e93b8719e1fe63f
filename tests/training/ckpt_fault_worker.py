"""A checkpoint save that fails on one rank only, under torchrun (the worker of test_checkpoint_faults).

    torchrun --standalone --nproc_per_node 2 tests/training/ckpt_fault_worker.py DIR

Rank 1 gets a real per-process file-size limit (RLIMIT_FSIZE) before the second
save, so its writes fail with EFBIG while rank 0's succeed. Both ranks must raise
the same CheckpointError (none waits for the other in a collective), train on in
step, and save again once the limit is lifted. Each rank writes what it saw to
``DIR/result_rank<R>.json``.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from higgsfield.checkpoint import Checkpoint
from higgsfield.contract.errors import CheckpointError
from higgsfield.training import init_distributed


def main(root: Path) -> None:
    init_distributed()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = Checkpoint(model, opt, every=2, keep_last=1, directory=root / "ck")
    seen: dict[str, object] = {}
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    for step in range(6):
        loss = model(torch.randn(4, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # data parallel by hand: the ranks stay in lockstep
            dist.all_reduce(p.grad)
        opt.step()
        if step == 3 and rank == 1:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (512, limit[1]))
        try:
            ckpt.maybe_save(step)
        except CheckpointError as e:
            seen["error"] = str(e)
            seen["failures"] = {str(k): v for k, v in e.failures.items()}
            seen["after_failure"] = sorted(p.name for p in ckpt.directory.iterdir())
        if step == 3 and rank == 1:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    seen["final"] = sorted(p.name for p in ckpt.directory.iterdir())
    (root / f"result_rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    from higgsfield.node.entrypoint import leave

    leave(0)  # as a rank under higgsfield ends: no finalization, where gloo threads can abort it
