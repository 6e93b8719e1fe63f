"""A real Slurm cluster (scripts/slurm-testbed.sh: slurmctld, 3 slurmd nodes, slurmdbd) and its login node.

The login node is test-bed host hfnode20 (127.0.0.22:2222): the tests reach it over real SSH
through :class:`~higgsfield.control.remote.ssh.SSHTransport`, as the control side does, and its
user's sbatch/squeue find the cluster through Debian's default /etc/slurm/slurm.conf (a link
the test bed makes). Jobs run as hfnode20 on nodes n1..n3 with the bed's shared venv
(editable higgsfield + torch) as the project environment.

A cluster that is not up fails the tests with the command that starts it (they never skip:
`make test` starts it first).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_helpers import EXPERIMENT, Cluster, SharedProject, make_project
from testbed import shared_node_venv

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-testbed.sh"
START = "make slurm-testbed  (SLURM_TB_DBD=1 SLURM_TB_USERS=hfnode20,hfnode21 scripts/slurm-testbed.sh up 3)"
LOGIN_HOST = 20            # hfnode20 on 127.0.0.22: this directory's login node, nobody else's
SYSTEM_PYTHON = "/usr/bin/python3"


def _bed() -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    import testbed

    return testbed


def slurm_up() -> bool:
    return subprocess.run([str(SCRIPT), "status"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="session")
def slurm() -> None:
    """The cluster is up with accounting, and the login user has an association (enforced accounts)."""
    if os.geteuid() != 0:
        pytest.fail(f"the Slurm test bed needs root; start it with: {START}")
    if not slurm_up():
        pytest.fail(f"the Slurm test bed is not up; start it with: {START}")
    out = subprocess.run(["sacctmgr", "-n", "-P", "show", "assoc", "format=user"], capture_output=True,
                         text=True, timeout=60).stdout.split()
    if "hfnode20" not in out:
        subprocess.run(["sacctmgr", "-i", "add", "user", "hfnode20", "account=testlab"], check=True,
                       capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def login(slurm: None) -> Any:
    """Test-bed host hfnode20, up, with the laptop key authorized; its Host.

    Only this host is brought up: `make test` runs this directory beside the rest of the suite, whose
    tests stop and restart hosts 0..3 on purpose (a bed-wide ``up`` here would restart them mid-test).
    """
    tb = _bed()
    try:
        bed = tb.ensure_testbed(hosts=0, docker=False, image=False)   # packages and the laptop key only
    except tb.TestbedUnavailable as e:
        pytest.fail(f"test bed unavailable: {e}")
    with tb.impl.state_lock(bed.state_dir):
        (h,) = tb.impl.ensure_hosts(0, bed.state_dir, indices=[LOGIN_HOST], reset_docker_group=False)
    # On a fresh machine the cluster's associations were made before this unix user existed:
    # slurmctld resolves an association's uid when it loads it and refuses the user's jobs
    # ("Invalid account") until it is told to look again.
    subprocess.run(["scontrol", "reconfigure"], check=True, capture_output=True, timeout=60)
    return {"bed": bed, "host": h}


@pytest.fixture(scope="session")
def workdir(login: Any) -> Iterator[Path]:
    """The run's shared workdir in hfnode20's home: venv link, project code; removed afterwards."""
    user = login["host"].user
    pw = pwd.getpwnam(user)
    venv = shared_node_venv(login["bed"].state_dir, SYSTEM_PYTHON)
    d = Path(pw.pw_dir) / f"hf-slurm-{uuid.uuid4().hex[:8]}"
    (d / "code" / "src").mkdir(parents=True)
    (d / "code" / "src" / "slurmprobe.py").write_text(EXPERIMENT)
    (d / "venv").symlink_to(venv)
    for p in [d, *d.rglob("*")]:
        os.lchown(p, pw.pw_uid, pw.pw_gid)
    d.chmod(0o700)
    yield d
    if not os.environ.get("HF_SLURM_KEEP"):  # HF_SLURM_KEEP=1 keeps it to look into
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def known_hosts(login: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pinned with the login node's real host key, as 'higgsfield setup' leaves it."""
    path = tmp_path_factory.mktemp("slurm-known") / "known_hosts"
    path.write_text(_bed().impl.known_hosts_line(login["host"]) + "\n")
    return path


@pytest.fixture
def settings_data(login: Any, workdir: Path) -> dict[str, Any]:
    h = login["host"]
    return {"login": {"host": h.address, "user": h.user, "port": h.port, "name": "login",
                      "identity_file": str(login["bed"].client_key)},
            "workdir": str(workdir), "partition": "debug", "account": "testlab", "nodes": 2, "time": "5"}


@pytest.fixture
def cluster(settings_data: dict[str, Any], known_hosts: Path) -> Iterator[Cluster]:
    from higgsfield.control.config.slurm import SlurmConfig

    c = Cluster(SlurmConfig.model_validate(settings_data), known_hosts)
    yield c
    # nothing of a test's runs outlives it
    subprocess.run(["scancel", "-u", "hfnode20"], capture_output=True, timeout=60)
    c.close()


@pytest.fixture(scope="session")
def slurm_project(login: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedProject]:
    """One user's cluster project for the session (nothing set up yet): the journey sets it up and deploys
    it, the dashboard's tests reuse it after; its jobs cancelled and its workdir removed at the session end."""
    with make_project(login, tmp_path_factory.mktemp("slurm-project"), "journey") as (user, workdir):
        yield SharedProject(user, workdir)
