"""Distributed setup, gradient clipping, the fp16 loss scaler and step metrics.

The pieces every training loop needs, each correct with sharded (FSDP2 DTensor)
parameters::

    from higgsfield.training import clip_grad_norm, StepTimer

    timer = StepTimer(model.flops_per_token(seq_len), optimizer=optimizer)   # MFU on GPU; tokens/s, lr
    for step, batch in loader.iterate(start, max_steps):
        loss = model(batch)
        model.backward(loss, scaler)                    # scaler: model.grad_scaler() (fp16 only)
        norm = clip_grad_norm(model, optimizer, 1.0, scaler)
        model.step(optimizer, scaler)
        print(timer.step(step, loss, int(batch["num_tokens"])))   # loss | tok/s | lr | mfu | mem

Every ``timer.step`` on rank 0 of a run started by higgsfield also appends its
:class:`~higgsfield.metrics.StepMetrics` as a JSON line to ``RUN_DIR/metrics.jsonl``
(:class:`MetricsLog`): what ``higgsfield metrics RUN`` prints and the dashboard plots.

Progress: every ``timer.step`` on *every* rank also calls :func:`progress` (a loop
without a ``StepTimer`` calls ``higgsfield.training.progress(step)`` itself). The node
watches it to tell a hung run from a slow one: a run none of whose ranks progresses
within ``stall_timeout`` (``higgsfield run --stall-timeout``) is stalled, its ranks'
stacks are taken and it fails, restarts or waits (``--on-stall``). A run that never
reports steps is judged by its output lines instead. The call costs a clock read per
step and one small write at most once a second.

Why our own scaler: ``torch.amp.GradScaler`` checks for inf/nan only in the
gradient shard a rank holds, so with sharded gradients one rank can skip a step
that another takes and the replicas drift apart. :class:`GradScaler` reduces the
"found inf" flag over all ranks before deciding.

``init_distributed()`` is called by :class:`higgsfield.llama.Llama`; the
``higgsfield run`` entrypoint does not create the process group.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from higgsfield._lib import comm_meter as _comm
from higgsfield._lib import profile_arm as _profile
from higgsfield._lib import straggler_probe as _straggler
from higgsfield._lib.batching import accumulation
from higgsfield.contract.comm_cost import PEAK_FLOPS
from higgsfield.contract.layout import progress_path
from higgsfield.metrics import METRICS_FILE, RUN_DIR_ENV, StepMetrics, point

__all__ = ["init_distributed", "device", "clip_grad_norm", "GradScaler", "StepTimer", "StepMetrics",
           "MetricsLog", "is_rank0", "rank", "world_size", "progress", "accumulation"]

PROGRESS_EVERY = 1.0   # seconds: a rank writes its progress at most this often


class _Progress:
    """This rank's progress file (``RUN_DIR/progress/rank<RANK>``: ``STEP UNIXTIME``, rewritten in place).

    One fixed-width ``pwrite`` at offset 0, so a reader sees the old line or the new one;
    at most one each :data:`PROGRESS_EVERY` seconds, and only for a new step.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._off = False
        self._last_write = -math.inf
        self._last_step: int | None = None

    def report(self, step: int) -> None:
        if self._off or step == self._last_step:
            return
        now = time.monotonic()
        if now - self._last_write < PROGRESS_EVERY:
            return
        if self._fd is None and not self._open():
            return
        assert self._fd is not None
        try:
            os.pwrite(self._fd, f"{int(step)} {time.time():.3f}".ljust(47).encode() + b"\n", 0)
        except OSError:
            return   # a full disk: progress is advisory, training goes on
        self._last_write, self._last_step = now, step
        _profile.poll()   # `higgsfield profile`: a request file read at most once a second, here

    def _open(self) -> bool:
        run_dir = os.environ.get(RUN_DIR_ENV)
        if not run_dir:
            self._off = True   # not a higgsfield run: nothing to report to
            return False
        path = progress_path(run_dir, int(os.environ.get("RANK", "0")))
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            self._off = True
            return False
        return True


_progress = _Progress()


