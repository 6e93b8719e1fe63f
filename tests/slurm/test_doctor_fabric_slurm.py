"""``higgsfield doctor --fabric`` on a Slurm project, as a user runs it: a short job on the partition (2 nodes).

The user's project names the bed's cluster (its login node pinned in ``.higgsfield/known_hosts``,
as ``setup`` leaves it) and is deployed in the shared workdir (its ``code`` link; the
workdir's venv is the project environment). ``doctor --fabric --json`` submits the built-in
benchmark through the Slurm session, follows the job's logs to its result line and prints
every figure: the allocation's nodes, the all-reduce sweep, the pair and each node's figures,
positive. The job's nodes are equal, so the drift check inside it lets it run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers_project import cli_env

from higgsfield.contract.codec import decode
from higgsfield.contract.fabric import EXPERIMENT, FabricResult, sizes

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

PROJECT = "slurmproj"


def _project(tmp_path: Path, settings_data: dict[str, Any], known_hosts: Path, workdir: Path) -> Path:
    """A user's project on the cluster, deployed: higgsfield.yml, the pinned login node, the release link."""
    login = settings_data["login"]
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / ".higgsfield").mkdir()
    (proj / ".higgsfield" / "known_hosts").write_text(known_hosts.read_text())
    config = {"name": PROJECT,
              "ssh": {"identity_file": login["identity_file"], "known_hosts": ".higgsfield/known_hosts"},
              "slurm": {"login": {"host": login["host"], "user": login["user"], "port": login["port"]},
                        "workdir": str(workdir), "partition": "debug", "account": "testlab", "nodes": 2,
                        "time": "5", "python": str(workdir / "venv" / "bin" / "python")}}
    (proj / "higgsfield.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    root = workdir / "projects" / PROJECT
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "code").is_symlink():
        (root / "code").symlink_to(workdir / "code")
    st = workdir.stat()
    for p in (workdir / "projects", root, root / "code"):
        os.lchown(p, st.st_uid, st.st_gid)
    return proj


@pytest.mark.timeout(180)
def test_doctor_fabric_on_a_slurm_project_runs_the_benchmark_as_a_job_and_prints_every_figure(
        tmp_path: Path, settings_data: dict[str, Any], known_hosts: Path, workdir: Path) -> None:
    proj = _project(tmp_path, settings_data, known_hosts, workdir)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "higgsfield", "doctor", "--fabric", "--json", "--nodes", "2",
                        "--max-bytes", str(1 << 20)], cwd=proj, env=cli_env(tmp_path / "home"),
                       capture_output=True, text=True, timeout=170, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    assert r.returncode == 0, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    data = json.loads(r.stdout)
    print(f"\ndoctor --fabric on a Slurm project (2 nodes, a job): {wall:.1f}s")
    res = decode(FabricResult, data)
    assert sorted(res.nodes) == sorted(set(res.nodes)) and len(res.nodes) == 2 and res.backend == "gloo"
    assert all(n.startswith("n") for n in res.nodes), res.nodes
    assert [x.bytes for x in res.allreduce] == sizes(8, 1 << 20)
    assert all(x.time_us > 0 and x.algbw_gbps > 0 and x.busbw_gbps > 0 for x in res.allreduce)
    assert len(res.pairs) == 1 and res.pairs[0].busbw_gbps > 0
    assert all(n.ckpt_write_mbps and n.ckpt_write_mbps > 0 and n.gpus is None for n in res.per_node)
    assert data["run"].startswith("fabric-") and data["latency_us"] > 0 and data["outliers"] == []
    # the job is a run of the project: status lists it, succeeded, on the allocation's nodes
    st = subprocess.run([sys.executable, "-m", "higgsfield", "status", "--json"], cwd=proj,
                        env=cli_env(tmp_path / "home"), capture_output=True, text=True, timeout=60,
                        stdin=subprocess.DEVNULL)
    runs = {x["run"]: x for x in json.loads(st.stdout)["runs"]}
    job = runs[data["run"]]
    assert job["experiment"] == EXPERIMENT and job["state"] == "succeeded" and sorted(job["nodes"]) == res.nodes
