"""A checkpoint's RNG state: restored exactly, and never unpickled (a rank's ``rng_rank<r>.pt`` is plain data).

The RNG files can come from a shared mirror, so a pickle planted there (or an
older checkpoint's pickled state) must not run code on a node: the load goes on,
restores the model and step, skips that rank's RNG and says so in one line. One
process, a one-rank gloo group, a path mirror (fsspec's local filesystem).
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from higgsfield._lib.rng_state import load_rng_state, rng_state
from higgsfield.checkpoint import Checkpoint

NAMES = {"project": "p", "experiment": "e", "run": "r"}


class Planted:
    """Unpickling this creates ``marker``: what a planted pickle could do instead of that."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return Path.touch, (self.marker,)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    loss = model(torch.randn(4, 16, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _draws() -> tuple[list[float], list[float], list[float]]:
    return [random.random() for _ in range(4)], np.random.rand(4).tolist(), torch.rand(4).tolist()


def _reseed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.timeout(120)
def test_a_saved_rng_state_gives_the_same_draws_after_a_load(single_rank, tmp_path):
    _reseed(7)
    random.gauss(0, 1)  # a cached gaussian is part of python's state
    model, opt = _model()
    _step(model, opt, 0)
    Checkpoint(model, opt, every=1, directory=tmp_path).save(0)
    expected = _draws()
    _reseed(123)
    model2, opt2 = _model()
    assert Checkpoint(model2, opt2, directory=tmp_path).load_latest() == 1
    assert _draws() == expected
    state = torch.load(tmp_path / "step_00000001" / "rng_rank0.pt", weights_only=True)  # plain data only
    assert state["format"] == 1 and isinstance(state["python"]["state"], list)


@pytest.mark.timeout(120)
def test_rng_state_round_trips_through_a_file_loaded_with_weights_only(tmp_path):
    _reseed(3)
    path = tmp_path / "rng.pt"
    torch.save(rng_state(), path)
    expected = _draws()
    _reseed(4)
    assert load_rng_state(path)
    assert _draws() == expected


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_pickle_planted_as_an_rng_file_on_the_mirror_is_not_run(single_rank, tmp_path, capfd, how):
    mirror = tmp_path / "mirror"
    model, opt = _model()
    _step(model, opt, 0)
    ckpt = Checkpoint(model, opt, every=1, directory=tmp_path / "node-a", mirror=str(mirror), **NAMES)
    ckpt.save(0)
    ckpt.wait_uploads()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    planted = list((mirror / "p" / "e" / "r" / "step_00000001").glob("*/part0/rng_rank0.pt"))
    assert len(planted) == 1, sorted(str(p) for p in mirror.rglob("*"))
    marker = tmp_path / "pwned"
    if how == "pickle":
        planted[0].write_bytes(pickle.dumps(Planted(marker)))
    else:
        torch.save(Planted(marker), planted[0])
    capfd.readouterr()

    # another node (an empty directory) resumes from the mirror: the planted file comes down and is loaded
    model2, opt2 = _model()
    assert Checkpoint(model2, opt2, directory=tmp_path / "node-b", mirror=str(mirror), **NAMES).load_latest() == 1
    assert not marker.exists(), "the planted pickle ran"
    for k, v in model2.state_dict().items():
        assert torch.equal(v, weights[k]), k
    err = capfd.readouterr().err
    warned = [line for line in err.splitlines() if "RNG state not restored" in line]
    assert len(warned) == 1 and str(tmp_path / "node-b" / "step_00000001" / "rng_rank0.pt") in warned[0], err


@pytest.mark.timeout(120)
def test_an_older_checkpoints_pickled_rng_state_still_resumes_without_it(single_rank, tmp_path, capfd):
    model, opt = _model()
    _step(model, opt, 0)
    Checkpoint(model, opt, every=1, directory=tmp_path).save(0)
    old = {"python": random.getstate(), "torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    torch.save(old, tmp_path / "step_00000001" / "rng_rank0.pt")  # as earlier releases wrote it
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    capfd.readouterr()
    _reseed(5)
    expected = _draws()
    _reseed(5)
    model2, opt2 = _model()
    _reseed(5)
    assert Checkpoint(model2, opt2, directory=tmp_path).load_latest() == 1
    assert _draws() == expected  # the generators were left as they were
    for k, v in model2.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert "RNG state not restored from" in capfd.readouterr().err
