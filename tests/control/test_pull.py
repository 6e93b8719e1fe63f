"""``higgsfield pull`` on a localhost node: a real run that checkpoints, pulled, loaded on one rank, equal.

The run (2 ranks, process runtime, its own HOME so its checkpoints land in this test's
directory) saves every 4 steps and, at its end, rank 0 writes its own state (``final.pt``):
what the pulled step must equal. Then the pull's promises one by one: a re-run copies
nothing, a cut file is completed, a damaged one fetched again, ``--logs`` brings the logs
and the record, a bad ``--step`` is one line, exit 2, and so is ``--hf`` of a model with no Hugging Face config
(the positive ``--hf`` is tests/training/test_checkpoint_node_local.py's, on FSDP and ZeRO-3).

    pytest tests/control/test_pull.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pull_helpers import assert_same_state, load_step

from higgsfield.control.backends.nodes.pull import PullError, choose_step, merge_parts, safe_rel, step_name

PROJECT = "pullproj"
WIDTH = 16

PULL_STEPS = '''\
"""Trains a linear layer, checkpointing every few steps; rank 0 saves its final state to params.final."""
from higgsfield.experiment import experiment, param


@experiment("pull_steps", seed=0)
@param("steps", default=8)
@param("every", default=4)
@param("width", default=16)
@param("final", default="")
def pull_steps(params):
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import init_distributed

    init_distributed()
    model = torch.nn.Linear(params.width, params.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = Checkpoint(model, opt, every=params.every, keep_last=2)
    start = ckpt.load_latest()
    for step in range(start, params.steps):
        loss = model(torch.randn(8, params.width)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        ckpt.maybe_save(step)
    ckpt.wait()
    if dist.get_rank() == 0 and params.final:
        msd, osd = get_state_dict(model, opt)
        torch.save({"model": msd, "optim": osd}, params.final)
    dist.destroy_process_group()
'''


def hf(proj: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(proj.parent / "home")}
    env = {k: v for k, v in env.items() if not k.startswith("HIGGSFIELD_CHECKPOINT")}
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=proj, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The project, after a run of 8 steps (saves after steps 4 and 8) that wrote final.pt."""
    base = tmp_path_factory.mktemp("pull")
    proj = base / "proj"
    (proj / "src").mkdir(parents=True)
    (base / "home").mkdir()
    (proj / "src" / "pull_steps.py").write_text(PULL_STEPS)
    (proj / "higgsfield.yml").write_text(
        f"name: {PROJECT}\nnodes:\n  - host: localhost\nnproc_per_node: 2\nruntime: process\n"
        f"state_dir: {base / 'state'}\n")
    run = "pulled-run"
    r = hf(proj, "run", "pull_steps", "--run-name", run, "-p", f"final={base / 'final.pt'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return proj, run


def ckpt_root(proj: Path, run: str) -> Path:
    return proj.parent / "home" / ".cache" / "higgsfield" / PROJECT / "experiments" / "pull_steps" / run


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pull_brings_a_step_that_loads_on_one_rank_and_resumes_checks_and_refetches(trained: tuple[Path, str]) -> None:
    proj, run = trained
    dest = proj.parent / "dest"
    r = hf(proj, "pull", run, str(dest))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pulled step_00000008" in r.stdout and "0 already here" in r.stdout, r.stdout
    step = dest / "step_00000008"
    names = {p.name for p in step.iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt", "COMPLETE"} <= names, names
    assert json.loads((step / "COMPLETE").read_text())["mode"] == "shared"
    assert r.stderr == ""   # no progress bar when stderr is not a terminal

    state = load_step(dest, WIDTH, proj.parent / "loaded.pt")
    assert state["step"] == 8 and state["missing"] == []
    import torch

    assert_same_state(state, torch.load(proj.parent / "final.pt", weights_only=False))

    # a re-run copies nothing: every file is here with the node's sha256
    again = hf(proj, "pull", run, str(dest))
    assert again.returncode == 0 and "0 file(s) copied" in again.stdout, again.stdout + again.stderr

    # a cut file is completed from its size; a damaged one (same size) is fetched again
    shard = step / "__1_0.distcp"
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])
    meta = step / ".metadata"
    good_meta = meta.read_bytes()
    meta.write_bytes(bytes(b ^ 0xFF for b in good_meta[:8]) + good_meta[8:])
    fixed = hf(proj, "pull", run, str(dest), "--step", "8")
    assert fixed.returncode == 0 and "2 file(s) copied" in fixed.stdout, fixed.stdout + fixed.stderr
    assert shard.read_bytes() == whole and meta.read_bytes() == good_meta
    assert_same_state(load_step(dest, WIDTH, proj.parent / "loaded2.pt"), state)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pull_logs_and_bad_steps(trained: tuple[Path, str]) -> None:
    proj, run = trained
    dest = proj.parent / "dest-logs"
    r = hf(proj, "pull", run, str(dest), "--logs", "--step", "latest")
    assert r.returncode == 0, r.stdout + r.stderr
    node = dest / "logs" / "localhost"
    assert json.loads((node / "run.json").read_text())["run"] == run
    assert (node / "spec.json").is_file()
    for rank in (0, 1):
        assert "step 7 loss" in (node / "logs" / f"rank{rank}.log").read_text()

    for bad, says in (("2", "step_00000002 of run 'pulled-run' is not complete on localhost"),
                      ("soon", "--step 'soon': give a step number")):
        out = hf(proj, "pull", run, str(dest), "--step", bad)
        assert out.returncode == 2, out.stdout + out.stderr
        assert says in out.stderr and out.stderr.count("\n") == 1, out.stderr
    # keep_last=2 kept step 4 too: an older step complete everywhere is pulled like the newest
    assert sorted(p.name for p in ckpt_root(proj, run).iterdir() if p.name.startswith("step_")) == \
        ["step_00000004", "step_00000008"]
    older = hf(proj, "pull", run, str(dest), "--step", "4")
    assert older.returncode == 0 and (dest / "step_00000004" / "COMPLETE").is_file(), older.stdout + older.stderr
    # --hf of a model that is not a higgsfield Llama (a plain Linear: no config): the step is pulled, the
    # conversion refused in one line, exit 2, and no half-written Hugging Face directory is left
    plain = hf(proj, "pull", run, str(dest), "--step", "4", "--hf")
    assert plain.returncode == 2, plain.stdout + plain.stderr
    assert "step_00000004 has no Hugging Face config (hf/config.json)" in plain.stderr, plain.stderr
    assert plain.stderr.count("\n") == 1 and "pulled step_00000004" in plain.stdout, plain.stdout + plain.stderr
    assert (dest / "step_00000004" / "COMPLETE").is_file() and not (dest / "hf").exists()


