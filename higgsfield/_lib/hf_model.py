"""The Hugging Face model pieces both training engines build on (private).

:mod:`higgsfield.llama` (FSDP2) and :mod:`higgsfield._lib.deepspeed` (ZeRO) load
weights and turn on activation checkpointing the same way (and the FSDP2 side counts
parameters and rebuilds RoPE's buffers with it). Those pieces live
here so that the imports run one way, ``llama -> _deepspeed -> _hf_model``,
instead of the two engines importing each other. ``transformers`` is imported
only when a model is built, never at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_pretrained(config: Any, weights: str) -> PreTrainedModel:
    """``LlamaForCausalLM`` with fp32 master weights from a hub name or a local directory."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(weights, dtype=torch.float32,
                                            attn_implementation=config._attn_implementation)


def enable_activation_checkpointing(module: PreTrainedModel) -> None:
    """Recompute each decoder layer in backward (non-reentrant: works with FSDP2 and DeepSpeed)."""
    kwargs = {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def param_count(config: Any) -> int:
    """The number of parameters of ``LlamaForCausalLM(config)`` (built on the meta device: no memory)."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(config).parameters())


def rebuild_rotary(module: torch.nn.Module, dev: torch.device) -> None:
    """Recompute RoPE's non-persistent fp32 buffers (lost on meta init or a dtype cast)."""
    for m in module.modules():
        if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "inv_freq"):
            fresh = type(m)(m.config)
            m.inv_freq = fresh.inv_freq.to(dev)
            if hasattr(m, "original_inv_freq"):
                m.original_inv_freq = fresh.original_inv_freq.to(dev)
