"""LLaMA on every GPU of every node: FSDP2 (default) or DeepSpeed ZeRO.

A whole training loop (``higgsfield run my_exp`` launches it under torchrun)::

    import torch
    from higgsfield.llama import Llama
    from higgsfield.loaders import LlamaLoader
    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import clip_grad_norm

    model = Llama("meta-llama/Llama-2-7b-hf", zero_stage=3, precision="bf16")
    optimizer = model.make_optimizer(torch.optim.AdamW, lr=1e-5, weight_decay=0.0)
    scaler = model.grad_scaler()                      # a GradScaler for fp16, else None
    loader = LlamaLoader(dataset, tokenizer, max_sequence_length=2048, batch_size_per_gpu=8)
    ckpt = Checkpoint(model, optimizer, scaler=scaler, every=100, keep_last=2)
    start = ckpt.load_latest(loader)                  # 0, or where the last run stopped
    for step, batch in loader.iterate(start, max_steps=1000):
        loss = model(batch)                           # mean token loss over the global batch
        model.backward(loss, scaler)
        clip_grad_norm(model, optimizer, 1.0, scaler)
        model.step(optimizer, scaler)
        ckpt.maybe_save(step, loader)
    model.save_huggingface_model("out/")

Why these choices:

- FSDP2 (``fully_shard``) per decoder layer then the root, as torchtitan does:
  ``zero_stage=3`` reshards parameters after forward, ``2`` keeps them gathered
  until backward, ``0`` replicates (an HSDP mesh of shape (world, 1)). Stage 1
  (shard only optimizer state) has no FSDP2 form and is refused.
- ``sharding`` says over which ranks (``zero_stage`` says what): ``full`` over
  every rank, ``hybrid`` within each node and replicated across nodes (HSDP, a
  (nodes, ranks per node) mesh: the per-layer collectives stay off the network),
  ``replicate`` over none (``zero_stage=0``). The default ``auto`` is what
  ``zero_stage`` implies (replicate for 0, else full): hybrid holds more per rank
  (a model that fits fully sharded may not fit one node's share), so a run asks
  for it. Rank 0 prints the choice at startup. Why: :mod:`higgsfield._lib.mesh`.
- ``diloco=DiLoCo(every=50, outer_lr=0.7, momentum=0.9, quantize="int8")``: the nodes meet every
  50 steps instead of every step (slow links): each node trains its own replica, sharded over
  its ranks, and an outer Nesterov step joins the nodes' pseudo-gradients. An option beside
  ``sharding`` because it says how often nodes talk, not over which ranks the model is sharded
  (it shards within each node, as ``hybrid``). Why and how: :mod:`higgsfield._lib.diloco`.
- ``precision``: ``bf16`` computes in bf16 but keeps fp32 master weights and
  reduces gradients in fp32; ``bf16_pure`` stores everything in bf16 (less
  memory, lossy updates: the original library's "bf16"); ``fp16`` keeps fp32
  masters and needs a loss scaler; ``fp32`` is exact.
- ``cpu_init_rank0=True``: only rank 0 materialises the weights (on CPU); the
  others build on the meta device and receive their shards by broadcast, so
  a 70B model does not need 70B x ranks of host memory, and every rank starts
  from identical weights.
- The loss is normalised by the number of label tokens in the *global* batch,
  so gradients do not depend on how the batch is split over ranks: 1 process
  and 8 processes with the same global batch follow the same trajectory.
- ``make_optimizer``/``backward``/``step`` exist because DeepSpeed owns the
  optimizer and backward; with FSDP they are the plain torch calls.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from higgsfield._lib import diloco as _diloco
from higgsfield._lib import mesh as _mesh
from higgsfield._lib.diloco import DiLoCo
from higgsfield._lib.hf_model import (
    enable_activation_checkpointing,
    load_pretrained,
    param_count,
    rebuild_rotary,
)
from higgsfield.training import GradScaler, device, init_distributed

__all__ = ["Llama", "Llama7b", "Llama13b", "Llama70b", "PRECISIONS", "ENGINES", "SHARDINGS", "DiLoCo"]

PRECISIONS = ("bf16", "bf16_pure", "fp16", "fp32")
ENGINES = ("fsdp", "deepspeed")
SHARDINGS = _mesh.SHARDINGS
IGNORE_INDEX = -100


def _check_args(precision: str, engine: str, zero_stage: int, sharding: str = "auto") -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)} "
                         "(bf16 = bf16 compute with fp32 master weights)")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: choose 'fsdp' or 'deepspeed'")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 2 or 3, got {zero_stage!r}")
    if engine == "fsdp" and zero_stage == 1:
        raise ValueError("zero_stage=1 (shard only the optimizer state) has no FSDP2 equivalent: use "
                         "zero_stage=2 (shard gradients and optimizer state, keep parameters gathered "
                         "between forward and backward) or engine='deepspeed'")
    if engine == "deepspeed" and precision == "bf16_pure":
        raise ValueError("precision='bf16_pure' is an FSDP mode; DeepSpeed always keeps fp32 master "
                         "weights: use precision='bf16'")
    _mesh.check_sharding(sharding, zero_stage, engine)


class Llama(nn.Module):
    """A LLaMA causal LM, sharded over all ranks; ``model(batch)`` returns the loss.

    ``model_name_or_config``: a hub name, a local directory written by
    ``save_pretrained`` / :meth:`save_huggingface_model`, or a
    ``transformers.LlamaConfig`` (random init from ``seed``).
    ``sharding``: ``auto`` (default), ``full``, ``hybrid`` or ``replicate``
    (see the module docstring); ``model.sharding`` is what ``auto`` chose.
    ``diloco``: a :class:`DiLoCo` to sync the nodes every H steps only (None: every step).
    """

    def __init__(self, model_name_or_config: Any, zero_stage: int = 3, precision: str = "bf16",
                 engine: str = "fsdp", activation_checkpointing: bool = True, cpu_init_rank0: bool = True,
                 cpu_offload: bool = False, deepspeed_config: Mapping[str, Any] | None = None,
                 attn_implementation: str = "sdpa", seed: int = 0, sharding: str = "auto",
                 diloco: DiLoCo | None = None) -> None:
        super().__init__()
        _check_args(precision, engine, zero_stage, sharding)
        sharding = _diloco.check_with(diloco, sharding, engine, zero_stage)
        if deepspeed_config is not None and engine != "deepspeed":
            raise ValueError("deepspeed_config is only used with engine='deepspeed'")
        self.engine = engine
        self.precision = precision
        self.zero_stage = zero_stage
        self.last_loss: torch.Tensor | None = None
        self.ds_engine: Any = None
        self._ds_keepalive: Any = None
        self.diloco, self.diloco_runner, self.inner_group = diloco, None, None
        init_distributed()
        self.config, weights = _resolve_config(model_name_or_config, attn_implementation)
        #: the mesh chosen for ``sharding`` (its ``sharding`` is never "auto"): :mod:`higgsfield._lib.mesh`
        self.mesh_plan = _mesh.choose(sharding, engine, zero_stage)
        self.sharding = self.mesh_plan.sharding
        if diloco is not None:
            _diloco.check_nodes(diloco, self.mesh_plan.shape)
            _diloco.announce(diloco, self.mesh_plan.shape)
        if engine == "fsdp":
            self.module = self._build_fsdp(weights, activation_checkpointing, cpu_init_rank0, cpu_offload, seed)
        else:
            from higgsfield._lib import deepspeed as _deepspeed
            hpz = self.mesh_plan.shape[1] if self.sharding == "hybrid" else 1
            self.ds_config = _deepspeed.make_config(zero_stage, precision, cpu_offload, deepspeed_config, hpz)
            self.module, self._ds_keepalive = _deepspeed.build_module(
                self.config, weights, self.ds_config, activation_checkpointing, seed)

    # -- construction -------------------------------------------------------------------------

    def _build_fsdp(self, weights: str | None, activation_checkpointing: bool, cpu_init_rank0: bool,
                    cpu_offload: bool, seed: int) -> nn.Module:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        dev = device()
        rank0 = dist.get_rank() == 0
        full_sd: dict[str, torch.Tensor] = {}
        if cpu_init_rank0:
            if rank0:
                full_sd = _new_hf_model(self.config, weights, seed).state_dict()
            with torch.device("meta"):
                module = _new_hf_model(self.config, None, seed, init_weights=False)
        else:
            module = _new_hf_model(self.config, weights, seed).to(dev)
        if self.precision == "bf16_pure":
            module = module.to(torch.bfloat16)
            full_sd = {k: v.to(torch.bfloat16) for k, v in full_sd.items()}
        if activation_checkpointing:
            enable_activation_checkpointing(module)

        mesh = _mesh.build(self.mesh_plan, dev)
        if self.diloco is not None:   # FSDP over this node's ranks only; the nodes meet in DiLoCo's outer step
            self.node_mesh, mesh = mesh, mesh["shard"]
            self.inner_group = mesh.get_group()
        mp = {
            "bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            "fp16": MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32),
            "bf16_pure": MixedPrecisionPolicy(),
            "fp32": MixedPrecisionPolicy(),
        }[self.precision]
        offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
        reshard = self.zero_stage == 3
        for layer in module.model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
        # The root's parameters are needed again right at the start of backward: keep them.
        fully_shard(module, mesh=mesh, reshard_after_forward=False, mp_policy=mp, offload_policy=offload)
        if cpu_init_rank0:
            module.to_empty(device="cpu" if cpu_offload else dev)
            set_model_state_dict(module, full_sd, options=StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=True, strict=rank0))
            del full_sd
        rebuild_rotary(module, dev)
        module.train()
        return module

    # -- training -----------------------------------------------------------------------------

    def make_optimizer(self, optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                       **kwargs: Any) -> torch.optim.Optimizer:
        """The optimizer over this model's (sharded) parameters.

        With FSDP this is ``optimizer_class(model.parameters(), **kwargs)``. With
        DeepSpeed it also creates the engine around it; the returned optimizer is
        then driven by :meth:`step` (do not call its ``step`` yourself), and LR
        schedulers built on it work as usual.
        """
        optimizer = optimizer_class(self.module.parameters(), **kwargs)
        if self.engine == "deepspeed":
            if self.ds_engine is not None:
                raise ValueError("make_optimizer was already called: DeepSpeed holds one optimizer per model")
            from higgsfield._lib import deepspeed as _deepspeed
            # Not a registered submodule: the engine wraps self.module, which is already one.
            object.__setattr__(self, "ds_engine", _deepspeed.initialize(self.module, optimizer, self.ds_config))
        if self.diloco is not None:   # its hooks on this (inner) optimizer run the outer step every H steps
            self.diloco_runner = _diloco.Runner(self.diloco, self.module, optimizer, self.node_mesh)
        return optimizer

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The mean token loss over the *global* batch (identical on every rank).

        ``batch`` holds ``input_ids`` and ``labels`` (``-100`` = not trained),
        and optionally ``attention_mask`` and ``position_ids`` (packed rows).
        The gradient of the returned value is that of the global mean loss, so
        it does not depend on how the batch is split over ranks. Under DiLoCo: over the node's batch.
        """
        if self.engine == "deepspeed" and self.ds_engine is None:
            raise ValueError("engine='deepspeed': call model.make_optimizer(...) before the first forward")
        dev = device()
        input_ids = batch["input_ids"].to(dev, non_blocking=True)
        labels = batch["labels"].to(dev, non_blocking=True)
        kwargs: dict[str, Any] = {"use_cache": False}
        for key in ("attention_mask", "position_ids"):
            if batch.get(key) is not None:
                kwargs[key] = batch[key].to(dev, non_blocking=True)
        runner = self.ds_engine if self.ds_engine is not None else self.module
        logits = runner(input_ids=input_ids, **kwargs).logits
        shift_labels = labels[:, 1:].reshape(-1)
        local_sum = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), shift_labels,
                                    ignore_index=IGNORE_INDEX, reduction="sum")
        stats = torch.stack([(shift_labels != IGNORE_INDEX).sum().float(), local_sum.detach().float()])
        ws = dist.get_world_size(self.inner_group)
        if ws > 1:
            dist.all_reduce(stats, group=self.inner_group)
        count = stats[0].clamp(min=1.0)
        mean = stats[1] / count
        self.last_loss = mean
        # Data-parallel engines average gradients over ranks: scale by ws so the
        # gradient is that of sum(token losses) / global token count.
        local = local_sum * (ws / count)
        return local - local.detach() + mean

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits ``[batch, seq, vocab]`` for evaluation. Collective: call on every rank."""
        dev = device()
        mask = attention_mask.to(dev) if attention_mask is not None else None
        runner = self.ds_engine if self.ds_engine is not None else self.module
        return runner(input_ids=input_ids.to(dev), attention_mask=mask, use_cache=False).logits.float()

    def grad_scaler(self) -> GradScaler | None:
        """A loss scaler for ``precision='fp16'`` with FSDP; None where none is needed."""
        if self.precision == "fp16" and self.engine == "fsdp":
            return GradScaler()
        return None

    def backward(self, loss: torch.Tensor, scaler: GradScaler | None = None) -> None:
        """``loss.backward()``, scaled for fp16; DeepSpeed's own backward on that engine."""
        if self.ds_engine is not None:
            self.ds_engine.backward(loss)
            return
        self._need_scaler(scaler, "backward")
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, scaler: GradScaler | None = None) -> bool:
        """Optimizer step (skipped on fp16 overflow) and zero_grad; returns whether it stepped."""
        if self.ds_engine is not None:
            skipped = self.ds_engine.skipped_steps
            self.ds_engine.step()
            return self.ds_engine.skipped_steps == skipped
        self._need_scaler(scaler, "step")
        if scaler is not None:
            taken = scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
            taken = True
        optimizer.zero_grad(set_to_none=True)
        return taken

    def set_gradient_clipping(self, max_norm: float) -> None:
        """DeepSpeed only: the threshold its ``step`` clips the global gradient norm to."""
        if self.ds_engine is None:
            raise ValueError("set_gradient_clipping is for engine='deepspeed'; use clip_grad_norm with FSDP")
        self.ds_engine._config.gradient_clipping = max_norm
        if hasattr(self.ds_engine.optimizer, "clip_grad"):
            self.ds_engine.optimizer.clip_grad = max_norm

    def _need_scaler(self, scaler: GradScaler | None, where: str) -> None:
        if self.precision == "fp16" and scaler is None:
            raise ValueError(f"model.{where}: precision='fp16' needs a loss scaler, or small gradients "
                             "underflow to zero: scaler = model.grad_scaler(), then pass it to backward, "
                             "clip_grad_norm and step")

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (6N + attention), for MFU."""
        c = self.config
        n = param_count(c)
        return 6 * n + 12 * c.num_hidden_layers * c.hidden_size * seq_len

    # -- export -------------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights on CPU, on rank 0; an empty dict elsewhere. Collective."""
        if self.engine == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            sd = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True,
                                                                             cpu_offload=True))
            return sd if dist.get_rank() == 0 else {}
        from higgsfield._lib import deepspeed as _deepspeed
        return _deepspeed.full_state_dict(self)

    def save_huggingface_model(self, path: str | os.PathLike[str], tokenizer: Any = None,
                               dtype: torch.dtype | None = None) -> Path:
        """Write a ``transformers``-loadable directory (config + safetensors). Call on every rank."""
        path = Path(path)
        sd = self.full_state_dict()
        if dist.get_rank() == 0:
            from huggingface_hub import save_torch_state_dict
            path.mkdir(parents=True, exist_ok=True)
            if dtype is not None:
                sd = {k: v.to(dtype) for k, v in sd.items()}
            save_torch_state_dict({k: v.contiguous() for k, v in sd.items()}, path)
            self.config.save_pretrained(path)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        dist.barrier()
        return path

    def push_to_hub(self, repo_id: str, tokenizer: Any = None, private: bool = True,
                    token: str | None = None) -> None:
        """Save as with :meth:`save_huggingface_model` and upload (rank 0). Token: ``HF_TOKEN``."""
        with tempfile.TemporaryDirectory() as tmp:
            self.save_huggingface_model(tmp, tokenizer=tokenizer)
            if dist.get_rank() == 0:
                from huggingface_hub import HfApi
                api = HfApi(token=token)
                api.create_repo(repo_id, private=private, exist_ok=True)
                api.upload_folder(repo_id=repo_id, folder_path=tmp)
            dist.barrier()


