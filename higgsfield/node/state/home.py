"""This node's state directory, resolved once per command, and every path in it.

The invoker's CLI builds one :class:`NodeState` per command (from ``--state-dir``), the
Slurm task one from its run's directory (its workdir), and passes it down: a function
asks it for the path it needs instead of joining names to a directory of its own.
The names are :mod:`higgsfield.contract.layout`'s (the whole tree is drawn there); a
run's own directory is :class:`higgsfield.node.state.records.RunDir`, which carries
the NodeState it lies in.

Use::

    home = NodeState.at("~/.higgsfield")     # ~ expanded, a relative path relative to the home
    home.code("demo")                         # <state>/projects/demo/code
    RunDir(home, "demo", "train-1").path      # <state>/runs/demo/train-1
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from higgsfield.contract import layout


@dataclass(frozen=True)
class NodeState:
    """The node's state directory (``root``, absolute) and the paths under it."""

    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> NodeState:
        """The state directory ``path`` names (``--state-dir``), resolved as over SSH
        (:func:`higgsfield.contract.layout.state_path`: ``~`` expanded, a relative path under the home)."""
        return cls(layout.state_path(os.fspath(path)))

    def make(self) -> None:
        """Create the state directory, private to the node user (0700)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            self.root.chmod(0o700)

    # -- runs -----------------------------------------------------------------------------------------

    @property
    def runs(self) -> Path:
        """``runs/``: every project's run directories."""
        return self.root / layout.RUNS

    def runs_of(self, project: str) -> Path:
        """``runs/<project>/``: the project's run directories."""
        return self.root / layout.runs_dir(project)

    # -- the queue, the trash -------------------------------------------------------------------------

    @property
    def queue_file(self) -> Path:
        """``queue.json``: the node's queue (:mod:`higgsfield.node.gang.queue`)."""
        return self.root / layout.QUEUE

    @property
    def queue_lock(self) -> Path:
        """``queue.lock``: flock'd for each read-modify-write of the queue."""
        return self.root / layout.QUEUE_LOCK

    @property
    def trash(self) -> Path:
        """``trash/``: run directories a prune renamed away and is removing."""
        return self.root / layout.TRASH

    # -- a project's code and environment -------------------------------------------------------------

    def project(self, project: str) -> Path:
        """``projects/<project>/``: its releases, ``code`` link, deployed.json, image.json, env.json."""
        return self.root / layout.project_dir(project)

    def code(self, project: str) -> Path:
        """``projects/<project>/code``: the deployed tree (a link to its release)."""
        return self.root / layout.code_dir(project)

    def env_record(self, project: str) -> Path:
        """``projects/<project>/env.json``: the project environment's record."""
        return self.root / layout.env_record(project)

    def env_build_log(self, project: str) -> Path:
        """``projects/<project>/env-build.log``: pip's output of the last environment build."""
        return self.root / layout.env_build_log(project)

    def envs(self, project: str) -> Path:
        """``envs/<project>/``: the project environment's venvs, one per key."""
        return self.root / layout.envs_dir(project)

    # -- checkpoints ----------------------------------------------------------------------------------

    def slurm_checkpoints(self, project: str) -> Path:
        """``checkpoints/<project>/``: a Slurm project's checkpoints (the state dir is its workdir)."""
        return self.root / layout.slurm_checkpoint_root(project)
