"""How the control side calls the invoker (the node-side agent) on a node.

On an SSH node the invoker is this package installed by ``higgsfield setup`` into
its own venv under the node's state directory; on ``localhost`` it is this very
interpreter. Paths are home-relative because quoted ``~`` is not expanded.
"""

from __future__ import annotations

import sys

from higgsfield.config import Config, NodeConfig


def node_state_dir(cfg: Config, node: NodeConfig) -> str:
    """The state directory as the node sees it: home-relative unless absolute."""
    d = cfg.state_dir
    if d == "~":
        return "."
    if d.startswith("~/"):
        return d[2:]
    return d


def invoker_argv(cfg: Config, node: NodeConfig) -> list[str]:
    """argv prefix that runs ``higgsfield invoker`` on ``node``."""
    state = node_state_dir(cfg, node)
    if node.is_local:
        return [sys.executable, "-m", "higgsfield", "invoker", "--state-dir", state]
    return [f"{state}/venv/bin/higgsfield", "invoker", "--state-dir", state]
