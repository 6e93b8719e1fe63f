"""A Slurm run's files, typed: ``request.json`` (what the job runs), ``job.json`` (the submission), and the
``spec.json`` the job pins to its allocation.

The control side writes both into the run's directory of the shared workdir
(:meth:`higgsfield.control.backends.slurm.client.SlurmCluster.submit`):

- :class:`SlurmRequest` (``request.json``): what the control side asks the job to run: the
  RunSpec template (its node fields say ``pending`` until the job pins them to its
  allocation), the names of the run's secrets (their values travel in ``secrets.json``),
  the requeue count, the GPUs per node, the checkpoint and cache directories, when it was
  submitted. The node side (:mod:`higgsfield.node.slurm_task`) reads it once, as the batch
  step starts; one of another ``version`` (``REQUEST_VERSION``) is refused in one line.
- :class:`SlurmJob` (``job.json``): the control side's record of the submission: the Slurm
  job id, when, through which login node, with which ``#SBATCH`` options, and the run's
  names and params. ``status``, ``kill`` and the listing read it back. A ``job.json``
  without a ``version`` is an earlier release's, of this same shape.
- :class:`PinnedSlurmRun` (``spec.json``): what the job's batch step pinned to its
  allocation (the RunSpec with its nodes, node 0, nproc) and the placement every node's
  task needs (GPUs, checkpoint and cache directories, the job's python, ``allow_drift``).
  The batch step writes it; each node's task (and the ``stacks`` task) reads it back.
  One flat JSON object, the spec's fields and the placement's side by side, as an SSH
  node's ``spec.json`` (the worker's entrypoint reads the spec's fields of either).

Each has ``to_dict()`` (the JSON on disk) and a defensive ``from_dict()`` (through
:func:`higgsfield.contract.decode.from_fields`: typed fields, bounded strings, names checked)
whose :class:`~higgsfield.contract.decode.DecodeError` is one line; :class:`WrongVersion`
(a DecodeError) when the file is of another version. Stdlib only: both sides read it.

Use::

    put(SlurmRequest(spec=spec, secret_names=sorted(secrets), ...).to_dict())     # control side, at submit
    req = SlurmRequest.from_dict(read_json(path), where=str(path))               # node side, in the job
    job = SlurmJob.from_dict(loads(text)); job.job_id                            # control side, status/kill
    pinned = PinnedSlurmRun.from_dict(read_json(path), where=str(path))          # node side, each node's task
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from higgsfield.contract.decode import DecodeError, from_fields, kind
from higgsfield.contract.layout import JOB, REQUEST, REQUEST_VERSION, SPEC
from higgsfield.contract.names import NAME_RE, is_run_name
from higgsfield.contract.runspec import RunSpec, SpecError
from higgsfield.contract.text import has_control, shown

__all__ = ["JOB_VERSION", "REQUEST_VERSION", "PinnedSlurmRun", "SlurmJob", "SlurmRequest", "WrongVersion"]

JOB_VERSION = 1          # of job.json; a file without one is an earlier release's (this same shape)
MAX_TEXT = 4096          # a path, a login node, an #SBATCH option, a name: far below this
MAX_ITEMS = 1000         # secret names, #SBATCH options
_SECRET_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,199}\Z")   # an environment variable's name
_JOB_ID = re.compile(r"\A[0-9]{1,20}\Z")                           # what ``sbatch --parsable`` printed


class WrongVersion(DecodeError):
    """The file is another version's (or no such file at all): the two sides' higgsfield differ."""


def _line(value: str, key: str) -> str:
    """``value``, one line of at most MAX_TEXT characters (it is shown, and becomes a path or an argument)."""
    if len(value) > MAX_TEXT or has_control(value):
        raise DecodeError(f"'{key}' {shown(value)} holds a control character or is too long")
    return value


def _lines(values: list[str], key: str) -> list[str]:
    if len(values) > MAX_ITEMS:
        raise DecodeError(f"'{key}' has {len(values)} items (at most {MAX_ITEMS})")
    return [_line(v, key) for v in values]


# -- request.json ---------------------------------------------------------------------------------

def _spec(v: object) -> RunSpec:
    """The RunSpec template, checked as a node checks any spec (SpecError's line, as a DecodeError)."""
    try:
        return RunSpec.from_dict(v)
    except SpecError as e:
        raise DecodeError(str(e)) from None


def _as_is(v: object) -> object:
    return v   # decoded by _spec once the other fields are


@dataclass(frozen=True)
class SlurmRequest:
    """``request.json``: what the control side asks the Slurm job to run (written at submit, read by the job)."""

    spec: RunSpec                    # the template: node fields ``pending`` until the job pins its allocation
    secret_names: list[str] = field(default_factory=list)   # sorted; the values are in secrets.json
    max_restarts: int = 0            # the job's requeue count (the spec's max_restarts)
    gpus_per_node: int = 0           # the slurm block's; the spec's nproc when it has none
    checkpoint_dir: str = ""         # HIGGSFIELD_CHECKPOINT_DIR: in the shared workdir, every requeue sees it
    cache_dir: str = ""              # the project's cache in the shared workdir
    submitted_at: float = 0.0        # the run's created_at (0: unknown, the job's start stands in)
    allow_drift: bool = False        # run --allow-drift: the job's drift check reports and goes on (key only when set)
    version: int = REQUEST_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``request.json`` (the shape every release since 0.1 writes; ``allow_drift`` only when set,
        which an earlier release's job ignores)."""
        return {"version": self.version, "spec": self.spec.to_dict(), "secret_names": list(self.secret_names),
                "max_restarts": self.max_restarts, "gpus_per_node": self.gpus_per_node,
                "checkpoint_dir": self.checkpoint_dir, "cache_dir": self.cache_dir,
                "submitted_at": self.submitted_at, **({"allow_drift": True} if self.allow_drift else {})}

    @classmethod
    def from_dict(cls, data: object, *, where: str = REQUEST) -> SlurmRequest:
        """The request in ``data`` (parsed JSON). :class:`WrongVersion` (``where`` names the file) for anything
        but an object of ``REQUEST_VERSION``; else :class:`DecodeError` naming the field that is wrong."""
        if not isinstance(data, dict) or data.get("version") != REQUEST_VERSION:
            raise WrongVersion(f"{where} is not a version-{REQUEST_VERSION} request: "
                               "the login node's higgsfield and the job's differ; run 'higgsfield setup'")
        req = from_fields(cls, data, special={"spec": _as_is}, what="the request")
        req = replace(req, spec=_spec(req.spec))
        if req.max_restarts < 0 or req.gpus_per_node < 0 or req.submitted_at < 0:
            raise DecodeError("'max_restarts', 'gpus_per_node' and 'submitted_at' must not be negative")
        bad = next((n for n in req.secret_names if not _SECRET_NAME.fullmatch(n)), None)
        if bad is not None or len(req.secret_names) > MAX_ITEMS:
            raise DecodeError(f"'secret_names' holds {shown(bad)}, not an environment variable's name"
                              if bad is not None else f"'secret_names' has more than {MAX_ITEMS} names")
        _line(req.checkpoint_dir, "checkpoint_dir")
        _line(req.cache_dir, "cache_dir")
        return req


# -- job.json -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmJob:
    """``job.json``: the control side's record of a submission (the Slurm job id, when, with what).

    Only ``job_id`` is required: the names and the time fall back on the job's own
    record (``run.json``) where they are empty, as the status merge has always done.
    """

    job_id: str                      # digits: what ``sbatch --parsable`` printed
    submitted_at: float = 0.0
    login: str = ""                  # the login node it was submitted through
    sbatch: list[str] = field(default_factory=list)    # the #SBATCH options, ``--name=value`` each
    project: str = ""
    experiment: str = ""
    run: str = ""
    params: dict[str, Any] = field(default_factory=dict)   # the run's resolved params (a re-run starts from them)
    version: int = JOB_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``job.json``: the previous release's keys, and ``version``."""
        return {"version": self.version, "job_id": self.job_id, "submitted_at": self.submitted_at,
                "login": self.login, "sbatch": list(self.sbatch), "project": self.project,
                "experiment": self.experiment, "run": self.run, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: object, *, where: str = JOB) -> SlurmJob:
        """The record in ``data`` (parsed JSON); :class:`WrongVersion` for another version's, else
        :class:`DecodeError` naming the field that is wrong, in one line."""
        if isinstance(data, dict) and data.get("version", JOB_VERSION) != JOB_VERSION:
            raise WrongVersion(f"{where} is of version {shown(data.get('version'))} (this higgsfield reads "
                               f"{JOB_VERSION}): upgrade higgsfield here, the run was submitted by a newer one")
        job = from_fields(cls, data, what=where)
        if not _JOB_ID.fullmatch(job.job_id):
            raise DecodeError(f"'job_id' {shown(job.job_id)} is not a Slurm job id")
        if job.submitted_at < 0:
            raise DecodeError("'submitted_at' must not be negative")
        if job.project and not NAME_RE.fullmatch(job.project):
            raise DecodeError(f"'project' {shown(job.project)} is not a project name")
        if job.run and not is_run_name(job.run):
            raise DecodeError(f"'run' {shown(job.run)} is not a run name")
        _line(job.experiment, "experiment")
        _line(job.login, "login")
        _lines(job.sbatch, "sbatch")
        return job


# -- spec.json ------------------------------------------------------------------------------------

_SPEC_KEYS = frozenset(f.name for f in fields(RunSpec))


@dataclass(frozen=True)
class PinnedSlurmRun:
    """``spec.json`` of a Slurm run: the spec pinned to the allocation, and what every node's task needs beside it.

    Written by the batch step once per start of the job (a requeue writes it again), read
    by each node's task before torchrun. A field absent reads as its default (``allow_drift``
    False: the key a job of an earlier release did not write).
    """

    spec: RunSpec                    # pinned: nodes in SLURM_NODEID order, node 0's view, nproc counted
    gpus: int = 0                    # the slurm block's GPUs per node
    checkpoint_dir: str = ""         # HIGGSFIELD_CHECKPOINT_DIR (the request's, in the shared workdir)
    cache_dir: str = ""              # the project's cache in the shared workdir
    python: str = ""                 # the batch step's interpreter: the ``stacks`` task runs under it
    allow_drift: bool = False        # run --allow-drift: the nodes' differences are printed, torchrun starts anyway

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``spec.json``: the spec's keys, then the placement's (``container`` always empty: the
        key an SSH node's placement has, so a reader of either layout finds it)."""
        return {**self.spec.to_dict(), "gpus": self.gpus, "checkpoint_dir": self.checkpoint_dir,
                "cache_dir": self.cache_dir, "container": "", "python": self.python, "allow_drift": self.allow_drift}

    @classmethod
    def from_dict(cls, data: object, *, where: str = SPEC) -> PinnedSlurmRun:
        """The pinned run in ``data`` (parsed JSON); :class:`DecodeError` in one line, ``where`` (the file)
        first, naming the field that is wrong."""
        if not isinstance(data, dict):
            raise DecodeError(f"{where} is {kind(data)}, not an object")
        try:
            spec = RunSpec.from_dict({k: v for k, v in data.items() if k in _SPEC_KEYS})
            rest = {k: v for k, v in data.items() if k not in _SPEC_KEYS}
            pinned = from_fields(cls, {**rest, "spec": spec}, special={"spec": _as_is}, what=where)
            if pinned.gpus < 0:
                raise DecodeError("'gpus' must not be negative")
            for key in ("checkpoint_dir", "cache_dir", "python"):
                _line(getattr(pinned, key), key)
        except (SpecError, DecodeError) as e:
            raise DecodeError(f"{where}: {e}") from None
        return pinned
