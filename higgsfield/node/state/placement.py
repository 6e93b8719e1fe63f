"""A run as this node runs it: the control side's :class:`~higgsfield.contract.runspec.RunSpec`, pinned, plus its placement.

The control side says *what* to run (the spec); the node decides *how, here*:

- it pins the spec: ``code_dir`` resolved to the release deployed now (a later
  deploy does not change a running run), ``nproc`` counted (one per GPU for
  ``None``), ``runtime`` chosen (``docker`` or ``process``, never ``auto``);
- it adds a :class:`Placement`: the node's GPU count, the image or the project
  environment's python, the cache and checkpoint directories, the container's name,
  the stop grace and, on node 0, the coordinator's port.

``start`` writes the pair to ``RUN_DIR/spec.json`` (:meth:`NodeRun.write`); the
supervisor, the torchrun command and environment, the container and the worker's
entrypoint read it back typed (:meth:`NodeRun.read`, :func:`read_run_spec`). The file
is one flat JSON object, the spec's fields and the placement's side by side (the
layout the node has always written, so a run started by an older invoker reads the
same): each half is encoded and decoded by :mod:`higgsfield.contract.codec` on its own.
It holds no secret and no coordinator token.

Stdlib only: the worker's entrypoint reads it, inside the project's image too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.runspec import SPEC_KEYS, RunSpec, SpecError, read_spec

STOP_GRACE_S = 3.0  # SIGTERM (``docker stop``) to SIGKILL when a run is killed
SPEC_MAX_BYTES = 16 << 20  # params are the user's: more room than a record gets, still a bound


@dataclass(frozen=True)
class Placement:
    """What this node adds to a run's spec (see the module's docstring)."""

    WHAT: ClassVar[str] = "node's run spec"

    gpus: int                       # GPUs on this node (0: the run gets CPU slots)
    cache_dir: str                  # ~/.cache/higgsfield/<project>: mounted read-write into the container
    checkpoint_dir: str             # the run's checkpoints (HIGGSFIELD_CHECKPOINT_DIR), under cache_dir
    container: str                  # the run's container on this node (runtime docker)
    image: str | None = None        # the project's image (runtime docker)
    python: str | None = None       # the project environment's python (runtime process)
    stop_grace: float = STOP_GRACE_S
    coord_port: int | None = None   # node 0: the port of the run's coordinator

    def check(self) -> None:
        if self.gpus < 0 or self.stop_grace < 0 or (self.coord_port is not None and not 0 < self.coord_port < 65536):
            raise ValueError("'gpus', 'stop_grace' or 'coord_port' out of range")


@dataclass(frozen=True)
class NodeRun:
    """One node's part of a run: the pinned spec and where and how it runs here."""

    spec: RunSpec
    placement: Placement

    @property
    def docker(self) -> bool:
        return self.spec.runtime == "docker"

    @property
    def nproc(self) -> int:
        """Processes on this node (pinned at start, so never None here)."""
        return self.spec.nproc or 1

    def write(self, path: Path) -> None:
        """``spec.json``: the spec's keys and the placement's, side by side."""
        from higgsfield.node.state.records import write_json

        write_json(path, {**encode(self.spec), **encode(self.placement)})

    @classmethod
    def read(cls, path: Path) -> NodeRun:
        d = _load(path)
        return cls(spec=_spec_of(d), placement=_placement_of(d))


def read_run_spec(path: Path) -> RunSpec:
    """Only the (pinned) spec of ``spec.json``: what a worker needs to import and call the experiment."""
    return _spec_of(_load(path))


def _spec_of(d: dict[str, Any]) -> RunSpec:
    # The placement's keys (and those an older node wrote, such as the derived 'nnodes') are not the spec's.
    return read_spec({k: v for k, v in d.items() if k in SPEC_KEYS})


def _placement_of(d: dict[str, Any]) -> Placement:
    """The placement's fields of ``spec.json``, each checked for its type (SpecError says which is wrong)."""
    try:
        return decode(Placement, d)
    except DecodeError as e:
        raise SpecError(f"the node's run spec is malformed: {e}") from None


def _load(path: Path) -> dict[str, Any]:
    """``spec.json`` parsed (a regular file, no symlink, bounded in size): SpecError when it is not an object."""
    try:
        data = read_json(Path(path), limit=SPEC_MAX_BYTES)
    except DecodeError as e:
        raise SpecError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path} is not a JSON object")
    return data
