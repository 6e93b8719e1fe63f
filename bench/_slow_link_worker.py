"""One rank of bench/slow_link.py: a ~20M-parameter LLaMA on tiny_llama's sums, one mode, one JSON line.

    torchrun --nnodes 2 --nproc_per_node 2 ... bench/_slow_link_worker.py MODE STEPS OUT.json [--no-eval]

MODE: ``full`` (FSDP over the 4 ranks), ``hybrid`` (within each node, gradients all-reduced across
nodes every step), ``diloco`` (hybrid + DiLoCo, H=50, int8 pseudo-gradients). The same data, batch,
seed, inner optimizer and learning rate in every mode. Rank 0 writes: steps, tokens, the seconds of
each step, and the held-out loss (mean token loss over tiny_llama's 256 held-out sums) at the end.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from higgsfield.dataset import PromptCompletionDataset
from higgsfield.llama import DiLoCo, Llama
from higgsfield.loaders import IGNORE_INDEX, LlamaLoader

REPO = Path(__file__).resolve().parents[1]
HIDDEN, LAYERS, GLOBAL_BATCH, LR, H = 576, 6, 16, 1e-3, 50


def _tiny() -> object:
    spec = importlib.util.spec_from_file_location("tiny_llama", REPO / "src" / "tiny_llama.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def held_out_loss(model: Llama, loader: LlamaLoader) -> float:
    """Mean token loss over every held-out row, summed over all ranks (the same figure in every mode)."""
    model.eval()
    stats = torch.zeros(2, dtype=torch.float64)
    for batch in loader:
        logits = model.logits(batch["input_ids"], batch["attention_mask"])
        labels = batch["labels"][:, 1:].reshape(-1)
        stats[0] += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels,
                                          ignore_index=IGNORE_INDEX, reduction="sum"))
        stats[1] += float((labels != IGNORE_INDEX).sum())
    dist.all_reduce(stats)
    model.train()
    return float(stats[0] / stats[1])


def main(mode: str, steps: int, out: str, evaluate: bool) -> None:
    tiny = _tiny()
    train_rows, eval_rows = tiny.make_data()  # type: ignore[attr-defined]
    tokenizer = tiny.make_tokenizer()  # type: ignore[attr-defined]
    diloco = DiLoCo(every=H, quantize="int8") if mode == "diloco" else None
    model = Llama(tiny.model_config(HIDDEN, LAYERS), precision="fp32", activation_checkpointing=False,  # type: ignore[attr-defined]
                  sharding="full" if mode == "full" else "hybrid", diloco=diloco, seed=0)
    optimizer = model.make_optimizer(torch.optim.AdamW, lr=LR, weight_decay=0.0, betas=(0.9, 0.98))
    world = dist.get_world_size()
    loader = LlamaLoader(PromptCompletionDataset(train_rows), tokenizer, max_sequence_length=16,
                         batch_size_per_gpu=GLOBAL_BATCH // world, seed=0)
    eval_loader = LlamaLoader(PromptCompletionDataset(eval_rows), tokenizer, max_sequence_length=16,
                              batch_size_per_gpu=len(eval_rows) // world, shuffle=False)
    params = sum(p.numel() for p in model.parameters())   # DTensors: each one's global size
    times, tokens = [], 0
    dist.barrier()
    last = time.perf_counter()
    for _step, batch in loader.iterate(0, max_steps=steps):
        loss = model(batch)
        model.backward(loss)
        model.step(optimizer)
        float(loss.detach())   # the step's collectives are done by now
        now = time.perf_counter()
        times.append(now - last)
        last = now
        tokens += int(batch["num_tokens"]) * world
    dist.barrier()
    result = {"mode": mode, "steps": steps, "tokens": tokens, "step_s": times, "world": world,
              "params": params,
              "held_out_loss": held_out_loss(model, eval_loader) if evaluate else None}
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], "--no-eval" not in sys.argv[4:])
    from higgsfield.node.entrypoint import leave

    leave(0)
