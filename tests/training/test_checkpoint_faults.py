"""Checkpoint saves that fail: a full disk (a real tmpfs), a rank that cannot write (a real RLIMIT_FSIZE).

What must hold: the failing save raises CheckpointError on every rank (none is left
waiting in a collective), its partial directory is gone, the previous checkpoint is
byte for byte intact and loads, keep-last-k never deletes it because a newer save
failed, and a killed save's leftovers are cleared before the next save needs the space.

The tmpfs tests need root (mount); the test bed's version is tests/faults/test_checkpoint_disk_full.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from higgsfield.checkpoint import MARKER, Checkpoint
from higgsfield.contract.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "ckpt_fault_worker.py"


def _exe(name: str) -> str:
    return shutil.which(name) or name


@contextlib.contextmanager
def _tmpfs(path: Path, size: int) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run([_exe("mount"), "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run([_exe("umount"), "-l", str(path)], check=False)


def _resize(path: Path, size: int) -> None:
    subprocess.run([_exe("mount"), "-o", f"remount,size={size}", str(path)], check=True)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    loss = model(torch.randn(8, 128, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def _pages(n: float) -> int:
    return int(n) // 4096 * 4096 + 4096


def test_a_full_disk_fails_the_save_cleanly_and_the_last_checkpoint_survives(single_rank, tmp_path):
    # how big one checkpoint of this model is, measured on an ordinary directory
    model, opt = _model()
    _step(model, opt, 0)
    probe = Checkpoint(model, opt, every=1, directory=tmp_path / "probe")
    probe.save(0)
    size = _size(probe.latest())  # type: ignore[arg-type]

    with _tmpfs(tmp_path / "ck", _pages(1.5 * size)) as d:   # room for one checkpoint and a half
        model, opt = _model()
        ckpt = Checkpoint(model, opt, every=3, keep_last=1, directory=d)
        for s in range(3):
            _step(model, opt, s)
            ckpt.maybe_save(s)
        good = d / "step_00000003"
        assert (good / MARKER).is_file()
        before = _digest(good)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        for s in range(3, 5):
            _step(model, opt, s)
        _step(model, opt, 5)
        t0 = time.monotonic()
        with pytest.raises(CheckpointError) as err:
            ckpt.maybe_save(5)
        took = time.monotonic() - t0
        msg = str(err.value)
        assert f"checkpoint save of step_00000006 in {d} failed: rank 0:" in msg
        assert "is full" in msg and "the last complete checkpoint, step_00000003, is intact" in msg
        assert "\n" not in msg
        # nothing half-written is left, the previous checkpoint is untouched and keep_last=1 kept it
        assert sorted(p.name for p in d.iterdir()) == ["step_00000003"]
        assert _digest(good) == before
        print(f"\ndisk full: save failed cleanly in {took * 1000:.0f} ms, checkpoint of {size // 1024} KiB kept")

        model2, opt2 = _model()
        assert Checkpoint(model2, opt2, directory=d).load_latest() == 3
        for k, v in model2.state_dict().items():
            assert torch.equal(v, weights[k]), k

        # space again: the next save works, and only now keep_last=1 drops step 3
        _resize(d, _pages(2.5 * size))
        for s in range(6, 9):
            _step(model, opt, s)
            ckpt.maybe_save(s)
        assert sorted(p.name for p in d.iterdir()) == ["step_00000009"]

        # a save killed half-way left a full-size partial directory: 2 of 2.5 checkpoints' room is used;
        # the next save clears it before writing (else it would not fit) and is not blocked by it
        shutil.copytree(d / "step_00000009", d / ".tmp-step_00000012")
        (d / ".tmp-step_00000012" / MARKER).unlink()
        for s in range(9, 12):
            _step(model, opt, s)
            ckpt.maybe_save(s)
        assert sorted(p.name for p in d.iterdir()) == ["step_00000012"]


def test_a_failed_async_save_is_reported_at_wait_and_keeps_the_last(single_rank, tmp_path):
    model, opt = _model()
    _step(model, opt, 0)
    probe = Checkpoint(model, opt, every=1, directory=tmp_path / "probe")
    probe.save(0)
    size = _size(probe.latest())  # type: ignore[arg-type]
    with _tmpfs(tmp_path / "ck", _pages(1.5 * size)) as d:
        model, opt = _model()
        ckpt = Checkpoint(model, opt, every=2, keep_last=1, directory=d, async_save=True)
        _step(model, opt, 0)
        _step(model, opt, 1)
        ckpt.maybe_save(1)
        ckpt.wait()
        assert ckpt.latest() == d / "step_00000002"
        _step(model, opt, 2)
        _step(model, opt, 3)
        with pytest.raises(CheckpointError, match="step_00000002, is intact"):
            ckpt.maybe_save(3)   # the weights are written in the background ...
            ckpt.wait()          # ... so the failure may surface only here
        assert sorted(p.name for p in d.iterdir()) == ["step_00000002"]
        model2, opt2 = _model()
        assert Checkpoint(model2, opt2, directory=d).load_latest() == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_rank_that_cannot_write_fails_the_save_on_every_rank(single_rank, tmp_path):
    """Rank 1 alone hits EFBIG: both ranks raise the same error, train on in step and save again."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "HIGGSFIELD_CHECKPOINT_DIR"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(WORKER), str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    seen = [json.loads((tmp_path / f"result_rank{r}.json").read_text()) for r in (0, 1)]
    assert seen[0]["error"] == seen[1]["error"], "the ranks disagree on the failed save"
    assert seen[0]["failures"] == seen[1]["failures"] == {"1": "rank 1: OSError: [Errno 27] File too large"}
    assert "checkpoint save of step_00000004" in seen[0]["error"]
    assert "the last complete checkpoint, step_00000002, is intact" in seen[0]["error"]
    assert seen[0]["after_failure"] == ["step_00000002"]      # partial removed, keep_last=1 kept the last good
    assert seen[0]["final"] == ["step_00000006"]              # and the next save, in step, worked
    model = torch.nn.Linear(64, 64)  # the 2-rank checkpoint loads on 1
    assert Checkpoint(model, torch.optim.AdamW(model.parameters()), directory=tmp_path / "ck").load_latest() == 6


def test_a_resave_of_the_same_step_replaces_it_without_a_moment_without_one(single_rank, tmp_path):
    """Saving step N again (e.g. a run re-done from an older checkpoint) swaps the directories atomically."""
    model, opt = _model()
    ckpt = Checkpoint(model, opt, every=1, keep_last=2, directory=tmp_path / "ck")
    _step(model, opt, 0)
    ckpt.save(0)
    first = _digest(tmp_path / "ck" / "step_00000001")
    _step(model, opt, 1)   # other weights, saved under the same step
    ckpt.save(0)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_00000001"]
    assert _digest(tmp_path / "ck" / "step_00000001") != first
    model2, opt2 = _model()
    assert Checkpoint(model2, opt2, directory=tmp_path / "ck").load_latest() == 1
    for k, v in model2.state_dict().items():
        assert torch.equal(v, weights[k]), k
