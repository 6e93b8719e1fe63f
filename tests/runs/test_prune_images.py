"""`higgsfield prune --images` and deploy's `retention:` on a real Docker node of the test bed.

A project of its own (``hfprune``, so its images are ``hf-hfprune:*``: the images other tests
rely on are never candidates), deployed to hfnode0; an extra, older image of the project is
built beside the release's. The prune removes that one and keeps the current release's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from runs_helpers import Cluster, exe, runs_conftest

REPO_NAME = "hf-hfprune"


def docker(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe("docker"), *args], capture_output=True, text=True, input=input, timeout=300)


def tags() -> set[str]:
    return set(docker("images", "--format", "{{.Repository}}:{{.Tag}}", REPO_NAME).stdout.split())


def old_image(bed, tag: str) -> None:  # type: ignore[no-untyped-def]
    """An image of the project that no release uses (as a Dockerfile change leaves behind): its own id."""
    r = docker("build", "--network", "host", "-t", f"{REPO_NAME}:{tag}", "-",
               input=f"FROM {bed.BASE_IMAGE}\nLABEL org.higgsfield.test=prune-{tag}\n")
    assert r.returncode == 0, r.stderr


@pytest.fixture()
def pruned(bed, tmp_path: Path) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = runs_conftest().make_cluster(bed, tmp_path / "hfprune", (0,))
    yield c
    if tags():
        docker("image", "rm", "-f", *tags())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_prune_images_removes_an_old_project_image_and_keeps_the_release_s(bed, pruned: Cluster) -> None:  # type: ignore[no-untyped-def]
    pruned.hf("deploy", check=True, timeout=900)
    current = tags()
    assert len(current) == 1, current
    old_image(bed, "0ld000000001")

    dry = pruned.hf("prune", "--images", "--dry-run", check=True)
    assert f"  image {REPO_NAME}:0ld000000001 " in dry.stdout, dry.stdout
    assert f"kept image {next(iter(current))}: the current release's image" in dry.stdout, dry.stdout
    assert tags() == current | {f"{REPO_NAME}:0ld000000001"}          # a dry run removes nothing

    real = pruned.hf("prune", "--images", check=True)
    assert "removed 0 run(s), 0 checkpoint dir(s), 1 image(s)" in real.stdout, real.stdout
    assert tags() == current

    # deploy applies retention: (the code is unchanged, so only the prune has work to do)
    old_image(bed, "0ld000000002")
    cfg = pruned.dir / "higgsfield.yml"
    cfg.write_text(cfg.read_text() + "retention:\n  keep_runs: 50\n  images: true\n")
    dep = pruned.hf("deploy", check=True, timeout=900)
    assert "hfnode0: retention: removed 0 run(s), 0 checkpoint dir(s), 1 image(s)" in dep.stderr, dep.stderr
    assert tags() == current
