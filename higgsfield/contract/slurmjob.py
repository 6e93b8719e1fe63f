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

Each is encoded by :func:`higgsfield.contract.codec.encode` and read by its ``decode_*`` function
(:func:`higgsfield.contract.codec.decode`: typed fields, bounded strings, names checked) whose
:class:`~higgsfield.contract.decode.DecodeError` is one line naming the file; :class:`WrongVersion`
(a DecodeError) when the file is of another version. Stdlib only: both sides read it.

Use::

    put(encode(SlurmRequest(spec=spec, secret_names=sorted(secrets), ...)))      # control side, at submit
    req = decode_request(read_json(path), where=str(path))                       # node side, in the job
    job = decode_job(loads(text)); job.job_id                                    # control side, status/kill
    pinned = decode_pinned(read_json(path), where=str(path))                     # node side, each node's task
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, encode, rule
from higgsfield.contract.decode import DecodeError, kind
from higgsfield.contract.layout import JOB, REQUEST, REQUEST_VERSION, SPEC
from higgsfield.contract.names import NAME_RE, is_run_name
from higgsfield.contract.runspec import SPEC_KEYS, RunSpec, SpecError, read_spec
from higgsfield.contract.text import has_control, shown

__all__ = ["JOB_VERSION", "REQUEST_VERSION", "PinnedSlurmRun", "SlurmJob", "SlurmRequest", "WrongVersion",
           "decode_job", "decode_pinned", "decode_request", "pinned_json"]

JOB_VERSION = 1          # of job.json; a file without one is an earlier release's (this same shape)
MAX_TEXT = 4096          # a path, a login node, an #SBATCH option, a name: far below this
MAX_ITEMS = 1000         # secret names, #SBATCH options
_SECRET_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,199}\Z")   # an environment variable's name
_JOB_ID = re.compile(r"\A[0-9]{1,20}\Z")                           # what ``sbatch --parsable`` printed


class WrongVersion(DecodeError):
    """The file is another version's (or no such file at all): the two sides' higgsfield differ."""


# -- the field rules: each raises ValueError with the reason (the codec names the field) --------------

def _line(value: str) -> None:
    """One line of at most MAX_TEXT characters (it is shown, and becomes a path or an argument)."""
    if len(value) > MAX_TEXT or has_control(value):
        raise ValueError(f"{shown(value)} holds a control character or is too long")


def _lines(values: list[str]) -> None:
    if len(values) > MAX_ITEMS:
        raise ValueError(f"has {len(values)} items (at most {MAX_ITEMS})")
    for v in values:
        _line(v)


def _not_negative(v: float) -> None:
    if v < 0:
        raise ValueError("must not be negative")


def _secret_names(names: list[str]) -> None:
    if len(names) > MAX_ITEMS:
        raise ValueError(f"has more than {MAX_ITEMS} names")
    bad = next((n for n in names if not _SECRET_NAME.fullmatch(n)), None)
    if bad is not None:
        raise ValueError(f"holds {shown(bad)}, not an environment variable's name")


def _job_id(v: str) -> None:
    if not _JOB_ID.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a Slurm job id")


def _project(v: str) -> None:
    if v and not NAME_RE.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a project name")


def _run(v: str) -> None:
    if v and not is_run_name(v):
        raise ValueError(f"{shown(v)} is not a run name")


def _spec(v: object) -> RunSpec:
    """The RunSpec, checked as a node checks any spec (SpecError's line, as a DecodeError)."""
    try:
        return read_spec(v)
    except SpecError as e:
        raise DecodeError(str(e)) from None


LINE = rule(check=_line)
NOT_NEGATIVE = rule(check=_not_negative)


# -- request.json ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmRequest:
    """``request.json``: what the control side asks the Slurm job to run (written at submit, read by the job)."""

    WHAT: ClassVar[str] = "request"

    spec: RunSpec = field(metadata=rule(decode=_spec))   # the template: node fields ``pending`` until pinned
    secret_names: list[str] = field(default_factory=list, metadata=rule(check=_secret_names))
    """Sorted; the values are in secrets.json."""
    max_restarts: int = field(default=0, metadata=NOT_NEGATIVE)     # the job's requeue count
    gpus_per_node: int = field(default=0, metadata=NOT_NEGATIVE)    # the slurm block's; else the spec's nproc
    checkpoint_dir: str = field(default="", metadata=LINE)
    """HIGGSFIELD_CHECKPOINT_DIR: in the shared workdir, every requeue sees it."""
    cache_dir: str = field(default="", metadata=LINE)               # the project's cache in the shared workdir
    submitted_at: float = field(default=0.0, metadata=NOT_NEGATIVE)
    """The run's created_at (0: unknown, the job's start stands in)."""
    allow_drift: bool = field(default=False, metadata=rule(sparse=True))
    """run --allow-drift: the job's drift check reports and goes on (written only when set, which an earlier
    release's job ignores)."""
    version: int = REQUEST_VERSION


