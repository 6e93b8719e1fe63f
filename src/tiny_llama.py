"""tiny_llama: a small LLaMA learns two-digit addition on CPU in a minute or two.

Everything is local: the data is generated here (``"37+58="`` -> ``"95"``), the
tokenizer is character level and built here, the model is a ``LlamaConfig``.
It prints the loss and, every ``eval_every`` steps, the exact-match accuracy on
held-out sums, which climbs from 0; it checkpoints and resumes by itself::

    higgsfield run tiny_llama                          # what `make demo` runs (2 processes)
    higgsfield run tiny_llama --param steps=600 --param engine=deepspeed

Run it again with the same run name and it continues from its last checkpoint.
It returns with the process group still up (its last step ends in a collective):
higgsfield's entrypoint destroys it and exits without interpreter finalization,
so no gloo thread can abort the rank once it finished.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

from higgsfield.checkpoint import Checkpoint
from higgsfield.dataset import PromptCompletionDataset
from higgsfield.experiment import experiment, param
from higgsfield.llama import DiLoCo, Llama
from higgsfield.loaders import IGNORE_INDEX, LlamaLoader
from higgsfield.training import StepTimer, clip_grad_norm

CHARS = "0123456789+="
SPECIAL = ["<pad>", "<s>", "</s>"]


def make_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A character-level tokenizer over digits, '+' and '=', built without any download."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def make_data(n_eval: int = 256, seed: int = 1234) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """All sums a+b with a, b in 0..99, split into (train, held-out eval) with a fixed seed."""
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(rows)
    return rows[n_eval:], rows[:n_eval]


def model_config(hidden: int = 128, layers: int = 4):  # -> transformers.LlamaConfig
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(SPECIAL) + len(CHARS), hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=32, tie_word_embeddings=False)


def exact_match(model: Llama, loader: LlamaLoader) -> float:
    """Fraction of held-out sums whose whole answer (and the stop token) the model predicts greedily.

    Teacher forcing with argmax at every answer position equals greedy decoding
    when all of them are right, and it costs one forward pass per batch.
    """
    model.eval()
    right = total = 0
    for batch in loader:
        logits = model.logits(batch["input_ids"], batch["attention_mask"])
        pred = logits[:, :-1].argmax(-1).cpu()
        labels = batch["labels"][:, 1:]
        ok = ((pred == labels) | (labels == IGNORE_INDEX)).all(dim=1)
        right += int(ok.sum())
        total += len(ok)
    stats = torch.tensor([right, total], dtype=torch.float64)
    torch.distributed.all_reduce(stats)
    model.train()
    return float(stats[0] / stats[1])


def save_logits(model: Llama, loader: LlamaLoader, path: Path, rank0: bool) -> None:
    """Rank 0's first held-out batch and the model's logits on it (every rank runs the forward: a collective)."""
    model.eval()
    batch = next(iter(loader))
    with torch.no_grad():
        logits = model.logits(batch["input_ids"], batch["attention_mask"]).cpu()
    if rank0:
        torch.save({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "logits": logits},
                   path)
    model.train()


@experiment("tiny_llama", seed=0)
@param("steps", default=300, description="optimizer steps")
@param("global_batch", default=64, description="sequences per step over all ranks")
@param("lr", default=3e-3, description="peak learning rate")
@param("engine", default="fsdp", options=["fsdp", "deepspeed"])
@param("precision", default="fp32", options=["fp32", "bf16", "bf16_pure", "fp16"])
@param("zero_stage", default=3, options=[0, 2, 3])
@param("sharding", default="auto", options=["auto", "full", "hybrid", "replicate"],
       description="over which ranks: auto, full (every rank), hybrid (within each node), replicate")
@param("diloco_every", default=0, description="DiLoCo: nodes meet every H steps (0: every step, no DiLoCo)")
@param("outer_lr", default=0.7, description="DiLoCo's outer learning rate")
@param("outer_momentum", default=0.9, description="DiLoCo's outer Nesterov momentum")
@param("diloco_quantize", default="none", description="DiLoCo's pseudo-gradients: none (fp32), bf16 or int8")
@param("hidden", default=128, description="model width")
@param("layers", default=4, description="decoder layers")
@param("packing", default=False, description="pack several sums per row")
@param("checkpoint_every", default=100, description="steps between checkpoints")
@param("async_save", default=False, description="write checkpoints in the background while training goes on")
@param("eval_every", default=100, description="steps between evaluations (0: only at the end)")
@param("metrics_file", default="", description="append one JSON line per step here (rank 0)")
@param("stop_after", default=-1, description="testing: stop after this step, as if interrupted")
@param("crash_at", default=-1, description="testing: the last rank exits at this step on the first attempt")
@param("activation_checkpointing", default=False)
@param("logits_file", default="", description="testing: rank 0 saves the trained model's logits on its "
       "first held-out batch here (torch.save), to compare an export with")
def train(params) -> None:
    world = params.world_size
    if params.global_batch % world:
        raise ValueError(f"global_batch={params.global_batch} must divide by the {world} ranks")
    tokenizer = make_tokenizer()
    train_rows, eval_rows = make_data()
    diloco = None if params.diloco_every == 0 else DiLoCo(
        every=params.diloco_every, outer_lr=params.outer_lr, momentum=params.outer_momentum,
        quantize=None if params.diloco_quantize == "none" else params.diloco_quantize)
    model = Llama(model_config(params.hidden, params.layers), engine=params.engine, precision=params.precision,
                  zero_stage=params.zero_stage, sharding=params.sharding, diloco=diloco,
                  activation_checkpointing=params.activation_checkpointing,
                  seed=params.get("seed", 0) or 0)
    optimizer = model.make_optimizer(torch.optim.AdamW, lr=params.lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, params.steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / max(params.steps, 1)))
    scaler = model.grad_scaler()
    loader = LlamaLoader(PromptCompletionDataset(train_rows), tokenizer, max_sequence_length=16,
                         batch_size_per_gpu=params.global_batch // world, packing=params.packing,
                         seed=params.get("seed", 0) or 0)
    eval_loader = LlamaLoader(PromptCompletionDataset(eval_rows), tokenizer, max_sequence_length=16,
                              batch_size_per_gpu=len(eval_rows) // world, shuffle=False)
    ckpt = Checkpoint(model, optimizer, scheduler, scaler, every=params.checkpoint_every, keep_last=2,
                      async_save=params.async_save)
    start = ckpt.load_latest(loader)
    rank0 = params.rank == 0
    if rank0:
        print(f"tiny_llama: {world} ranks, engine={params.engine}, precision={params.precision}, "
              f"steps {start}..{params.steps}, checkpoints in {ckpt.directory}", flush=True)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    timer = StepTimer(optimizer=optimizer)   # rank 0 also writes RUN_DIR/metrics.jsonl (higgsfield metrics, ui)
    for step, batch in loader.iterate(start, max_steps=params.steps):
        if step == params.crash_at and attempt == 0 and params.rank == world - 1:
            os._exit(17)  # a worker dies without cleanup, as on a real crash
        loss = model(batch)
        model.backward(loss, scaler)
        clip_grad_norm(model, optimizer, 1.0, scaler)
        model.step(optimizer, scaler)
        scheduler.step()
        metrics = timer.step(step, loss, int(batch["num_tokens"]))
        ckpt.maybe_save(step, loader)
        last = step + 1 == params.steps
        evaluate = (params.eval_every and (step + 1) % params.eval_every == 0) or last
        score = exact_match(model, eval_loader) if evaluate else None
        if rank0:
            if step % 20 == 0 or score is not None:
                print(metrics if score is None else f"{metrics} | eval exact match {score:.1%}", flush=True)
            if params.metrics_file:
                with open(Path(params.metrics_file), "a") as f:
                    f.write(json.dumps({"step": step, "loss": metrics.loss, "eval": score, "attempt": attempt,
                                        "cross_node_bytes": metrics.cross_node_bytes}) + "\n")
        if step == params.stop_after:
            break
    ckpt.wait()
    ckpt.wait_uploads(timeout=120)   # the last step's mirror upload and buddy copy
    if params.logits_file:
        save_logits(model, eval_loader, Path(params.logits_file), rank0)
