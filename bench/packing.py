"""Sequence packing vs padding on variable-length data: tokens/s and padding fraction.

    .venv/bin/python bench/packing.py                 # one process, ~1 minute on 2 cores
    .venv/bin/python bench/packing.py --steps 20 --max-len 256

The data: plain-text examples whose lengths follow a long tail (most short, a
few near ``max_len``), like instruction data. Both runs use the same tiny
LLaMA, ``batch_size_per_gpu`` rows and steps; "tokens/s" counts real
(non-padding) tokens only, so it measures useful work.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="rows per step")
    p.add_argument("--steps", type=int, default=15)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT))
    import torch

    import tiny_llama as T
    from higgsfield.dataset import TextDataset
    from higgsfield.llama import Llama
    from higgsfield.loaders import LlamaLoader

    torch.set_num_threads(1)
    rng = random.Random(0)
    texts = ["".join(rng.choice(T.CHARS) for _ in range(min(args.max_len - 2, int(rng.paretovariate(1.2) * 12))))
             for _ in range(args.examples)]
    tok = T.make_tokenizer()
    cfg = T.model_config(128, 4)
    cfg.max_position_embeddings = args.max_len
    rows = []
    for packing in (False, True):
        loader = LlamaLoader(TextDataset(texts), tok, args.max_len, args.batch, packing=packing,
                             pad_to_multiple_of=8)
        model = Llama(cfg, precision="fp32", activation_checkpointing=False)
        opt = model.make_optimizer(lr=1e-3)
        real = total = 0
        t = 0.0
        for step, batch in loader.iterate(0, args.steps + 2):
            t0 = time.perf_counter()
            loss = model(batch)
            model.backward(loss)
            model.step(opt)
            if step >= 2:  # warm-up excluded
                t += time.perf_counter() - t0
                real += int(batch["num_tokens"])
                total += batch["input_ids"].numel()
        rows.append(("packing" if packing else "padding", real / t, 1 - real / total, len(loader)))
    print(f"\n{'mode':<9}{'real tokens/s':>15}{'padding':>10}{'steps/epoch':>13}")
    for name, tps, pad, steps in rows:
        print(f"{name:<9}{tps:>15,.0f}{pad:>10.1%}{steps:>13}")
    print(f"packing speed-up: {rows[1][1] / rows[0][1]:.2f}x  ({args.examples} examples, max_len {args.max_len}, "
          f"{args.batch} rows/step, {args.steps} timed steps)")


if __name__ == "__main__":
    main()
