"""A Slurm job that loses a node is requeued without it and resumes; then a stall restarts it; then it fails.

One real job (2 nodes x 2 gloo ranks of test_slurm_stall's stepping experiment, ``on_stall:
restart``, ``--max-restarts 1``) carries both requeue paths, so the suite pays for the
requeue wait once more, not twice:

1. every rank steps and checkpoints; the test cuts the allocation's second node off
   (``scripts/slurm-testbed.sh node-kill``: its slurmd, its job step and the ranks on it, all
   SIGKILLed, as at a power cut). The batch step finds the node gone (its slurmd starts no
   probe step) and requeues the job without it: the run goes on on the batch node and the
   third node, resuming from its checkpoint (rank 0's "resumed at step N", N > 0), and
   ``status --json`` shows the recovery as for an SSH run (``attempts``, ``recoveries``, ``lost``);
   ``higgsfield profile`` (the real CLI, through the login node) brings 2 profiled steps of all 4
   ranks of the job's new start home, merged into one timeline;
2. the test freezes rank 1: the stall watchdog requeues the job (restart 1 of 1, which the
   recovery did not use up), the run resumes again, freezes again and fails ``stalled: ...``.

The cut node's slurmd is started again at the end (ReturnToService=2 makes it idle again).

    flock /tmp/hf-testbed.lock .venv/bin/pytest tests/slurm/test_slurm_recovery.py -x -q -s
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers_project import run_cli
from profile_helpers import check_traces
from slurm_helpers import Cluster
from test_engine import launcher
from test_slurm_stall import STALL_S, _cli_project, _install, _wait

from higgsfield.contract.runstatus import status_json

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

BED = Path(__file__).resolve().parents[2] / "scripts" / "slurm-testbed.sh"


def _bed(*args: str) -> None:
    r = subprocess.run([str(BED), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stdout, r.stderr)


def _resumed(run_dir: Path) -> list[int]:
    log = run_dir / "logs" / "rank0.log"
    text = log.read_text() if log.exists() else ""
    return [int(line.split()[-1]) for line in text.splitlines() if line.startswith("resumed at step")]


@pytest.mark.timeout(300)
def test_a_lost_node_is_requeued_without_then_a_stall_restarts_then_it_fails(cluster: Cluster, workdir: Path,
                                                                            known_hosts: Path,
                                                                            tmp_path: Path) -> None:
    from higgsfield.control.backends.slurm import template_spec

    _install(workdir)
    spec = template_spec(project="slurmproj", experiment="frozen", run=f"recovered-{os.getpid()}",
                         module="slurmstall", code_dir=str(workdir / "code"), params={"hold": False}, nproc=2,
                         stall_timeout=STALL_S, startup_timeout=120.0, on_stall="restart", max_restarts=1)
    eng = cluster.engine
    run_dir = Path(cluster(eng.submit(spec, {"HF_SLURM_SECRET": "kept-for-a-requeue"})).paths.dir)
    seen: list[tuple[str, str]] = []

    def status() -> Any:
        st = cluster(eng.status(spec.project, spec.run))
        seen.append((st.state, st.reason or ""))
        return st

    _wait("every rank's progress", lambda: len(list((run_dir / "progress").glob("rank*"))) == 4, 90)
    assert (run_dir / "secrets.json").stat().st_mode & 0o777 == 0o600   # kept while Slurm may start it again
    ckpt = workdir / "checkpoints" / spec.project / spec.run / "step"
    _wait("a checkpoint past step 3", lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 3, 30)
    hosts = json.loads((run_dir / "spec.json").read_text())["nodes"]
    victim = hosts[1]                      # not the batch step's node: the job itself finds the loss
    t_cut = time.monotonic()
    _bed("node-kill", victim)
    try:
        # -- 1. requeued without the lost node, resumed from the checkpoint ----------------------------
        st = _wait("resumed on the other nodes", lambda: (s := status()).state == "running" and
                   len(_resumed(run_dir)) >= 2 and s, 150, every=0.5)
        recovered_s = time.monotonic() - t_cut
        first, again = _resumed(run_dir)[:2]
        assert first == 0 < again, (_resumed(run_dir), launcher(cluster, spec))
        assert victim not in st.nodes and len(st.nodes) == 2, (st.nodes, launcher(cluster, spec))
        # the requeue's reason, as ``logs`` shows it: ``status`` shows it too while the job is queued, but that
        # may be for a moment only (Slurm holds the job COMPLETING until it declares the node down, then it
        # starts at once), so a poll may miss it (one CI run did): the launcher log and the attempts cannot
        log = Path(eng.paths(spec.project, spec.run).launcher_log).read_text()
        said = [ln for ln in log.splitlines() if ln.startswith("higgsfield: ")]
        assert f"higgsfield: {victim} lost: requeued without it (recovery 1 of 3)" in said, (said, seen)
        out = status_json(st)
        assert out["lost"] == [victim], out
        assert [(a["number"], a["why"]) for a in out["attempts"]] == [(1, "first start"),
                                                                      (2, f"recovery 1: {victim} lost")], out
        assert [(r["lost"], victim in r["nodes"]) for r in out["recoveries"]] == [([victim], False)], out

        cli = _cli_project(tmp_path, cluster, known_hosts, spec.project)
        dest = tmp_path / "profiled"
        t0 = time.monotonic()
        prof = run_cli(cli, "profile", spec.run, "--steps", "2", "--out", str(dest), home=tmp_path / "home",
                       timeout=90)
        profile_s = time.monotonic() - t0
        assert prof.returncode == 0, (prof.stdout, prof.stderr[-2000:])
        merged = check_traces(dest, [0, 1, 2, 3], 2)
        assert len([ln for ln in prof.stdout.splitlines() if "compute" in ln]) == 4, prof.stdout
        assert merged["traceEvents"], "the merged timeline holds the ranks' events"

        # -- 2. a stall: the restart the recovery did not use, then the end ------------------------------
        (run_dir / "freeze").touch()   # rank 1 freezes at once, and again after the requeue
        st = _wait("the end", lambda: not (s := status()).active and s, 120, every=0.5)
        assert st.state == "failed" and (st.reason or "").startswith("stalled: "), (st.state, st.reason,
                                                                                     launcher(cluster, spec))
        # the requeue after the stall is queued for a moment only (its nodes are free): a poll may miss that
        # state, so the restart is read from the attempts and the resumed steps, which cannot be missed
        resumed = _resumed(run_dir)
        assert len(resumed) == 3 and resumed[0] == 0 < resumed[1] <= resumed[2], resumed
        whys = [a["why"] for a in status_json(st)["attempts"]]
        assert len(whys) == 3 and whys[2].startswith("restart 1 of 1: stalled: "), whys
        assert status_json(st)["lost"] == [victim]
        assert not (run_dir / "secrets.json").exists()   # a final end leaves no secrets behind
        print(f"\nslurm recovery: {victim} cut off; training again on the others {recovered_s:.1f} s later "
              f"(resumed at step {resumed[1]}); profile of 2 steps x 4 ranks home in {profile_s:.1f} s; "
              f"then {st.reason}")
    finally:
        _bed("node-start", victim)
