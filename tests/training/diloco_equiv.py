"""DiLoCo with H = 1, outer lr 1 and no momentum against plain data parallelism, in one launch.

    torchrun --nnodes 2 --nproc_per_node 2 ... tests/training/diloco_equiv.py OUT.json

Trains the same tiny LLaMA twice from the same weights on the same batches, with plain SGD as the
inner optimizer: once hybrid-sharded (every step all-reduces the gradient across nodes), once
with ``DiLoCo(every=1, outer_lr=1.0, momentum=0.0)`` (each node steps on its own gradient, then the
nodes average their pseudo-gradients). With SGD, averaging the nodes' steps is stepping on the
averaged gradient, so the two must agree. Every token is labelled and the ranks get equal rows,
so each node's mean loss weighs its tokens as the global mean does. Rank 0 writes both loss lists.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from transformers import LlamaConfig

from higgsfield.llama import DiLoCo, Llama

STEPS = 5


def batches(rank: int, world: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    rows = torch.randint(0, 32, (STEPS, world * 2, 12), generator=gen)
    return [{"input_ids": r[2 * rank:2 * rank + 2], "labels": r[2 * rank:2 * rank + 2]} for r in rows]


def train(diloco: DiLoCo | None) -> list[float]:
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16)
    model = Llama(config, precision="fp32", sharding="hybrid", diloco=diloco, activation_checkpointing=False, seed=3)
    optimizer = model.make_optimizer(torch.optim.SGD, lr=0.5)
    out = []
    for batch in batches(dist.get_rank(), dist.get_world_size()):
        loss = model(batch)
        model.backward(loss)
        model.step(optimizer)
        out.append(float(loss))
    return out


def main(out: str) -> None:
    plain = train(None)
    diloco = train(DiLoCo(every=1, outer_lr=1.0, momentum=0.0))
    # rank 0's DiLoCo loss is node 0's: check node 1's too
    losses = torch.tensor(diloco)
    gathered = [torch.zeros_like(losses) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, losses)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"plain": plain, "diloco": [g.tolist() for g in gathered]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
    from higgsfield.node.entrypoint import leave

    leave(0)
