"""DiLoCo's pseudo-gradients averaged across nodes, in fp32, bf16 or int8 (private).

Used by :class:`higgsfield._lib.diloco.NodeManager`. Its own module because how the bytes
cross the network (and how many) is one concept apart from the outer loop:

- ``None``: fp32, one all-reduce (sum, then divided by the nodes).
- ``"bf16"``: each node's values in bf16, all-gathered, summed in fp32: half the bytes.
- ``"int8"``: each block of :data:`BLOCK` values as int8 with an fp32 scale (its largest magnitude
  / 127, rounded to nearest), all-gathered and summed in fp32: about a quarter of the bytes.
  INTELLECT-1 (arXiv 2412.01152) sends int8 pseudo-gradients the same way, without error feedback.

Why all-gather for the quantized forms: a sum of int8 values overflows int8, and a node's own
values are averaged after the same rounding as everyone else's, so every node ends with the very
same average, bit for bit (their replicas must stay equal). torchft's own quantized all-reduce
(``torchft.collectives.allreduce_quantized``) is Triton kernels that need CUDA.

The bytes returned are what this rank sent to the other nodes (a ring: ``2(n-1)/n`` of the
payload for an all-reduce, ``n-1`` payloads for an all-gather), which the step metrics report.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["BLOCK", "QUANTIZE", "average", "dequantize_int8", "quantize_int8"]

QUANTIZE = (None, "bf16", "int8")
BLOCK = 1024


def quantize_int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, one per value of ``t`` flattened; the fp32 scale of each block of :data:`BLOCK`)."""
    flat = t.detach().reshape(-1).float()
    numel = flat.numel()
    blocks = torch.nn.functional.pad(flat, (0, (-numel) % BLOCK)).view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.view(-1)[:numel].clone(), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, numel: int) -> torch.Tensor:
    """The fp32 values :func:`quantize_int8` encoded (``numel`` of them)."""
    padded = torch.nn.functional.pad(q.float(), (0, (-numel) % BLOCK)).view(-1, BLOCK)
    return (padded * scale[:, None]).view(-1)[:numel]


def average(tensor: torch.Tensor, group: Any, quantize: str | None) -> int:
    """Replace ``tensor`` by its mean over ``group`` (one rank per node); returns the bytes this rank sent."""
    n = dist.get_world_size(group)
    if n == 1:
        return 0
    if quantize is None:
        buf = tensor.float() if tensor.dtype != torch.float32 else tensor
        dist.all_reduce(buf, group=group)
        tensor.copy_(buf.div_(n))
        return int(2 * (n - 1) / n * buf.numel() * buf.element_size())
    if quantize == "bf16":
        parts = _gather(tensor.detach().to(torch.bfloat16).reshape(-1), group, n)
        total = torch.stack([p.float() for p in parts]).sum(dim=0)
        tensor.copy_((total / n).view_as(tensor))
        return (n - 1) * parts[0].numel() * 2
    if quantize == "int8":
        q, scale = quantize_int8(tensor)
        qs, scales = _gather(q, group, n), _gather(scale, group, n)
        total = torch.stack([dequantize_int8(a, s, tensor.numel()) for a, s in zip(qs, scales, strict=True)]).sum(0)
        tensor.copy_((total / n).view_as(tensor))
        return (n - 1) * (q.numel() + 4 * scale.numel())
    raise ValueError(f"unknown quantize {quantize!r}")


def _gather(t: torch.Tensor, group: Any, n: int) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(out, t.contiguous(), group=group)
    return out
