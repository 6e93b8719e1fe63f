"""Overhead of higgsfield's training loop over a minimal hand-written FSDP2 loop.

    .venv/bin/python bench/train_overhead.py            # spawns torchrun --nproc_per_node 2
    .venv/bin/python bench/train_overhead.py --nproc 1 --steps 40 --rounds 3

Both loops train the same tiny LLaMA (tiny_llama's config) on the same data in
the same processes, alternating round by round so that noise from other work
on the machine hits both alike. "higgsfield" = Llama + LlamaLoader (collating
on the fly) + clip_grad_norm + Checkpoint.maybe_save (no save falls inside the
timed window); "hand" = fully_shard per layer + root, pre-collated tensors,
HF's loss, clip_grad_norm_, AdamW. Prints median tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaForCausalLM

    import tiny_llama as T
    from higgsfield.checkpoint import Checkpoint
    from higgsfield.dataset import PromptCompletionDataset
    from higgsfield.llama import Llama
    from higgsfield.loaders import LlamaLoader
    from higgsfield.training import clip_grad_norm, init_distributed

    init_distributed()
    ws = dist.get_world_size()
    tok = T.make_tokenizer()
    train_rows, _ = T.make_data()
    cfg = T.model_config(args.hidden, args.layers)
    cfg._attn_implementation = "sdpa"
    loader = LlamaLoader(PromptCompletionDataset(train_rows), tok, 16, args.global_batch // ws)
    total = args.warmup + args.steps

    # higgsfield
    model = Llama(cfg, precision="fp32", activation_checkpointing=False)
    opt = model.make_optimizer(torch.optim.AdamW, lr=1e-3)
    ckpt = Checkpoint(model, opt, every=10**9, directory=tempfile.mkdtemp())

    def ours(step0: int) -> int:
        tokens = 0
        for step, batch in loader.iterate(step0, step0 + args.steps):
            loss = model(batch)
            model.backward(loss)
            clip_grad_norm(model, opt, 1.0)
            model.step(opt)
            ckpt.maybe_save(step, loader)
            tokens += int(batch["num_tokens"])
        return tokens

    # hand-written FSDP2
    torch.manual_seed(0)
    hand = LlamaForCausalLM(cfg)
    for layer in hand.model.layers:
        fully_shard(layer)
    fully_shard(hand)
    hopt = torch.optim.AdamW(hand.parameters(), lr=1e-3)
    batches = [loader.batch(s) for s in range(total)]

    def handwritten(step0: int) -> int:
        tokens = 0
        for s in range(args.steps):
            b = batches[(step0 + s) % total]
            loss = hand(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hand.parameters(), 1.0)
            hopt.step()
            hopt.zero_grad(set_to_none=True)
            tokens += int(b["num_tokens"])
        return tokens

    results: dict[str, list[float]] = {"higgsfield": [], "hand": []}
    for fn in (ours, handwritten):  # warm-up
        fn(0) if args.warmup else None
    for r in range(args.rounds):
        for name, fn in (("higgsfield", ours), ("hand", handwritten)) if r % 2 == 0 else \
                (("hand", handwritten), ("higgsfield", ours)):
            dist.barrier()
            t = time.perf_counter()
            tokens = fn(args.warmup)
            dist.barrier()
            results[name].append(tokens * ws / (time.perf_counter() - t))
    if dist.get_rank() == 0:
        a, b = statistics.median(results["higgsfield"]), statistics.median(results["hand"])
        print(f"\n{'loop':<12}{'tokens/s (median of ' + str(args.rounds) + ')':>28}   rounds")
        print(f"{'higgsfield':<12}{a:>28,.0f}   {', '.join(f'{x:,.0f}' for x in results['higgsfield'])}")
        print(f"{'hand FSDP2':<12}{b:>28,.0f}   {', '.join(f'{x:,.0f}' for x in results['hand'])}")
        print(f"ratio higgsfield / hand = {a / b:.3f}  ({ws} ranks, hidden {args.hidden}, {args.layers} layers, "
              f"global batch {args.global_batch})")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
           __file__, "--worker", *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": str(ROOT)}
    raise SystemExit(subprocess.call(cmd, env=env))  # noqa: S603


if __name__ == "__main__":
    main()
