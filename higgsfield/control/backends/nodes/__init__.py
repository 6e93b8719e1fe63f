"""The SSH nodes backend: deploy, run, logs, status, kill (and the queue's view) across the nodes of higgsfield.yml.

One module a concept: :mod:`.start` (validate and launch), :mod:`.status` (node
records merged into a run's status), :mod:`.logs` (merged streams, followed with
re-attach), :mod:`.metrics` (a run's step metrics, from its node 0), :mod:`.kill`,
:mod:`.deploy`, :mod:`.prune`, :mod:`.pull`. The CLI reaches them through the
:class:`~higgsfield.control.backends.backend.Backend` seam: :mod:`.backend` and :mod:`.session` wrap these
for the SSH nodes, and :mod:`.fleet` is the dashboard's live view of them (one feed per node), as
:mod:`higgsfield.control.backends.slurm` does for a Slurm cluster. The async calls take a connected
:class:`~higgsfield.control.remote.Group` (:func:`connect`), so one command reuses its
connections for all its steps.
"""

from higgsfield.contract.errors import NodeLost
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.nodes.connect import connect
from higgsfield.control.backends.nodes.deploy import DeployResult, NodeDeploy, deploy
from higgsfield.control.backends.nodes.kill import kill_runs, stop_run
from higgsfield.control.backends.nodes.logs import LOST_AFTER_S, NOTICE, LogLine, follow, stream_logs
from higgsfield.control.backends.nodes.metrics import metrics_node, read_metrics
from higgsfield.control.backends.nodes.start import (
    RunHandle,
    RunPlan,
    launch,
    plan_run,
)
from higgsfield.control.backends.nodes.status import (
    final_status,
    find_run,
    merge,
    query_runs,
    resolve_target,
)

__all__ = [
    "LOST_AFTER_S", "NOTICE", "DeployResult", "LogLine", "NodeDeploy", "NodeLost", "RunHandle",
    "RunPlan", "RunStatus", "connect", "deploy",
    "final_status", "find_run", "follow", "kill_runs", "launch", "merge",
    "metrics_node", "plan_run", "query_runs", "read_metrics", "resolve_target", "stop_run", "stream_logs",
]
