"""Control-side operations across nodes: run, logs, status, kill (and deploy)."""

from higgsfield.orchestrator.runs import (
    LogLine,
    RunHandle,
    RunStatus,
    get_run,
    iter_logs,
    kill,
    list_runs,
    resolve_target,
    start_run,
    stream_logs,
)

__all__ = ["LogLine", "RunHandle", "RunStatus", "get_run", "iter_logs", "kill", "list_runs", "resolve_target",
           "start_run", "stream_logs"]
