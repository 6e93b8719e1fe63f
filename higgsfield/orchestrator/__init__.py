"""Control-side operations across nodes: deploy, run, logs, status, kill (and the queue's view)."""

from higgsfield.orchestrator.deployment import DeployResult, NodeDeploy, deploy
from higgsfield.orchestrator.runs import (
    LogLine,
    NodeLost,
    RunHandle,
    RunStatus,
    follow_run,
    get_run,
    iter_logs,
    kill,
    list_runs,
    resolve_target,
    start_run,
    start_run_async,
    stream_logs,
)

__all__ = ["DeployResult", "LogLine", "NodeDeploy", "NodeLost", "RunHandle", "RunStatus", "deploy", "follow_run",
           "get_run", "iter_logs", "kill", "list_runs", "resolve_target", "start_run", "start_run_async",
           "stream_logs"]
