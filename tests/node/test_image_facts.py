"""An image's packages, listed once by deploy (higgsfield.node.code.image_facts), reach ``invoker facts`` and the
drift comparison: equal tags on two nodes can hide different packages (each node builds its own image)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from higgsfield.contract.drift import compare
from higgsfield.node.code import facts as factsmod
from higgsfield.node.code.image_facts import ImageFacts, facts_of, listed
from higgsfield.node.state.home import NodeState

pytestmark = pytest.mark.timeout(60)
TAG = "hf-proj:0123456789ab"


def _image_json(state: Path, record: dict[str, object]) -> None:
    root = NodeState(state).project("proj")
    root.mkdir(parents=True, exist_ok=True)
    (root / "image.json").write_text(json.dumps({"tag": TAG, "dockerfile": "Dockerfile", "base_image": None,
                                                 "built_at": 1.0, **record}))


def test_one_tag_with_other_packages_is_drift(tmp_path: Path) -> None:
    pkgs = {"torch": "2.6.0+cu124", "nvidia-nccl-cu12": "2.21.5", "transformers": "4.46.0"}
    a, b = tmp_path / "a", tmp_path / "b"
    _image_json(a, {"python": "3.11.10", "cuda": "12.4", "packages": pkgs})
    _image_json(b, {"python": "3.11.10", "cuda": "12.4", "packages": {**pkgs, "transformers": "4.45.2"}})
    fa = factsmod.facts(NodeState(a), "proj", "docker", node="n0")
    fb = factsmod.facts(NodeState(b), "proj", "docker", node="n1")
    assert (fa.runtime, fa.env_key, fa.python, fa.torch, fa.cuda, fa.nccl) == \
        ("docker", TAG, "3.11.10", "2.6.0+cu124", "12.4", "2.21.5")
    assert fa.packages == pkgs
    assert [d.line() for d in compare([fa, fa, fb])] == ["n1: transformers 4.45.2 (the other 2 nodes: 4.46.0)"]


def test_an_image_not_listed_is_not_known_and_not_drift(tmp_path: Path) -> None:
    _image_json(tmp_path / "old", {})           # what an earlier release wrote, or a listing that failed
    _image_json(tmp_path / "new", {"python": "3.11.10", "cuda": "12.4", "packages": {"torch": "2.6.0+cu124"}})
    old = factsmod.facts(NodeState(tmp_path / "old"), "proj", "auto", node="n0")
    new = factsmod.facts(NodeState(tmp_path / "new"), "proj", "docker", node="n1")
    assert (old.runtime, old.env_key, old.packages, old.python) == ("docker", TAG, None, None)
    # its Python, torch and CUDA are as unknown as its packages: no difference against a listed node of one tag
    assert compare([old, new, new]) == []
    assert factsmod.facts(NodeState(tmp_path / "new"), "proj", "process", node="n0").runtime == "process"  # asked for a venv


@pytest.mark.parametrize("bad", [None, [], {"packages": None}, {"packages": {"torch": 2}},
                                 {"packages": {"x" * 300: "1"}}, {"packages": "torch"}])
def test_a_listing_of_another_shape_is_not_known(bad: object) -> None:
    assert facts_of(bad) is None


def test_a_listing_keeps_what_it_can_read() -> None:
    assert facts_of({"python": 3, "cuda": ["12"], "packages": {}}) == ImageFacts(packages={})


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(180)
def test_the_bed_image_is_listed_by_its_own_python(testbed) -> None:  # type: ignore[no-untyped-def]
    found = listed(testbed.base_image)
    assert found is not None
    assert found.python is not None and found.python.startswith("3.11.")
    assert found.packages["torch"].startswith(_bed_torch()) and found.cuda is None   # the CPU build
    assert "numpy" in found.packages and all(k == k.lower() for k in found.packages)
    assert listed("hf-no-such-image:000000000000") is None   # never fails a deploy


def _bed_torch() -> str:
    import testbed

    return str(testbed.impl.TORCH_VERSION)