def decode_request(data: object, *, where: str = REQUEST) -> SlurmRequest:
    """The request in ``data`` (parsed JSON). :class:`WrongVersion` (``where`` names the file) for anything
    but an object of ``REQUEST_VERSION``; else :class:`DecodeError` naming the field that is wrong."""
    if not isinstance(data, dict) or data.get("version") != REQUEST_VERSION:
        raise WrongVersion(f"{where} is not a version-{REQUEST_VERSION} request: "
                           "the login node's higgsfield and the job's differ; run 'higgsfield setup'")
    return decode(SlurmRequest, data)


# -- job.json -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmJob:
    """``job.json``: the control side's record of a submission (the Slurm job id, when, with what).

    Only ``job_id`` is required: the names and the time fall back on the job's own
    record (``run.json``) where they are empty, as the status merge has always done.
    """

    WHAT: ClassVar[str] = "job.json"

    job_id: str = field(metadata=rule(check=_job_id))                # digits: what ``sbatch --parsable`` printed
    submitted_at: float = field(default=0.0, metadata=NOT_NEGATIVE)
    login: str = field(default="", metadata=LINE)                    # the login node it was submitted through
    sbatch: list[str] = field(default_factory=list, metadata=rule(check=_lines))   # ``--name=value`` each
    project: str = field(default="", metadata=rule(check=_project))
    experiment: str = field(default="", metadata=LINE)
    run: str = field(default="", metadata=rule(check=_run))
    params: dict[str, Any] = field(default_factory=dict)   # the run's resolved params (a re-run starts from them)
    version: int = JOB_VERSION


def decode_job(data: object, *, where: str = JOB) -> SlurmJob:
    """The record in ``data`` (parsed JSON); :class:`WrongVersion` for another version's, else
    :class:`DecodeError` naming the field that is wrong, in one line."""
    if not isinstance(data, dict):
        raise DecodeError(f"{where} is {kind(data)}, not an object")
    if data.get("version", JOB_VERSION) != JOB_VERSION:
        raise WrongVersion(f"{where} is of version {shown(data.get('version'))} (this higgsfield reads "
                           f"{JOB_VERSION}): upgrade higgsfield here, the run was submitted by a newer one")
    return decode(SlurmJob, data)


# -- spec.json ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PinnedSlurmRun:
    """``spec.json`` of a Slurm run: the spec pinned to the allocation, and what every node's task needs beside it.

    Written by the batch step once per start of the job (a requeue writes it again), read
    by each node's task before torchrun. One flat JSON object (:func:`pinned_json`): the spec's
    keys, then these. A field absent reads as its default (``allow_drift`` False: the key a job
    of an earlier release did not write).
    """

    WHAT: ClassVar[str] = "pinned spec"

    spec: RunSpec = field(metadata=rule(decode=_spec))   # pinned: nodes in SLURM_NODEID order, nproc counted
    gpus: int = field(default=0, metadata=NOT_NEGATIVE)                   # the slurm block's GPUs per node
    checkpoint_dir: str = field(default="", metadata=LINE)   # HIGGSFIELD_CHECKPOINT_DIR, in the shared workdir
    cache_dir: str = field(default="", metadata=LINE)        # the project's cache in the shared workdir
    container: str = field(default="", init=False)
    """Always empty: the key an SSH node's placement has, so a reader of either layout finds it."""
    python: str = field(default="", metadata=LINE)           # the batch step's interpreter: ``stacks`` runs it
    allow_drift: bool = False       # run --allow-drift: the nodes' differences are printed, torchrun starts anyway


def pinned_json(pinned: PinnedSlurmRun) -> dict[str, Any]:
    """The JSON of ``spec.json``: the spec's keys, then the placement's."""
    out: dict[str, Any] = encode(pinned)
    return {**out.pop("spec"), **out}


def decode_pinned(data: object, *, where: str = SPEC) -> PinnedSlurmRun:
    """The pinned run in ``data`` (parsed JSON, :func:`pinned_json`'s shape); :class:`DecodeError` in one line,
    ``where`` (the file) first, naming the field that is wrong."""
    if not isinstance(data, dict):
        raise DecodeError(f"{where} is {kind(data)}, not an object")
    spec = {k: v for k, v in data.items() if k in SPEC_KEYS}
    try:
        return decode(PinnedSlurmRun, {**{k: v for k, v in data.items() if k not in SPEC_KEYS}, "spec": spec})
    except DecodeError as e:
        raise DecodeError(f"{where}: {e}") from None
