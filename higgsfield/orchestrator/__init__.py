"""Control-side operations across nodes: deploy, run, logs, status, kill (and the queue's view).

One module a concept: :mod:`.start` (validate and launch), :mod:`.status` (node
records merged into a run's status), :mod:`.logs` (merged streams, followed with
re-attach), :mod:`.metrics` (a run's step metrics, from its node 0), :mod:`.kill`,
:mod:`.deployment`. The CLI reaches them through a :class:`~.backend.Backend`
(:func:`backend_for`): :mod:`.nodes_backend` wraps these for the SSH nodes,
:mod:`.slurm_backend` runs the same contract on a Slurm cluster. The async calls take a connected
:class:`~higgsfield.remote.Group` (:func:`connect`), so one command reuses its
connections for all its steps; ``start_run``, ``list_runs``, ``get_run`` and ``kill``
run their own event loop, for callers that do one thing.
"""

from higgsfield.errors import NodeLost
from higgsfield.orchestrator.backend import Backend, RunList, RunRequest, Session
from higgsfield.orchestrator.backends import backend_for
from higgsfield.orchestrator.deployment import DeployResult, NodeDeploy, deploy
from higgsfield.orchestrator.kill import kill, kill_runs, stop_run
from higgsfield.orchestrator.logs import LOST_AFTER_S, NOTICE, LogLine, follow, stream_logs
from higgsfield.orchestrator.metrics import metrics_node, read_metrics
from higgsfield.orchestrator.nodes import connect
from higgsfield.orchestrator.start import RunHandle, RunPlan, launch, plan_run, start_run, start_run_async
from higgsfield.orchestrator.status import (
    final_status,
    find_run,
    get_run,
    list_runs,
    merge,
    query_runs,
    resolve_target,
)
from higgsfield.runspec import RunStatus

__all__ = [
    "LOST_AFTER_S", "NOTICE", "Backend", "DeployResult", "LogLine", "NodeDeploy", "NodeLost", "RunHandle",
    "RunList", "RunPlan", "RunRequest", "RunStatus", "Session", "backend_for", "connect", "deploy",
    "final_status", "find_run", "follow", "get_run", "kill", "kill_runs", "launch", "list_runs", "merge",
    "metrics_node", "plan_run", "query_runs", "read_metrics", "resolve_target", "start_run",
    "start_run_async", "stop_run", "stream_logs",
]
