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
same). It holds no secret and no coordinator token.

Stdlib only: the worker's entrypoint reads it, inside the project's image too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from higgsfield.contract.decode import DecodeError, from_fields, read_json
from higgsfield.contract.runspec import RunSpec, SpecError

STOP_GRACE_S = 3.0  # SIGTERM (``docker stop``) to SIGKILL when a run is killed
SPEC_MAX_BYTES = 16 << 20  # params are the user's: more room than a record gets, still a bound


@dataclass(frozen=True)
class Placement:
    """What this node adds to a run's spec (see the module's docstring)."""

    gpus: int                       # GPUs on this node (0: the run gets CPU slots)
    cache_dir: str                  # ~/.cache/higgsfield/<project>: mounted read-write into the container
    checkpoint_dir: str             # the run's checkpoints (HIGGSFIELD_CHECKPOINT_DIR), under cache_dir
    container: str                  # the run's container on this node (runtime docker)
    image: str | None = None        # the project's image (runtime docker)
    python: str | None = None       # the project environment's python (runtime process)
    stop_grace: float = STOP_GRACE_S
    coord_port: int | None = None   # node 0: the port of the run's coordinator

    @classmethod
    def from_dict(cls, d: object) -> Placement:
        """The placement's fields of ``spec.json``, each checked for its type (SpecError says which is wrong)."""
        try:
            p = from_fields(cls, d, what="the node's run spec")
        except DecodeError as e:
            raise SpecError(f"the node's run spec is malformed: {e}") from None
        if p.gpus < 0 or p.stop_grace < 0 or (p.coord_port is not None and not 0 < p.coord_port < 65536):
            raise SpecError("the node's run spec is malformed: 'gpus', 'stop_grace' or 'coord_port' out of range")
        return p


_SPEC_FIELDS = frozenset(f.name for f in fields(RunSpec))


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

    def to_dict(self) -> dict[str, Any]:
        return {**self.spec.to_dict(), **asdict(self.placement)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeRun:
        return cls(spec=_spec_of(d), placement=Placement.from_dict(d))

    def write(self, path: Path) -> None:
        from higgsfield.node.state.records import write_json

        write_json(path, self.to_dict())

    @classmethod
    def read(cls, path: Path) -> NodeRun:
        return cls.from_dict(_load(path))


def read_run_spec(path: Path) -> RunSpec:
    """Only the (pinned) spec of ``spec.json``: what a worker needs to import and call the experiment."""
    return _spec_of(_load(path))


def _spec_of(d: dict[str, Any]) -> RunSpec:
    # The placement's keys (and those an older node wrote, such as the derived 'nnodes') are not the spec's.
    return RunSpec.from_dict({k: v for k, v in d.items() if k in _SPEC_FIELDS})


def _load(path: Path) -> dict[str, Any]:
    """``spec.json`` parsed (a regular file, no symlink, bounded in size): SpecError when it is not an object."""
    try:
        data = read_json(Path(path), limit=SPEC_MAX_BYTES)
    except DecodeError as e:
        raise SpecError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path} is not a JSON object")
    return data