def progress(step: int) -> None:
    """Tell the node this rank reached ``step`` (call it every step, on every rank; cheap).

    The node's stall watchdog reads it: a run none of whose ranks progresses within
    the run's ``stall_timeout`` is stalled. Outside a run higgsfield started it does nothing.
    :meth:`StepTimer.step` calls it for you.
    """
    _progress.report(step)
    _straggler.step(step)   # this rank's own work per step, for the node's straggler rule (off: one test)
    if _profile.armed.active:   # a profile was asked for: its steps are recorded (one boolean otherwise)
        _profile.armed.step(step)


def init_distributed() -> None:
    """Create the default process group once: nccl on GPU, gloo otherwise.

    Under torchrun (``WORLD_SIZE`` set) it joins the job's rendezvous. Without it
    (plain ``python train.py``) it makes a one-process group over an in-memory
    store, so FSDP2 and torch.distributed.checkpoint take the same code path on
    one process as on many, and no port is opened. A no-op when already done.
    """
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def device() -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` on GPU machines, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_rank0() -> bool:
    return rank() == 0


def _local(t: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds (a DTensor's local tensor), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class GradScaler:
    """Dynamic fp16 loss scaling that is correct with sharded gradients.

    Same use as ``torch.amp.GradScaler`` (``scale``, ``unscale_``, ``step``,
    ``update``, ``state_dict``), but the overflow check is all-reduced so every
    rank skips or takes the same steps.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        self.scale_value = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self._growth_tracker = 0
        self._unscaled: set[int] = set()
        self._found_inf: dict[int, bool] = {}

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide gradients by the scale once per step and record overflow on any rank."""
        if id(optimizer) in self._unscaled:
            return
        inv = 1.0 / self.scale_value
        found = torch.zeros(1, device=device())
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _local(p.grad)
                g.mul_(inv)
                found += (~torch.isfinite(g)).any().to(found.dtype).to(found.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        self._unscaled.add(id(optimizer))
        self._found_inf[id(optimizer)] = bool(found.item() > 0)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step unless some rank saw inf/nan; returns whether the step was taken."""
        self.unscale_(optimizer)
        if self._found_inf[id(optimizer)]:
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps."""
        if any(self._found_inf.values()):
            self.scale_value *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker >= self.growth_interval:
                self.scale_value *= self.growth_factor
                self._growth_tracker = 0
        self._unscaled.clear()
        self._found_inf.clear()

    def get_scale(self) -> float:
        return self.scale_value

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale_value, "growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale_value = float(state["scale"])
        self._growth_tracker = int(state["growth_tracker"])


def clip_grad_norm(model: Any, optimizer: torch.optim.Optimizer, max_norm: float,
                   scaler: GradScaler | None = None) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm`` and return the norm before clipping.

    One signature for every engine. With fp16 the gradients are unscaled first
    (clipping scaled gradients clips at the wrong threshold). With FSDP2 the
    norm is the global one over all shards. With DeepSpeed the engine clips
    inside ``model.step`` (it owns the gradient partitions); this sets its
    threshold and returns the previous step's norm.
    """
    if max_norm <= 0:
        raise ValueError(f"clip_grad_norm: max_norm must be positive, got {max_norm}")
    engine = getattr(model, "engine", "fsdp")
    if engine == "deepspeed":
        model.set_gradient_clipping(max_norm)
        norm = model.ds_engine.get_global_grad_norm() if model.ds_engine is not None else None
        return torch.tensor(float("nan") if norm is None else float(norm))
    if getattr(model, "precision", None) == "fp16" and scaler is None:
        raise ValueError("clip_grad_norm: precision='fp16' needs its loss scaler to unscale gradients "
                         "before clipping: pass scaler=model.grad_scaler()")
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    # torch's clip_grad_norm_ reduces DTensor norms over the mesh: the result is global.
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach()


def _peak_flops() -> float | None:
    """The GPU's peak dense bf16 FLOP/s, for MFU (one table, :data:`higgsfield.contract.comm_cost.PEAK_FLOPS`:
    doctor --fabric's step estimate reads it too); None on CPU or an unknown GPU."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for key, flops in PEAK_FLOPS.items():
        if key in name:
            return flops
    return None


class MetricsLog:
    """Where rank 0's step metrics go: one JSON line per step in ``RUN_DIR/metrics.jsonl``.

    ``path`` defaults to the run's directory (``HIGGSFIELD_RUN_DIR``, set for every rank of a
    run that higgsfield started); outside such a run (``python train.py``) nothing is
    written unless a ``path`` is given. Only rank 0 writes: every rank computes the same
    global figures. The file is appended (a restarted worker continues it) and private
    to the node user (0600), like the run's logs.

    Exports, only where the user already has them (neither is required): when the
    ``wandb`` module is imported and ``wandb.init`` ran, each step is also
    ``wandb.log``-ged; with ``tensorboard_dir`` (and the ``tensorboard`` package) the
    figures go to a TensorBoard ``SummaryWriter`` there too.
    """

    def __init__(self, path: str | Path | None = None, *, tensorboard_dir: str | Path | None = None) -> None:
        if path is None and os.environ.get(RUN_DIR_ENV):
            path = Path(os.environ[RUN_DIR_ENV]) / METRICS_FILE
        self.path = Path(path) if path is not None else None
        self.tensorboard_dir = tensorboard_dir
        self._fd: int | None = None
        self._tb: Any = None

    def write(self, m: StepMetrics) -> None:
        if not _env_rank0():
            return
        if self.path is not None:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._fd, (m.to_json() + "\n").encode())   # one write: a reader never sees half a line
        self._export(m)

    def _export(self, m: StepMetrics) -> None:
        scalars = {k: v for k, v in point(m).items() if k not in ("step", "time") and v is not None}
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.log(scalars, step=m.step)
        if self.tensorboard_dir is not None:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

                self._tb = SummaryWriter(str(self.tensorboard_dir))
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, m.step)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _env_rank0() -> bool:
    """Rank 0 of the job, also before (or without) a process group."""
    return rank() == 0 if dist.is_initialized() else os.environ.get("RANK", "0") == "0"


class StepTimer:
    """Tokens/s (over all ranks), MFU and peak memory per step, logged to ``log`` (rank 0).

    ``flops_per_token`` is ``6 * parameters`` (plus attention) for training;
    :meth:`higgsfield.llama.Llama.flops_per_token` computes it. With ``optimizer`` each
    step records its learning rate (the first param group's; ``step(lr=...)`` overrides).
    ``log`` defaults to a :class:`MetricsLog` of the run's directory (nothing outside a
    higgsfield run); ``log=None`` writes nothing.
    """

    def __init__(self, flops_per_token: float | None = None, *, optimizer: Any = None,
                 log: MetricsLog | None | bool = True) -> None:
        self.flops_per_token = flops_per_token
        self.optimizer = optimizer
        self.log = MetricsLog() if log is True else (log or None)
        self._last = time.perf_counter()

    def step(self, step: int, loss: float | torch.Tensor, tokens: int, *, lr: float | None = None) -> StepMetrics:
        """Close the step; ``tokens`` is this rank's token count (multiplied by the world size).

        Every rank reports :func:`progress` here; rank 0 also logs the metrics."""
        progress(step)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        dt = max(now - self._last, 1e-9)
        self._last = now
        total_tokens = tokens * world_size()
        tps = total_tokens / dt
        mfu = mem = None
        peak = _peak_flops()
        if peak is not None and self.flops_per_token:
            mfu = self.flops_per_token * tps / (peak * world_size())
        if torch.cuda.is_available():
            mem = torch.cuda.max_memory_allocated() / 2**30
        value = float(loss.item() if isinstance(loss, torch.Tensor) else loss)
        if lr is None and self.optimizer is not None:
            groups = getattr(self.optimizer, "param_groups", None)
            lr = float(groups[0]["lr"]) if groups else None
        sent = _comm.take()   # this rank's cross-node bytes and seconds (DiLoCo); the ranks send alike
        m = StepMetrics(step=step, loss=value if math.isfinite(value) else float("nan"),
                        tokens_per_s=tps, step_time_s=dt, mfu=mfu, peak_memory_gib=mem,
                        lr=None if lr is None else float(lr),
                        cross_node_bytes=None if sent is None else float(sent[0] * world_size()),
                        comm_s=None if sent is None else sent[1])
        if self.log is not None:
            self.log.write(m)
        return m
