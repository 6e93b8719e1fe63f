"""A rank killed with an asynchronous checkpoint save in flight (the worker of test_checkpoint_async_exit).

    RANK=R WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=P python tests/training/async_kill_worker.py DIR

Three ranks start an asynchronous save after step 0. Rank 0's disk is slow (its shard
write takes ten minutes) and rank 2 dies (``os._exit``) while writing its shards, as
on a real crash. Ranks 0 and 1 train on: their next collective fails without rank 2, the
exception ends the process as any uncaught one does, and neither may wait for its save
(rank 0's still writing, rank 1's waiting in a collective for rank 0's). Each rank writes
``DIR/saving<R>`` once its save is under way and rank 2 ``DIR/died`` as it dies.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import _FileSystemWriter

from higgsfield.checkpoint import Checkpoint
from higgsfield.training import init_distributed


def main(root: Path) -> None:
    init_distributed()
    rank = dist.get_rank()
    write = _FileSystemWriter.write_data

    def write_data(self: Any, plan: Any, planner: Any) -> Any:  # runs in the save's thread, after DCP's plan
        if rank == 2:
            (root / "died").write_text(str(time.time()))
            os._exit(17)
        if rank == 0:
            time.sleep(600)
        return write(self, plan, planner)

    _FileSystemWriter.write_data = write_data  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = Checkpoint(model, opt, every=1, keep_last=1, directory=root / "ck", async_save=True)
    ckpt.maybe_save(0)
    (root / f"saving{rank}").touch()
    grad = torch.ones(16)
    while True:  # training goes on until a collective fails (rank 2 is gone)
        dist.all_reduce(grad)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
