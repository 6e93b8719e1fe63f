"""``run --exclude`` on a Slurm cluster: the plan's sbatch words, then one real job that avoids n1."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from polling import pause_after
from slurm_helpers import SECRET, Cluster, offline_backend

from higgsfield.contract.errors import ConfigError
from higgsfield.control.backends import RunRequest
from higgsfield.control.config.slurm import SlurmConfig

pytestmark = [pytest.mark.slow, pytest.mark.sshd]



@pytest.mark.timeout(30)
def test_the_plan_passes_exclude_to_sbatch_and_refuses_a_bad_name(tmp_path: Path) -> None:
    backend = offline_backend(tmp_path)
    plan: Any = backend.plan(RunRequest("probe", exclude=("n1", "n3")))
    assert plan.settings.extra[-1] == "--exclude=n1,n3"
    with pytest.raises(ConfigError, match="not a Slurm node name"):
        backend.plan(RunRequest("probe", exclude=("n1;rm",)))


@pytest.mark.timeout(180)
def test_a_job_submitted_with_exclude_runs_on_the_other_nodes(settings_data: dict[str, Any], known_hosts: Path,
                                                              workdir: Path) -> None:
    from higgsfield.control.backends.slurm import template_spec
    from higgsfield.control.backends.slurm.script import exclude_option

    settings = SlurmConfig.model_validate(settings_data)
    c = Cluster(settings.model_copy(update={"extra": [exclude_option(("n1",))]}), known_hosts)
    try:
        s = template_spec(project="slurmproj", experiment="probe", run=f"exclude-{os.getpid()}", module="slurmprobe",
                          code_dir=str(workdir / "code"), params={}, nproc=1, max_restarts=0)
        job = c(c.engine.submit(s, {"HF_SLURM_SECRET": SECRET}))
        assert "--exclude=n1" in Path(job.paths.script).read_text()
        deadline = 120
        import time

        t0 = time.monotonic()
        while True:
            t1 = time.monotonic()
            st = c(c.engine.status(s.project, s.run))
            if st.state in ("succeeded", "failed", "killed") or time.monotonic() - t0 > deadline:
                break
            pause_after(t1, 0.3)
        assert st.state == "succeeded", (st.state, st.reason, st.error_tail)
        assert sorted(st.nodes) == ["n2", "n3"], st.nodes
    finally:
        c.close()
