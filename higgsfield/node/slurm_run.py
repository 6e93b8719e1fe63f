"""A Slurm run's own files inside its allocation, shared by the job's roles (:mod:`higgsfield.node.slurm_task`).

The run directory lives in the cluster's shared workdir (the job's state dir): its
``request.json`` (what the control side asked, decoded once), its ``secrets.json``
(taken and deleted first thing, written back while the job may be requeued), its
record, and the record of a start that failed. Apart from the roles because each of
the batch step, the node task and the stacks task reads or writes these the same way.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Sequence

from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.errors import RunError
from higgsfield.contract.layout import REQUEST, SECRETS
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.slurmjob import SlurmRequest, WrongVersion, decode_request
from higgsfield.contract.states import FAILED
from higgsfield.node.state.records import RunDir, RunRecord

PORT_VAR = "HIGGSFIELD_SLURM_PORT"
SECRET_NAMES_VAR = "HIGGSFIELD_SLURM_SECRETS"   # names only: the values are the variables themselves


class TaskError(RunError):
    """The job cannot run as asked (its request is missing or malformed, its secrets are gone): exit 2."""

    exit_code = 2


class BadRequest(TaskError):
    """The request is this version's but a field of it is wrong: the job records it as its start failure."""


# -- the run directory ----------------------------------------------------------

def run_dir(path: str) -> RunDir:
    """The RunDir of ``<workdir>/runs/<project>/<run>`` (the workdir is the job's state dir)."""
    return RunDir.of_path(path)


def read_request(rd: RunDir) -> SlurmRequest:
    """The run's ``request.json``, decoded once: :class:`TaskError` when it is unreadable or of another version
    (``REQUEST_VERSION``), :class:`BadRequest` naming the field that is wrong."""
    path = rd.path / REQUEST
    try:
        data = read_json(path)
    except (OSError, DecodeError) as e:
        raise TaskError(f"cannot read {path}: {e}") from None
    try:
        return decode_request(data, where=str(path))
    except WrongVersion as e:
        raise TaskError(str(e)) from None
    except DecodeError as e:
        raise BadRequest(f"the run's request: {e}") from None


def take_secrets(rd: RunDir, names: Sequence[str]) -> dict[str, str]:
    """The secrets file's values, the file deleted first thing (a job that dies later leaves none behind)."""
    path = rd.path / SECRETS
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if names:
            raise TaskError(f"the run's secrets file is gone ({', '.join(names)}): this job was started again "
                            "by Slurm (not by its own requeue); start the run again") from None
        return {}
    finally:
        path.unlink(missing_ok=True)
    secrets = json.loads(data)
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in secrets.items()):
        raise TaskError(f"{path} is not an object of strings")
    return secrets


def put_secrets_back(rd: RunDir, secrets: dict[str, str]) -> None:
    """For our own requeue: the next start takes them again (0600, created private, never world-readable)."""
    if not secrets:
        return
    path = rd.path / SECRETS
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(secrets, f)


def write_record(rd: RunDir, record: RunRecord) -> None:
    rd.write(record)


def now() -> float:
    return time.time()


def read_record(rd: RunDir) -> RunRecord | None:
    try:
        return rd.read()
    except (OSError, ValueError, TypeError):
        return None


def start_failed(rd: RunDir, spec: RunSpec | None, reason: str) -> int:
    """The job could not start the run: recorded as failed (``reason``), said on stderr; the job's exit status."""
    record_start_failure(rd, spec, reason)
    print(f"higgsfield: {reason}", file=sys.stderr, flush=True)
    return 2


def record_start_failure(rd: RunDir, spec: RunSpec | None, reason: str) -> None:
    try:
        rd.make()
        write_record(rd, RunRecord(project=spec.project if spec else rd.path.parent.name,
                                   experiment=spec.experiment if spec else "?", run=rd.path.name,
                                   node=socket.gethostname(), node_rank=0, nnodes=0, nproc=0, state=FAILED,
                                   runtime="slurm", reason=reason, exit_code=2, started_at=now(), ended_at=now()))
    except OSError:
        pass
