"""alpaca: fine-tune LLaMA-2 (7B, 13B or 70B) on Stanford Alpaca, on every GPU of every node.

The real-world shape of a higgsfield experiment (GPU only)::

    higgsfield run alpaca --param size=7b                       # all nodes in higgsfield.yml
    higgsfield run alpaca --param size=70b --param packing=true --param push_to_hub=me/alpaca-70b

It downloads the model and tokenizer (``HF_TOKEN`` from the secrets for gated
LLaMA weights) and the data set when it runs, never at import. FSDP2 shards
the model over all ranks; rank 0 alone reads the weights and broadcasts them;
it checkpoints every ``checkpoint_every`` steps and, restarted with the same
run name, continues where it stopped. Rough needs in bf16 with ZeRO-3 and
activation checkpointing: 7B on 1 node of 8x40GB, 70B on 4+ nodes of 8x80GB.
It returns with the process group still up: higgsfield's entrypoint destroys it
(NCCL finishes its work) and exits without interpreter finalization.
"""

from __future__ import annotations

import math

import torch

from higgsfield.checkpoint import Checkpoint
from higgsfield.dataset import AlpacaDataset
from higgsfield.experiment import experiment, param
from higgsfield.llama import Llama7b, Llama13b, Llama70b
from higgsfield.loaders import LlamaLoader
from higgsfield.training import StepTimer, clip_grad_norm

MODELS = {"7b": (Llama7b, "meta-llama/Llama-2-7b-hf"), "13b": (Llama13b, "meta-llama/Llama-2-13b-hf"),
          "70b": (Llama70b, "meta-llama/Llama-2-70b-hf")}


@experiment("alpaca", seed=42)
@param("size", default="7b", options=["7b", "13b", "70b"], description="LLaMA-2 size")
@param("engine", default="fsdp", options=["fsdp", "deepspeed"])
@param("precision", default="bf16", options=["bf16", "bf16_pure", "fp16", "fp32"])
@param("zero_stage", default=3, options=[0, 2, 3])
@param("lr", default=2e-5, description="peak learning rate")
@param("epochs", default=3)
@param("batch_size_per_gpu", default=4)
@param("max_sequence_length", default=2048)
@param("packing", default=False, description="pack several examples per row")
@param("dataset", default="tatsu-lab/alpaca", description="a hub data set with instruction/input/output")
@param("checkpoint_every", default=200)
@param("push_to_hub", default="", description="hub repo to upload the result to (empty: keep it local)")
def train(params) -> None:
    if not torch.cuda.is_available():
        raise ValueError("alpaca trains LLaMA-2 7B-70B and needs GPUs; on CPU run tiny_llama instead")
    from datasets import load_dataset
    from transformers import AutoTokenizer

    build, hub_name = MODELS[params.size]
    tokenizer = AutoTokenizer.from_pretrained(hub_name)
    rows = load_dataset(params.dataset, split="train")

    model = build(engine=params.engine, precision=params.precision, zero_stage=params.zero_stage)
    optimizer = model.make_optimizer(torch.optim.AdamW, lr=params.lr, weight_decay=0.0)
    scaler = model.grad_scaler()
    loader = LlamaLoader(AlpacaDataset(rows), tokenizer, max_sequence_length=params.max_sequence_length,
                         batch_size_per_gpu=params.batch_size_per_gpu, packing=params.packing, seed=42)
    total = params.epochs * len(loader)
    warmup = max(1, total // 30)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    ckpt = Checkpoint(model, optimizer, scheduler, scaler, every=params.checkpoint_every, keep_last=2)
    start = ckpt.load_latest(loader)
    timer = StepTimer(model.flops_per_token(params.max_sequence_length), optimizer=optimizer)

    for step, batch in loader.iterate(start, max_steps=total):
        loss = model(batch)
        model.backward(loss, scaler)
        clip_grad_norm(model, optimizer, 1.0, scaler)
        model.step(optimizer, scaler)
        scheduler.step()
        metrics = timer.step(step, loss, int(batch["num_tokens"]))
        if params.rank == 0 and step % 10 == 0:
            print(f"{metrics} | epoch {step // len(loader)}", flush=True)   # metrics carry the lr
        ckpt.maybe_save(step, loader)

    if total % params.checkpoint_every:
        ckpt.save(total - 1, loader)  # the final state, unless maybe_save just wrote it
    out = ckpt.directory / "huggingface"
    model.save_huggingface_model(out, tokenizer=tokenizer)
    if params.push_to_hub:
        model.push_to_hub(params.push_to_hub, tokenizer=tokenizer)
    if params.rank == 0:
        print(f"saved {out}", flush=True)