@pytest.mark.timeout(10)
def test_choose_step_names_the_nodes_lacking_it() -> None:
    per_node = [("gpu-1", ["step_00000004", "step_00000008"]), ("gpu-2", ["step_00000004"])]
    assert choose_step("r", per_node, None) == "step_00000004"
    assert choose_step("r", per_node, 4) == "step_00000004"
    with pytest.raises(PullError, match=r"step_00000008 of run 'r' is not complete on gpu-2 \(complete "
                                        r"everywhere: step_00000004\)"):
        choose_step("r", per_node, "8")
    with pytest.raises(PullError, match="no checkpoint complete on every node"):
        choose_step("r", [("gpu-1", ["step_00000004"]), ("gpu-2", "junk")], "latest")
    assert step_name("12") == "step_00000012"
    with pytest.raises(PullError):
        step_name("-1")


@pytest.mark.timeout(10)
def test_a_node_listing_never_names_a_path_outside_its_root() -> None:
    for bad in ("../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "a\nb", ""):
        assert not safe_rel(bad), bad
    assert safe_rel("step_00000004/__0_0.distcp") and safe_rel("logs/rank0.log")
    from higgsfield.control.backends.nodes.pull import RemoteFile

    a = [RemoteFile("n0", "/a/m", "s/.metadata", 1, "0" * 64), RemoteFile("n0", "/a/0", "s/__0_0.distcp", 1, "0" * 64)]
    b = [RemoteFile("n1", "/b/m", "s/.metadata", 2, "1" * 64), RemoteFile("n1", "/b/2", "s/__2_0.distcp", 1, "1" * 64)]
    merged = {f.rel: f.node for f in merge_parts([a, b])}
    assert merged == {"s/.metadata": "n0", "s/__0_0.distcp": "n0", "s/__2_0.distcp": "n1"}


@pytest.mark.timeout(10)
def test_the_node_lists_plain_files_only_never_through_a_symlink(tmp_path: Path) -> None:
    from higgsfield.node.observe.files import _walk, complete_steps

    root = tmp_path / "ckpt"
    (root / "step_00000004" / "sub").mkdir(parents=True)
    (root / "step_00000004" / "COMPLETE").write_text("{}")
    (root / "step_00000004" / "__0_0.distcp").write_bytes(b"x")
    (root / "step_00000004" / "sub" / "f").write_bytes(b"y")
    (tmp_path / "secret").write_text("s")
    (root / "step_00000004" / "link").symlink_to(tmp_path / "secret")
    (root / "step_00000004" / "dirlink").symlink_to(tmp_path)
    (root / "step_00000008").symlink_to(root / "step_00000004")   # a step that is a link: not a step
    (root / ".tmp-step_00000012").mkdir()
    assert complete_steps(root) == ["step_00000004"]
    assert _walk(root / "step_00000004") == ["COMPLETE", "__0_0.distcp", "sub/f"]
    assert complete_steps(tmp_path / "none") == [] and _walk(root / "step_00000008") == []
