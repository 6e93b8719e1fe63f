"""End-to-end training under torchrun (CPU, gloo): learning, topology invariance, resume, crash.

Each run is tiny_llama (hidden 64, 2 layers, 8 sequences per step, 24 steps,
a checkpoint every 8) launched through ``launch.py``; rank 0 writes one JSON line
per step. One uninterrupted 2-process run per engine is the reference the
others are compared with, so each test launches as few processes as it can
(process start-up, mostly importing torch and transformers, dominates): the
resumes start from the reference's own checkpoint after step 15, copied as
another run's, rather than from a run of their own cut short there.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from trainutil import losses, ok, torchrun

pytestmark = pytest.mark.slow

STEPS, EVERY = 24, 8
BASE = {"steps": STEPS, "checkpoint_every": EVERY, "precision": "fp32"}


def _close(a: dict[int, float], b: dict[int, float], steps: range, rtol: float) -> None:
    for s in steps:
        assert math.isclose(a[s], b[s], rel_tol=rtol, abs_tol=1e-6), f"step {s}: {a[s]} != {b[s]}\n{a}\n{b}"


@pytest.fixture(scope="module", params=["fsdp", "deepspeed"])
def reference(request, tmp_path_factory):
    """An uninterrupted 2-process run: (engine, work dir, step -> loss)."""
    tmp = tmp_path_factory.mktemp(f"ref-{request.param}")
    # an empty extensions directory, as a fresh container or node user has: what a run JIT-builds lands here
    proc, lines = torchrun(2, tmp, {**BASE, "engine": request.param}, run="full",
                           env={"TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions")})
    ok(proc)
    return request.param, tmp, losses(lines)


def test_loss_falls(reference):
    _, tmp, loss = reference
    assert sorted(loss) == list(range(STEPS))
    # DeepSpeed on CPU builds no op at start (its shared-memory all-reduce is for inference: 30 CPU-s of g++)
    built = tmp / "torch_extensions"
    assert not built.exists() or not any(built.rglob("*.so")), sorted(built.rglob("*"))
    first, last = [loss[s] for s in range(5)], [loss[s] for s in range(STEPS - 5, STEPS)]
    assert sum(last) < 0.85 * sum(first), loss


def test_one_process_follows_the_two_process_trajectory(reference):
    engine, tmp, full = reference
    proc, one = torchrun(1, tmp, {**BASE, "engine": engine, "stop_after": EVERY - 1}, run="one")
    ok(proc)
    _close(full, losses(one), range(EVERY), rtol=2e-4)


def _reference_up_to(tmp: Path, step: int, run: str) -> None:
    """The reference run's checkpoints up to ``step`` (its keep-last-2 left steps 16 and 24), as ``run``'s own."""
    src = tmp / "ckpt" / "full"
    assert {p.name for p in src.iterdir() if p.name.startswith("step_")} == {"step_00000016", "step_00000024"}
    shutil.copytree(src, tmp / "ckpt" / run, ignore=lambda d, names: [
        n for n in names if Path(d) == src and n.startswith("step_") and int(n[5:]) > step])


def test_resume_equals_uninterrupted_and_moves_from_two_processes_to_one(reference):
    engine, tmp, full = reference
    resumed_at = 2 * EVERY
    _reference_up_to(tmp, resumed_at, "cut")
    proc, second = torchrun(2, tmp, {**BASE, "engine": engine}, run="cut")
    ok(proc)
    assert sorted(losses(second)) == list(range(resumed_at, STEPS)), "the run must start at the checkpoint"
    _close(full, losses(second), range(resumed_at, STEPS), rtol=1e-5)
    if engine == "fsdp":  # the same checkpoint, resumed by one process (DCP reshards on load)
        _reference_up_to(tmp, resumed_at, "moved")
        proc, moved = torchrun(1, tmp, {**BASE, "engine": engine}, run="moved")
        ok(proc)
        assert sorted(losses(moved)) == list(range(resumed_at, STEPS))
        _close(full, losses(moved), range(resumed_at, STEPS), rtol=2e-4)


def test_crash_with_max_restarts_resumes_from_last_checkpoint(reference):
    engine, tmp, full = reference
    if engine != "fsdp":
        pytest.skip("the restart path does not depend on the engine; one is enough on 2 cores")
    crash_at = EVERY + 3
    proc, lines = torchrun(2, tmp, {**BASE, "crash_at": crash_at}, run="crash", max_restarts=1)
    ok(proc)
    first = [m["step"] for m in lines if m["attempt"] == 0]
    second = [m["step"] for m in lines if m["attempt"] == 1]
    assert first == list(range(crash_at)), first          # died before finishing step crash_at
    assert second == list(range(EVERY, STEPS)), second    # resumed at the last checkpoint: nothing else lost
    _close(full, losses(lines), range(STEPS), rtol=1e-5)