def _resolve_config(src: Any, attn_implementation: str) -> tuple[Any, str | None]:
    from transformers import AutoConfig, LlamaConfig

    if isinstance(src, LlamaConfig):
        config, weights = src, None
    elif isinstance(src, (str, os.PathLike)):
        config, weights = AutoConfig.from_pretrained(src), str(src)
    else:
        raise ValueError(f"Llama: expected a hub name, a local directory or a LlamaConfig, got {type(src).__name__}")
    config._attn_implementation = attn_implementation
    return config, weights


def _new_hf_model(config: Any, weights: str | None, seed: int, init_weights: bool = True) -> nn.Module:
    from transformers import LlamaForCausalLM

    if weights is not None:
        return load_pretrained(config, weights)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float() if init_weights else model


def _hub_llama(name: str, **kwargs: Any) -> Llama:
    return Llama(kwargs.pop("model_name", name), **kwargs)


def Llama7b(**kwargs: Any) -> Llama:  # noqa: N802 - the original library's public names
    """LLaMA-2 7B (``meta-llama/Llama-2-7b-hf``; ``model_name=`` for another checkpoint)."""
    return _hub_llama("meta-llama/Llama-2-7b-hf", **kwargs)


def Llama13b(**kwargs: Any) -> Llama:  # noqa: N802
    """LLaMA-2 13B (``meta-llama/Llama-2-13b-hf``)."""
    return _hub_llama("meta-llama/Llama-2-13b-hf", **kwargs)


def Llama70b(**kwargs: Any) -> Llama:  # noqa: N802
    """LLaMA-2 70B (``meta-llama/Llama-2-70b-hf``)."""
    return _hub_llama("meta-llama/Llama-2-70b-hf", **kwargs)
