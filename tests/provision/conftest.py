"""The process-runtime project on three real test-bed nodes, shared by the bed tests of tests/provision.

- ``fabric_cluster`` (session): the project ``hffabric`` on hfnode24..26 (127.0.0.26-28), ``make_cluster``
  of tests/runs switched to ``runtime: process`` and deployed once (a venv with torch on each node:
  about 2 min on a fresh bed). test_doctor_fabric.py and test_drift_bed.py both use it, so the bed
  builds one such deploy instead of two (the suite's time is scarce).

Whatever a test changes on it, it puts back in ``finally`` (a slowed link, the Docker runtime, a
hand-installed package), so every test finds the same deployed project on identical nodes, in
whatever order the tests run.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runs"))  # runs_helpers (tests/ has no packages)

from runs_helpers import STATE, Cluster, bed_for, exe, runs_conftest  # noqa: E402
from testbed import cpu_torch_requirements  # noqa: E402

INDICES = (24, 25, 26)   # the fabric cluster's own hosts: nobody else's on the shared bed
PROJECT = "hffabric"


def _git(d: Path, *args: str) -> None:
    subprocess.run([exe("git"), *args], cwd=d, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.fixture(scope="session")
def fabric_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bed = bed_for(INDICES)
    c = runs_conftest().make_cluster(bed, tmp_path_factory.mktemp("fabric") / PROJECT, INDICES)
    yml = c.dir / "higgsfield.yml"
    yml.write_text(yml.read_text().replace("runtime: docker\n", "runtime: process\n"))
    (c.dir / "requirements.txt").write_text(cpu_torch_requirements(bed.state_dir()))
    _git(c.dir, "commit", "-qam", "runtime process")
    t0 = time.monotonic()
    c.hf("deploy", check=True, timeout=900)
    print(f"\ndeploy (process runtime, 3 nodes): {time.monotonic() - t0:.1f}s")
    # each node's venv has the CPU wheel from the bed's disk, not PyPI's CUDA build (about 5 GiB each)
    torches = [json.loads((Path(pwd.getpwnam(f"hfnode{i}").pw_dir) / STATE / "projects" / PROJECT / "env.json").read_text())["torch"]
               for i in INDICES]
    assert torches == [f"{bed.TORCH_VERSION}+cpu"] * len(INDICES), torches
    yield c
