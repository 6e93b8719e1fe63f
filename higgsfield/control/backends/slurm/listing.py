"""The script the login node runs to list a project's runs: every run directory's job.json and run.json.

One JSON list in one round trip (``python3 -c``), read by
:meth:`~higgsfield.control.backends.slurm.client.SlurmCluster.statuses`. Its own module
because it is code for the other side: it runs on the login node with its python3, so the
script imports nothing of higgsfield. Its answer is decoded here, once (:func:`listed_runs`):
each run's ``job.json`` into a :class:`~higgsfield.contract.slurmjob.SlurmJob`, one that does
not decode skipped with one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError, kind, loads, skip_line
from higgsfield.contract.layout import JOB, RUNS
from higgsfield.contract.slurmjob import SlurmJob, decode_job

#: Run on the login node: every run directory's job.json and run.json, as one JSON list (one round trip).
_LIST_RUNS = """\
import json, os, sys
root, out = sys.argv[1], []
try:
    names = sorted(os.listdir(root))
except OSError:
    names = []
for name in names:
    item = {"run": name}
    for key, file in (("job", "job.json"), ("record", "run.json")):
        try:
            with open(os.path.join(root, name, file)) as f:
                item[key] = json.load(f)
        except (OSError, ValueError):
            pass
    if "job" in item:
        out.append(item)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Listed:
    """One run directory as the listing found it: its submission record and the job's own record (``run.json``,
    None until the job has started)."""

    run: str
    job: SlurmJob
    record: dict[str, Any] | None = None


def _object_or_none(v: object) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None   # a run.json that is no object: as if not written yet


@dataclass(frozen=True)
class _Item:
    """One item of the script's answer, as it prints it (``job``: job.json's JSON, decoded after)."""

    WHAT: ClassVar[str] = "listed item"

    run: str
    job: dict[str, Any]
    record: dict[str, Any] | None = field(default=None, metadata=rule(decode=_object_or_none))


def listed_runs(text: str, project: str) -> tuple[list[Listed], list[str]]:
    """The script's answer: the runs whose ``job.json`` decodes, and one skip line for each that does not.
    DecodeError when the answer is not a JSON list."""
    data = loads(text)
    if not isinstance(data, list):
        raise DecodeError(f"the listing is {kind(data)}, not a list")
    out: list[Listed] = []
    skipped: list[str] = []
    for i, raw in enumerate(data):
        try:
            item = decode(_Item, raw)
        except DecodeError as e:
            skipped.append(skip_line(f"{RUNS}/{project}", f"listed item {i}: {e}"))
            continue
        try:
            out.append(Listed(item.run, decode_job(item.job), item.record))
        except DecodeError as e:
            skipped.append(skip_line(f"{RUNS}/{project}/{item.run}/{JOB}", str(e)))
    return out, skipped
