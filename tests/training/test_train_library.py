"""The training library in one process (a one-rank gloo group): checkpoints, export, errors."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("transformers")

from higgsfield.checkpoint import MARKER, Checkpoint, checkpoint_dir  # noqa: E402
from higgsfield.llama import Llama  # noqa: E402
from higgsfield.loaders import LlamaLoader  # noqa: E402
from higgsfield.training import GradScaler, clip_grad_norm  # noqa: E402


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (4, 12), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "labels": labels}


def _train(model, optimizer, steps, start=0, ckpt=None, scaler=None, sched=None):
    out = []
    for step in range(start, steps):
        loss = model(_batch(step))
        model.backward(loss, scaler)
        clip_grad_norm(model, optimizer, 1.0, scaler)
        model.step(optimizer, scaler)
        if sched is not None:
            sched.step()
        out.append(loss.item())
        if ckpt is not None:
            ckpt.maybe_save(step)
    return out


def _setup(tmp_path, precision="fp32"):
    model = Llama(_config(), precision=precision, activation_checkpointing=False)
    opt = model.make_optimizer(lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = model.grad_scaler()
    return model, opt, sched, scaler, Checkpoint(model, opt, sched, scaler, every=3, keep_last=2,
                                                 directory=tmp_path / "ck")


def test_resume_in_process_equals_uninterrupted(single_rank, tmp_path):
    torch.manual_seed(0)
    model, opt, _, _, _ = _setup(tmp_path / "a")
    full = _train(model, opt, 8)
    model, opt, _, _, ckpt = _setup(tmp_path / "b")
    _train(model, opt, 6, ckpt=ckpt)  # saves after steps 2 and 5
    assert [p.name for p in ckpt.complete()] == ["step_00000003", "step_00000006"]
    model, opt, _, _, ckpt = _setup(tmp_path / "b")
    start = ckpt.load_latest()
    assert start == 6
    assert _train(model, opt, 8, start=start) == pytest.approx(full[6:], rel=1e-6)


def test_keep_last_and_incomplete_checkpoints_are_ignored(single_rank, tmp_path):
    model, opt, sched, _, ckpt = _setup(tmp_path)
    _train(model, opt, 9, ckpt=ckpt, sched=sched)
    assert [p.name for p in ckpt.complete()] == ["step_00000006", "step_00000009"]
    # a crash mid-save: a newer directory without its marker, and a leftover temporary one
    shutil.copytree(ckpt.directory / "step_00000009", ckpt.directory / "step_00000012")
    (ckpt.directory / "step_00000012" / MARKER).unlink()
    (ckpt.directory / ".tmp-step_00000015").mkdir()
    model, opt, sched, _, ckpt = _setup(tmp_path)
    assert ckpt.load_latest() == 9
    assert sched.last_epoch == 9


def test_scheduler_scaler_and_rng_are_restored(single_rank, tmp_path):
    model, opt, sched, scaler, ckpt = _setup(tmp_path, precision="fp16")
    assert isinstance(scaler, GradScaler)
    _train(model, opt, 3, ckpt=ckpt, scaler=scaler, sched=sched)
    scale = scaler.get_scale()
    expected = torch.rand(3)  # the RNG state right after the save
    model, opt, sched, scaler, ckpt = _setup(tmp_path, precision="fp16")
    scaler.scale_value = 1.0
    torch.manual_seed(123)
    assert ckpt.load_latest() == 3
    assert scaler.get_scale() == scale
    assert sched.last_epoch == 3
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_directory_comes_from_the_run_names():
    env = {"PROJECT_NAME": "p", "EXPERIMENT_NAME": "e", "RUN_NAME": "r"}
    assert checkpoint_dir(env=env).parts[-5:] == ("higgsfield", "p", "experiments", "e", "r")
    assert str(checkpoint_dir(env={**env, "HIGGSFIELD_CHECKPOINT_DIR": "/x/y"})) == "/x/y"
    assert checkpoint_dir(project="q", env=env).parts[-4] == "q"


def test_save_huggingface_model_loads_with_transformers(single_rank, tmp_path):
    from transformers import LlamaForCausalLM

    model = Llama(_config(), precision="bf16")
    opt = model.make_optimizer(lr=1e-2)
    _train(model, opt, 2)
    model.save_huggingface_model(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = _batch(99)["input_ids"]
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
    # our model computes in bf16; compare a fp32 copy to be exact
    ours = Llama(str(tmp_path / "hf"), precision="fp32", activation_checkpointing=False)
    assert torch.allclose(ours.logits(ids), expected, atol=1e-5)
    assert torch.allclose(model.logits(ids), expected, atol=0.1)


def test_rank0_init_and_local_directory_give_the_same_weights(single_rank, tmp_path):
    a = Llama(_config(), precision="fp32", cpu_init_rank0=True, seed=3)
    b = Llama(_config(), precision="fp32", cpu_init_rank0=False, seed=3)
    ids = _batch(1)["input_ids"]
    assert torch.allclose(a.logits(ids), b.logits(ids), atol=1e-6)


@pytest.mark.parametrize("stage", [0, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16_pure", "fp16"])
def test_every_precision_and_stage_trains(single_rank, precision, stage):
    model = Llama(_config(), precision=precision, zero_stage=stage, activation_checkpointing=stage == 3)
    opt = model.make_optimizer(lr=1e-2)
    losses = []
    for _ in range(6):
        losses.append(_train(model, opt, 1, scaler=model.grad_scaler() if precision == "fp16" else None)[0])
    assert losses[-1] < losses[0]
    master = next(iter(model.parameters()))
    assert master.dtype == (torch.bfloat16 if precision == "bf16_pure" else torch.float32)


def test_fp16_scaler_skips_overflowing_steps(single_rank):
    model = Llama(_config(), precision="fp16", activation_checkpointing=False)
    opt = model.make_optimizer(lr=1e-2)
    scaler = GradScaler(init_scale=2.0**60)  # overflows fp16 gradients
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(_batch(0))
    model.backward(loss, scaler)
    clip_grad_norm(model, opt, 1.0, scaler)
    assert model.step(opt, scaler) is False
    assert scaler.get_scale() == 2.0**59
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))


# -- bad input: a ValueError a user understands -----------------------------------------------

def test_unknown_precision(single_rank):
    with pytest.raises(ValueError, match="unknown precision 'fp8'.*bf16"):
        Llama(_config(), precision="fp8")


def test_zero_stage_1_is_refused_with_fsdp(single_rank):
    with pytest.raises(ValueError, match="zero_stage=1.*no FSDP2 equivalent"):
        Llama(_config(), zero_stage=1)


def test_unknown_engine_and_bad_model(single_rank):
    with pytest.raises(ValueError, match="unknown engine"):
        Llama(_config(), engine="megatron")
    with pytest.raises(ValueError, match="LlamaConfig"):
        Llama(42)


def test_fp16_without_a_scaler(single_rank, tmp_path):
    model = Llama(_config(), precision="fp16", activation_checkpointing=False)
    opt = model.make_optimizer(lr=1e-2)
    loss = model(_batch(0))
    with pytest.raises(ValueError, match="fp16.*scaler = model.grad_scaler"):
        model.backward(loss)
    with pytest.raises(ValueError, match="fp16.*scaler"):
        clip_grad_norm(model, opt, 1.0)
    with pytest.raises(ValueError, match="fp16.*scaler"):
        Checkpoint(model, opt, directory=tmp_path)


def test_missing_tokenizer():
    with pytest.raises(ValueError, match="needs a tokenizer.*none is downloaded"):
        LlamaLoader([[("hi", True)]], None, max_sequence_length=8, batch_size_per_gpu=1)


def test_bad_checkpoint_args(single_rank, tmp_path):
    model = Llama(_config(), precision="fp32", activation_checkpointing=False)
    opt = model.make_optimizer(lr=1e-2)
    with pytest.raises(ValueError, match="every"):
        Checkpoint(model, opt, every=0, directory=tmp_path)
    with pytest.raises(ValueError, match="keep_last"):
        Checkpoint(model, opt, keep_last=0, directory=tmp_path)


def test_async_save_is_marked_only_when_finished(single_rank, tmp_path):
    model = Llama(_config(), precision="fp32", activation_checkpointing=False)
    opt = model.make_optimizer(lr=1e-2)
    ckpt = Checkpoint(model, opt, every=2, keep_last=1, directory=tmp_path / "ck", async_save=True)
    _train(model, opt, 4, ckpt=ckpt)  # saves after steps 1 and 3; the second is in flight
    ckpt.wait()
    assert [p.name for p in ckpt.complete()] == ["step_00000004"]
    assert not list((tmp_path / "ck").glob(".tmp-*"))
    model2 = Llama(_config(), precision="fp32", activation_checkpointing=False)
    opt2 = model2.make_optimizer(lr=1e-2)
    assert Checkpoint(model2, opt2, directory=tmp_path / "ck").load_latest() == 4
    ids = _batch(5)["input_ids"]
    assert torch.allclose(model.logits(ids), model2.logits(ids))
