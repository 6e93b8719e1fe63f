"""The Hugging Face model pieces both training engines build on (private).

:mod:`higgsfield.llama` (FSDP2) and :mod:`higgsfield._lib.deepspeed` (ZeRO) load
weights and turn on activation checkpointing the same way. Those pieces live
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
