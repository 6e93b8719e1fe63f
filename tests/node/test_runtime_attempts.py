"""A restarted torchrun worker reads and writes its own attempt's keys in the run's shared store.

The end-to-end case (2 nodes x 2 ranks, a worker SIGKILLed, torchrun restarting the workers
of both nodes) is tests/faults/test_checkpoint_node_local_bed.py; this checks the store
itself, with a real TCPStore, in a fresh interpreter (the wrap changes torch's table).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import os, sys
    from datetime import timedelta
    import torch.distributed as dist
    from higgsfield.contract.ports import free_port
    from higgsfield.node.runtime.attempts import isolate_restart_store

    agent = os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    # the agent's store, or (workers hosting their own) a free port for rank 0's
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30)) if agent else None
    port = server.port if server else free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    wrapped = isolate_restart_store()
    again = isolate_restart_store()          # once only, however often it is called
    store, rank, world = next(dist.rendezvous("env://"))
    store.set("addr", "mine")
    print(wrapped, again, rank, world, type(store).__name__)
    server = server or store
    for key in ("addr", "higgsfield/attempt" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") + "/addr"):
        print(key, server.check([key]))
""")


def _run(restart: str, agent_store: str) -> list[str]:
    env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": restart, "TORCHELASTIC_USE_AGENT_STORE": agent_store}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_a_restarted_worker_on_the_agents_store_keeps_to_its_attempts_keys() -> None:
    assert _run("2", "True") == ["True False 0 1 PrefixStore", "addr False", "higgsfield/attempt2/addr True"]


@pytest.mark.parametrize(("restart", "agent_store"), [("0", "True"), ("1", "False")])
def test_the_first_attempt_and_a_store_of_the_workers_own_are_left_as_torch_makes_them(restart: str,
                                                                                     agent_store: str) -> None:
    lines = _run(restart, agent_store)
    assert lines[0] == "False False 0 1 TCPStore" and lines[1] == "addr True", lines
