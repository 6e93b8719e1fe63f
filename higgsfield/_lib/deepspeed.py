"""The DeepSpeed engine behind ``Llama(engine="deepspeed")`` (private).

DeepSpeed is imported only here, and only when that engine is chosen. The
generated config can be overridden by the user's ``deepspeed_config`` dict
(deep-merged), e.g. ``{"zero_optimization": {"offload_param": {"device": "nvme"}}}``.
On CPU machines set ``DS_ACCELERATOR=cpu``; we set it when no GPU is visible.
``sharding='hybrid'`` is ZeRO++ hpZ (it runs on CPU and gloo too); ZeRO++'s quantized
weights and gradients (``zero_quantized_weights`` / ``zero_quantized_gradients``, through
``deepspeed_config``) need DeepSpeed's CUDA quantizer: on CPU its op "had not been implemented".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from higgsfield._lib.hf_model import enable_activation_checkpointing, load_pretrained


def _import_deepspeed() -> Any:
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if deepspeed.get_accelerator().device_name() == "cpu":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (g++ and torch's headers,
        # about 30 CPU-s) in every process that finds no copy built under its HOME's torch_extensions:
        # a fresh container, node user or CI machine pays it at each run's start, and fails without a
        # compiler. Only ``inference_all_reduce`` uses it; training's collectives go through
        # torch.distributed (gloo). Marking it incompatible (the probe's dict is kept in the module,
        # so the mark holds) skips the build; inference falls back to the process group's all-reduce.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not deepspeed.comm.is_initialized():  # adopts the process group init_distributed made
        deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
    return deepspeed


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def make_config(zero_stage: int, precision: str, cpu_offload: bool,
                override: Mapping[str, Any] | None, hpz: int = 1) -> dict[str, Any]:
    """The ZeRO config for our precision names; ``bf16`` reduces gradients in fp32.

    ``hpz`` > 1 (``sharding='hybrid'``, ZeRO-3): ZeRO++ hpZ, a second copy of each parameter
    partitioned over the ``hpz`` ranks of a node, so the all-gathers of backward stay in the node.
    """
    zero: dict[str, Any] = {"stage": zero_stage, "contiguous_gradients": True, "overlap_comm": False}
    if zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if hpz > 1:
        zero["zero_hpz_partition_size"] = hpz
    if cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if zero_stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    config: dict[str, Any] = {
        # We feed batches ourselves; DeepSpeed only derives train_batch_size from these.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if precision in ("bf16", "fp16"):
        config["communication_data_type"] = "fp32"
    return _merge(config, override or {})


def build_module(config: Any, weights: str | None, ds_config: dict[str, Any], activation_checkpointing: bool,
                 seed: int) -> tuple[nn.Module, Any]:
    """The HF model, created partitioned under ZeRO-3 (``zero.Init``) so no rank holds it whole.

    Returns the module and an object that must stay alive (transformers reads
    the ZeRO-3 setting from it while loading weights).
    """
    _import_deepspeed()
    from transformers import LlamaForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    keepalive = HfDeepSpeedConfig(ds_config) if ds_config["zero_optimization"]["stage"] == 3 else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if weights is not None:
            module = load_pretrained(config, weights)
        else:
            module = LlamaForCausalLM._from_config(config, dtype=torch.float32)
    if activation_checkpointing:
        enable_activation_checkpointing(module)
    module.train()
    return module, keepalive


def initialize(module: nn.Module, optimizer: torch.optim.Optimizer, ds_config: dict[str, Any]) -> Any:
    deepspeed = _import_deepspeed()
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=ds_config,
                                           dist_init_required=False)
    return engine


def full_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Gather the full weights onto rank 0 (CPU). Collective."""
    deepspeed = _import_deepspeed()
    module = model.module
    out: dict[str, torch.Tensor] = {}
    rank0 = dist.get_rank() == 0
    for name, p in module.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None, enabled=hasattr(p, "ds_id")):
            if rank0:
                out[name] = p.detach().to("cpu", torch.float32).clone()
    return out
