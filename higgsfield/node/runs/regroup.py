"""This node's part of a run that goes on without a lost node: the new node set taken, as a new attempt.

Used by the supervisor (:mod:`higgsfield.node.runs.supervisor`) when its coordinator
sends ``regroup`` (:mod:`higgsfield.node.gang.recovery`): the node's spec now names the
survivors and this node's rank among them (``spec.json``, which ``status``, ``logs`` and
``kill`` read), and the record gains an attempt whose header says why it began
(``=== attempt 2 (recovery 1: gpu-3 lost) on gpu-1, gpu-2 ... ===``) and the node it lost.
The supervisor then goes through admission again, and the next ``go`` starts torchrun on
the survivors, where the experiment's ``Checkpoint.load_latest`` resumes from the last
step complete on the old nodes (their own parts and buddy copies: :mod:`higgsfield._lib.ckpt_buddy`).
"""

from __future__ import annotations

import queue
import time
from typing import Any

from higgsfield.contract.gang import Regroup
from higgsfield.node.state.placement import NodeRun
from higgsfield.node.state.records import Attempt, RunDir

__all__ = ["drop_stale", "take"]


def take(rd: RunDir, run: NodeRun, msg: Regroup) -> NodeRun:
    """This node's run on ``msg.nodes`` from now on (written to spec.json and the record)."""
    nodes = tuple(msg.nodes)
    old = run.spec
    # node 0 lost: the first survivor (its heir, which took the coordinator over) hosts the rendezvous too
    master = old.master_addr if nodes[0] == old.nodes[0] else old.addresses.get(nodes[0], old.master_addr)
    spec = old.replace(nodes=nodes, node_rank=nodes.index(old.node), master_addr=master)
    new = NodeRun(spec, run.placement)
    new.write(rd.spec_path)
    record = rd.read()
    record.node_rank, record.nnodes, record.spare = spec.node_rank, len(nodes), False
    gone = [n for n in msg.lost if n not in record.lost]   # this recovery's losses (msg.lost: every one so far)
    record.lost = list(msg.lost)
    record.attempts.append(Attempt(number=len(record.attempts) + 1, at=time.time(), nodes=list(nodes),
                                   why=f"recovery {msg.recovery}: {_gone(gone, msg.replaced)}", logs=rd.log_sizes(),
                                   lost=gone))
    rd.write(record)
    return new


def _gone(gone: list[str], replaced: tuple[str, ...]) -> str:
    """``gpu-3 lost``, or ``gpu-3 replaced (a straggler)`` for a node put out by ``on_straggler: replace``."""
    lost = [n for n in gone if n not in replaced]
    return ", ".join([*([f"{', '.join(lost)} lost"] if lost else []),
                      *(f"{n} replaced (a straggler)" for n in gone if n in replaced)])


def drop_stale(inbox: queue.Queue[Any], msg: Regroup) -> None:
    """Drop what the inbox holds up to ``msg`` (an abort the heir of a lost node 0 greets a joining survivor
    with would end the next attempt's admission); keep what came after it."""
    stale = []
    while not inbox.empty():
        stale.append(inbox.get_nowait())
    for later in stale[next((i + 1 for i, m in enumerate(stale) if m is msg), 0):]:
        inbox.put(later)

