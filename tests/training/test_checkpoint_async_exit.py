"""A rank that dies with an asynchronous save in flight: every other rank exits at once, the save abandoned.

Before the fix a surviving rank whose training raised could not exit while its save
thread waited (in a collective for a peer, or on a slow disk), so its node's torchrun
never restarted it (:mod:`higgsfield._lib.ckpt_async`). Three plain processes stand in
for torchrun's workers (no agent is needed to see whether a rank exits); the worker is
``async_kill_worker.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainutil import ROOT, free_port

WORKER = Path(__file__).resolve().parent / "async_kill_worker.py"
#: Seconds each survivor may take to exit after rank 2 died (the slow disk would hold rank 0 ten minutes):
#: a few here, as long as starting Python with torch (most of a minute on a loaded machine).
BOUND = 60


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_killed_mid_async_save_lets_every_other_rank_exit(tmp_path):
    port = free_port()
    procs = []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        with open(tmp_path / f"rank{rank}.log", "w") as log:  # a file: a pipe left unread could fill and block
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], cwd=ROOT,  # noqa: S603
                                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    ended: dict[int, float] = {}
    deadline = time.time() + 200
    try:
        while len(ended) < 3 and time.time() < deadline:
            for rank, p in enumerate(procs):
                if rank not in ended and p.poll() is not None:
                    ended[rank] = time.time()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        for p in procs:
            p.wait(timeout=30)
    logs = "\n".join(f"--- rank {r}\n{(tmp_path / f'rank{r}.log').read_text()[-3000:]}" for r in range(3))
    assert (tmp_path / "died").is_file(), f"rank 2 never reached its write\n{logs}"
    died = float((tmp_path / "died").read_text())
    assert all((tmp_path / f"saving{r}").is_file() for r in (0, 1)), logs
    assert procs[2].returncode == 17, logs
    print("survivors exited", {r: round(t - died, 1) for r, t in ended.items() if r != 2}, "s after rank 2 died")
    for rank in (0, 1):
        assert rank in ended, f"rank {rank} was still running 200 s after the start\n{logs}"
        assert procs[rank].returncode != 0, logs
        assert ended[rank] - died < BOUND, f"rank {rank} took {ended[rank] - died:.1f} s to exit\n{logs}"
    # the abandoned save is left as a partial directory, never as a checkpoint
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == [".tmp-step_00000001"], names
