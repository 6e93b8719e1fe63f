"""Drift on real test-bed nodes (hfnode24..26: 127.0.0.26-28), the process runtime (issue 19).

The project is ``fabric_cluster`` (conftest.py): the deploy test_doctor_fabric.py uses too, so the
bed pays for one process-runtime deploy, not two. Several checks on it (the bed's time is scarce):
numpy 2.2.6 installed by hand into hfnode26's project venv after deploy is named by ``doctor``
(text and ``--json``) with both versions; ``run`` then refuses in one line with exit 2;
``--allow-drift`` runs it; ``--exclude`` with an unknown node is one line, exit 2, before any node
is contacted; ``--exclude hfnode26`` runs on hfnode24 and hfnode25 alone. ``finally`` puts
hfnode26's own numpy back (its wheel, by hand as the odd one went in) and checks it did, so the
tests after this one find identical nodes. The added cost of the check is measured by
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runs"))  # runs_helpers (tests/ has no packages)

from runs_helpers import Cluster, exe  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

INDICES = (24, 25, 26)   # the hosts of ``fabric_cluster`` (conftest.py)
PROJECT = "hffabric"
ODD = 26                 # the node that gets the odd numpy
ODD_NUMPY = "2.2.6"


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


def _install_numpy(version: str, wheels: Path) -> None:
    """numpy ``version`` into hfnode26's project venv, by hand, as its user (as someone on that box would)."""
    wheel = _download(f"numpy=={version}", wheels)
    user = f"hfnode{ODD}"
    pip = [f"/home/{user}/.hfrt/venv/bin/python", "-m", "pip", "--python", str(_env_python(ODD))]
    home = pwd.getpwnam(user).pw_dir
    subprocess.run([exe("runuser"), "-u", user, "--", *pip, "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, timeout=120,
                   cwd=home, env={"PATH": os.environ["PATH"], "HOME": home})


def _check_drift(c: Cluster, majority: str) -> None:
    """What doctor and run make of hfnode26's odd numpy (the checks of the two-node version, on three)."""
    assert _numpy(ODD) == ODD_NUMPY != majority
    took: list[str] = []

    def hf(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        r = c.hf(*args, timeout=timeout)
        took.append(f"{' '.join(args[:2])} {time.monotonic() - t0:.1f}s")
        return r

    r = hf("doctor", timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"hfnode26: drift numpy: {ODD_NUMPY} (the other 2 nodes: {majority})" in " ".join(out.split()), out
    d = json.loads(hf("doctor", "--json", timeout=120).stdout)
    assert d["drift"]["differences"] == [{"field": "package numpy", "node": "hfnode26", "value": ODD_NUMPY,
                                          "majority": majority, "nodes": 2}], d["drift"]
    assert [n["node"] for n in d["drift"]["nodes"]] == ["hfnode24", "hfnode25", "hfnode26"]

    r = hf("run", "probe", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and f"hfnode26: numpy {ODD_NUMPY} (the other 2 nodes: {majority})" in err[0], r.stderr
    assert "--allow-drift" in err[0]

    r = hf("run", "probe", "--allow-drift", timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rank=0" in r.stdout and "rank=1" in r.stdout and "rank=2" in r.stdout, r.stdout
    assert "hfnode26/" in r.stdout, r.stdout

    r = hf("run", "probe", "--exclude", "hfnode9", timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--exclude hfnode9: no such node" in r.stderr

    r = hf("run", "probe", "--exclude", "hfnode26", timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "started on hfnode24, hfnode25" in " ".join(r.stderr.split()), r.stdout + r.stderr
    assert "hfnode26/" not in r.stdout, r.stdout + r.stderr
    print(f"\n3 nodes: {'; '.join(took)}")


@pytest.mark.timeout(600)   # when it runs first, it pays for the cluster's deploy (about 2 min on a fresh bed)
def test_a_hand_installed_numpy_is_named_refused_and_allowed(fabric_cluster: Cluster, wheels: Path) -> None:
    c = fabric_cluster
    original = _numpy(ODD)
    assert [_numpy(i) for i in INDICES] == [original] * len(INDICES)   # identical nodes to begin with
    try:
        t0 = time.monotonic()
        _install_numpy(ODD_NUMPY, wheels)
        print(f"\nnumpy {ODD_NUMPY} on hfnode26: {time.monotonic() - t0:.1f}s")
        _check_drift(c, majority=_numpy(INDICES[0]))
    finally:
        t0 = time.monotonic()
        _install_numpy(original, wheels)   # the node's own numpy back, as the odd one went in
        print(f"numpy {original} back on hfnode26: {time.monotonic() - t0:.1f}s")
    assert [_numpy(i) for i in INDICES] == [original] * len(INDICES)   # identical nodes for the tests after
