"""A tiny data-parallel regression: the smallest experiment that proves the plumbing.

Every rank fits y = 3x - 1 on its own shard of synthetic data; gradients are
averaged with an all-reduce (gloo on CPU, nccl on GPU). The loss printed on rank 0
falls from ~10 to ~0 in a few dozen steps. It destroys the process group it made;
higgsfield's entrypoint then leaves without interpreter finalization, where a gloo
thread releasing the last all-reduce could abort a rank that finished (see
``higgsfield.node.entrypoint.leave``).

    higgsfield run regression -p steps=50
"""

import time

from higgsfield.experiment import experiment, param


@experiment("regression", seed=0)
@param("steps", default=40, description="optimizer steps")
@param("lr", default=0.1, description="learning rate")
@param("step_sleep", default=0.0, description="seconds to sleep per step (to watch a run live)")
@param("fail_on_rank", default=-1, description="raise on this rank at step 3 (a failure drill); -1: never")
def regression(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import StepTimer

    distributed = params.world_size > 1
    if distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    gen = torch.Generator().manual_seed(1000 + params.rank)
    x = torch.randn(256, 1, generator=gen)
    y = 3 * x - 1
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=params.lr)
    timer = StepTimer(optimizer=opt)   # rank 0 writes each step to RUN_DIR/metrics.jsonl (higgsfield metrics, ui)
    for step in range(1, params.steps + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if distributed:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= params.world_size
            dist.all_reduce(loss)
            loss /= params.world_size
        opt.step()
        if step == 3 and params.rank == params.fail_on_rank:
            raise RuntimeError(f"failure drill on rank {params.rank}")
        timer.step(step, loss, len(x))
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if params.step_sleep:
            time.sleep(params.step_sleep)
    if distributed:
        dist.destroy_process_group()
