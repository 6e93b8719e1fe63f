"""The fabric benchmark as a Slurm job: submitted on the bed's partition (2 nodes), it reports every figure.

The same built-in experiment ``doctor --fabric`` submits on a cluster
(:func:`higgsfield.control.doctor.fabric.slurm_fabric_test`), here through the engine the
Slurm session submits with: its one result line, read from the job's logs, decodes, names
the allocation's nodes and has the all-reduce sweep, the pair and each node's figures, positive.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from slurm_helpers import SECRET, Cluster

from higgsfield.contract.fabric import EXPERIMENT, MARKER, MODULE, FabricResult, sizes

pytestmark = [pytest.mark.slow, pytest.mark.sshd]


async def _result_line(c: Cluster, project: str, run: str) -> str | None:
    async for rank, text in c.engine.logs(project, run):
        if rank == 0 and text.startswith(MARKER):
            return text[len(MARKER):]
    return None


@pytest.mark.timeout(180)
def test_the_fabric_benchmark_runs_as_a_slurm_job_and_reports_its_figures(cluster: Cluster, workdir: Path) -> None:
    from higgsfield.control.backends.slurm import template_spec

    c = cluster
    s = template_spec(project="slurmproj", experiment=EXPERIMENT, run=f"fabric-{os.getpid()}", module=MODULE,
                      code_dir=str(workdir / "code"), params={"max_bytes": 1 << 20, "ckpt_mib": 4}, nproc=1)
    t0 = time.monotonic()
    c(c.engine.submit(s, {"HF_SLURM_SECRET": SECRET}))
    while True:
        st = c(c.engine.status(s.project, s.run))
        if st.state in ("succeeded", "failed", "killed") or time.monotonic() - t0 > 150:
            break
        time.sleep(0.3)
    assert st.state == "succeeded", (st.state, st.reason, st.error_tail)
    line = c(_result_line(c, s.project, s.run))
    print(f"\nfabric benchmark as a Slurm job on 2 nodes: {time.monotonic() - t0:.1f}s")
    assert line is not None
    r = FabricResult.from_dict(json.loads(line))
    assert sorted(r.nodes) == sorted(st.nodes) and len(r.nodes) == 2 and r.backend == "gloo"
    assert [x.bytes for x in r.allreduce] == sizes(8, 1 << 20)
    assert all(x.time_us > 0 and x.busbw_gbps > 0 for x in r.allreduce)
    assert len(r.pairs) == 1 and r.pairs[0].busbw_gbps > 0
    assert all(n.ckpt_write_mbps and n.ckpt_write_mbps > 0 and n.gpus is None for n in r.per_node)
