"""Where the invoker (this package, installed on a node) lives and how to call it.

Use::

    argv = [*invoker_argv(cfg, node), "version"]
    await transport.run(argv)

On an SSH node the invoker is ``<state_dir>/venv/bin/higgsfield`` (installed by
``higgsfield setup``; the path is relative to the login user's home). On a
``localhost`` node it is this very Python: ``python -m higgsfield``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from higgsfield.contract.layout import VENV

if TYPE_CHECKING:
    from higgsfield.control.config import Config, NodeConfig


def node_state_dir(cfg: Config) -> str:
    """``cfg.state_dir`` as a path a remote command can use: ``~/x`` becomes home-relative ``x``."""
    d = cfg.state_dir.rstrip("/") or "/"
    if d == "~":
        return "."
    if d.startswith("~/"):
        return d[2:]
    return d


def venv_dir(cfg: Config) -> str:
    return f"{node_state_dir(cfg)}/{VENV}"


def invoker_bin(cfg: Config, node: NodeConfig) -> list[str]:
    """The ``higgsfield`` command on ``node`` (without a subcommand)."""
    if node.is_local:
        return [sys.executable, "-m", "higgsfield"]
    return [f"{venv_dir(cfg)}/bin/higgsfield"]


def invoker_argv(cfg: Config, node: NodeConfig) -> list[str]:
    """The argv prefix of the node agent: append the invoker subcommand and its arguments.

    It names the state directory explicitly, so the invoker and the control side always agree on it.
    """
    return [*invoker_bin(cfg, node), "invoker", "--state-dir", node_state_dir(cfg)]
