"""Node-local checkpoints on the test bed: 2 nodes x 2 ranks that share no disk (separate users, homes).

A real ``higgsfield run`` of ``src/ckpt_steps.py`` (a replicated linear layer: every
item DCP de-duplicates, so each node needs its own copies) saves every 4 steps; each
node keeps its part under its own ``~/.cache/higgsfield``. Running it again with the
same ``--run-name`` and more steps resumes on both nodes from the last step, read by
each node from its own disk alone.

    flock /tmp/hf-testbed.lock pytest tests/faults/test_checkpoint_node_local_bed.py
"""

from __future__ import annotations

import re

import pytest
from faults_helpers import FaultCluster, kill_run_quietly, name
from pull_helpers import assert_same_state, load_step

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]


def _two_ranks_per_node(c: FaultCluster) -> str:
    """Switch the project to 2 ranks per node; returns the old higgsfield.yml to put back."""
    yml = c.dir / "higgsfield.yml"
    old = yml.read_text()
    assert "nproc_per_node: 1\n" in old
    yml.write_text(old.replace("nproc_per_node: 1\n", "nproc_per_node: 2\n"))
    return old


@pytest.mark.timeout(600)
def test_two_nodes_without_a_shared_disk_save_and_resume_from_their_own_parts(faults: FaultCluster) -> None:
    c = faults
    run = name("nodelocal")
    args = ["ckpt_steps", "-p", "every=4", "-p", "step_sleep=0.05", "--nodes", "2", "--run-name", run]
    old = _two_ranks_per_node(c)
    try:
        first = c.hf("run", *args, "-p", "steps=12", timeout=300)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        parts = {i: c.ckpt_dir(i, "ckpt_steps", run) for i in (8, 9)}
        for i, ranks in ((8, (0, 1)), (9, (2, 3))):
            steps = sorted(p.name for p in parts[i].iterdir() if p.name.startswith("step_"))
            assert steps == ["step_00000008", "step_00000012"], (i, steps)  # keep_last=2 on each node
            files = {p.name for p in (parts[i] / "step_00000012").iterdir()}
            assert {n for n in files if n.endswith(".distcp")} == {f"__{r}_0.distcp" for r in ranks}, files
            assert {".metadata", "trainer.pt", "COMPLETE"} <= files, files
        second = c.hf("run", *args, "-p", "steps=16", timeout=300)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    finally:
        (c.dir / "higgsfield.yml").write_text(old)
        kill_run_quietly(c, run)
    for i, rank in ((8, 0), (8, 1), (9, 2), (9, 3)):
        log = c.rank_log(i, run, rank).read_text()
        assert f"attempt 0 resumes at step 12 from {c.ckpt_dir(i, 'ckpt_steps', run)}" in log, log[-2000:]
        again = [int(m) for m in re.findall(r"^step (\d+) attempt 0$", log.split("resumes at step 12")[-1], re.M)]
        assert again == list(range(12, 16)), (rank, again)

    # `higgsfield pull` over SSH: both nodes' parts merged into one step that loads on 1 rank, equal to each part
    dest = c.dir.parent / f"pulled-{run}"
    pulled = c.hf("pull", run, str(dest), "--logs", timeout=300)
    assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
    step = dest / "step_00000016"
    assert {f"__{r}_0.distcp" for r in range(4)} <= {p.name for p in step.iterdir()}
    merged = load_step(dest, 32, c.dir.parent / f"{run}-merged.pt")
    assert merged["step"] == 16 and merged["missing"] == [], merged["missing"]
    for i in (8, 9):  # each node's part alone holds its own copy of every (replicated) item: the same state
        assert_same_state(merged, load_step(parts[i] / "step_00000016", 32, c.dir.parent / f"{run}-{i}.pt",
                                            mode="dcp"))
    assert {p.name for p in (dest / "logs").iterdir()} == {"hfnode8", "hfnode9"}
    again = c.hf("pull", run, str(dest), timeout=300)
    assert again.returncode == 0 and "0 file(s) copied" in again.stdout, again.stdout + again.stderr
