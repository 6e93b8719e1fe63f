"""Drift on real test-bed nodes (hfnode27, hfnode28: 127.0.0.29-30), the process runtime (issue 19).

One deploy, then several checks on it (the bed's time is scarce): numpy 2.2.6 installed by
hand into hfnode28's project venv after deploy is named by ``doctor`` (text and ``--json``)
with both versions; ``run`` then refuses in one line with exit 2; ``--allow-drift`` runs it;
``--exclude`` with an unknown node is one line, exit 2, before any node is contacted;
``--exclude hfnode28`` runs on hfnode27 alone. The added cost of the check is measured by
bench/drift_cost.py.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runs_helpers import Cluster, bed_for, exe, runs_conftest

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

INDICES = (27, 28)   # this module's own hosts: nobody else's on the shared bed
PROJECT = "hfdrift"
ODD_NUMPY = "2.2.6"


def _git(d: Path, *args: str) -> None:
    subprocess.run([exe("git"), *args], cwd=d, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def _env_python(i: int) -> Path:
    found = sorted(Path(f"/home/hfnode{i}/.hfrt/envs/{PROJECT}").glob("*/bin/python"))
    assert len(found) == 1, found
    return found[0]


def _numpy(i: int) -> str:
    site = next(_env_python(i).parent.parent.glob("lib/python3*/site-packages"))
    return next(p.name[: -len(".dist-info")].split("-")[1] for p in site.glob("numpy-*.dist-info"))


@pytest.fixture(scope="module")
def wheels() -> Iterator[Path]:
    """A directory every node user can read, for the wheels the test hands to the nodes."""
    d = Path(tempfile.mkdtemp(prefix="hfdrift-wheels-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _download(spec: str, into: Path) -> Path:
    """``pip download`` as this machine's pip is configured (its wheels on disk first), readable by all."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", spec, "-d", str(into)],
                   check=True, timeout=120)
    name = spec.split("==")[0]
    wheel = next(into.glob(f"{name}-{spec.split('==')[1]}*.whl"))
    wheel.chmod(0o644)
    return wheel


@pytest.fixture(scope="module")
def drift_cluster(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[Cluster]:
    bed = bed_for(INDICES)
    c = runs_conftest().make_cluster(bed, tmp_path_factory.mktemp("drift") / PROJECT, INDICES)
    yml = c.dir / "higgsfield.yml"
    yml.write_text(yml.read_text().replace("runtime: docker\n", "runtime: process\n"))
    # the CPU build from this machine's disk (the node users' pip would fetch the multi-GB CUDA one)
    torch = _download("torch==2.13.0", wheels)
    (c.dir / "requirements.txt").write_text(f"torch @ file://{torch}\n")
    _git(c.dir, "commit", "-qam", "runtime process")
    t0 = time.monotonic()
    c.hf("deploy", check=True, timeout=900)
    print(f"\ndeploy (process runtime, 2 nodes): {time.monotonic() - t0:.1f}s")
    yield c


def _install_odd_numpy(wheels: Path) -> str:
    """numpy 2.2.6 into hfnode28's project venv, by hand, as its user (as someone on that box would)."""
    wheel = _download(f"numpy=={ODD_NUMPY}", wheels)
    pip = ["/home/hfnode28/.hfrt/venv/bin/python", "-m", "pip", "--python", str(_env_python(28))]
    home = pwd.getpwnam("hfnode28").pw_dir
    subprocess.run([exe("runuser"), "-u", "hfnode28", "--", *pip, "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, timeout=120,
                   cwd=home, env={"PATH": os.environ["PATH"], "HOME": home})
    return _numpy(27)


@pytest.mark.timeout(400)
def test_a_hand_installed_numpy_is_named_refused_and_allowed(drift_cluster: Cluster, wheels: Path) -> None:
    c = drift_cluster
    majority = _install_odd_numpy(wheels)
    assert _numpy(28) == ODD_NUMPY != majority

    t0 = time.monotonic()
    r = c.hf("doctor", timeout=120)
    print(f"doctor (2 nodes): {time.monotonic() - t0:.1f}s")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"hfnode28: drift numpy: {ODD_NUMPY} (the other 1 node: {majority})" in " ".join(out.split()), out
    d = json.loads(c.hf("doctor", "--json", timeout=120).stdout)
    assert d["drift"]["differences"] == [{"field": "package numpy", "node": "hfnode28", "value": ODD_NUMPY,
                                          "majority": majority, "nodes": 1}], d["drift"]
    assert [n["node"] for n in d["drift"]["nodes"]] == ["hfnode27", "hfnode28"]

    r = c.hf("run", "probe", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and f"hfnode28: numpy {ODD_NUMPY} (the other 1 node: {majority})" in err[0], r.stderr
    assert "--allow-drift" in err[0]

    r = c.hf("run", "probe", "--allow-drift", timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rank=0" in r.stdout and "rank=1" in r.stdout and "hfnode28/" in r.stdout, r.stdout

    r = c.hf("run", "probe", "--exclude", "hfnode9", timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--exclude hfnode9: no such node" in r.stderr

    r = c.hf("run", "probe", "--exclude", "hfnode28", timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "started on hfnode27" in r.stderr and "hfnode28/" not in r.stdout, r.stdout + r.stderr
