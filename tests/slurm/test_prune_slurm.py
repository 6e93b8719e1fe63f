"""`higgsfield prune` on a Slurm cluster: the runs in the login node's workdir, over real SSH.

The workdir holds a finished run from long ago (with its checkpoints under
``<workdir>/checkpoints/``), a recent one and a requeued (queued) one; the prune removes the
old run only, and its checkpoints only with ``--checkpoints``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_helpers import make_project

from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord


def _own(root: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    for p in [root, *root.rglob("*")]:
        os.lchown(p, pw.pw_uid, pw.pw_gid)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prune_removes_the_workdir_s_old_runs_only(login: Any, workdir: Path, known_hosts: Path,
                                                    tmp_path: Path) -> None:
    with make_project(login, tmp_path, "prune") as (user, wd):
        (user.cwd / ".higgsfield").mkdir(exist_ok=True)
        shutil.copy(known_hosts, user.cwd / ".higgsfield" / "known_hosts")
        wd.mkdir(mode=0o700)
        (wd / "venv").symlink_to(os.readlink(workdir / "venv"))  # the login node's invoker, as setup leaves it
        now = time.time()
        for run, state, days in (("old", "succeeded", 40), ("recent", "failed", 1), ("requeued", "queued", 40)):
            rd = RunDir(NodeState(wd), "lab", run)
            rd.make()
            rd.write(RunRecord("lab", "slurmprobe", run, "n1", 0, 2, 2, state=state, runtime="slurm",
                               created_at=now - days * 86400, ended_at=None if state == "queued" else now - days * 86400))
            (wd / "checkpoints" / "lab" / run).mkdir(parents=True)
            (wd / "checkpoints" / "lab" / run / "shard").write_bytes(b"\0" * 10_000)
        _own(wd, login["host"].user)

        dry = user("prune", "--dry-run", "--older-than", "30d", "--checkpoints")
        assert "login: would remove 1 run(s), 1 checkpoint dir(s)" in dry.stdout, dry.stdout
        assert (wd / "runs" / "lab" / "old").is_dir()
        real = user("prune", "--older-than", "30d")
        assert "  run old (succeeded)" in real.stdout and "login: removed 1 run(s), 0 checkpoint dir(s)" in real.stdout
        assert sorted(p.name for p in (wd / "runs" / "lab").iterdir()) == ["recent", "requeued"]
        assert (wd / "checkpoints" / "lab" / "old" / "shard").is_file()     # checkpoints only when asked
        bad = user("prune", "--run", "requeued", ok=False)
        assert bad.returncode == 2 and "run 'requeued' is queued on login" in bad.stderr, bad.stderr
