"""``invoker profile``: this node's ranks of a live run profiled for their next N steps, the traces listed.

The node writes one :class:`~higgsfield.contract.profile.ProfileRequest` to
``RUN_DIR/profile/request.json`` (atomically) and waits until every live rank of the run here
that it asked has written ``profile/<id>/rank<N>.done.json`` (each rank reads the request at
most once a second and profiles its next steps: :mod:`higgsfield._lib.profile_arm`), or until
the deadline. The live ranks are those the stacks machinery finds (:func:`~higgsfield.node.runs.
stacks.live_workers`: the process runtime's workers and a container's alike). On a Slurm cluster the
login node runs this verb on the run's directory in the shared workdir (its ranks read the request
there, on their compute nodes): the ranks to ask are those that armed in the job's current start. The reply lists
the result files with size and sha256 for pull's fetch (:mod:`higgsfield.node.observe.files`'s
rule: plain files of the request's folder only).

    higgsfield invoker profile --project P --run R --steps 3 [--rank 1] [--memory] --timeout 60
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import time
from collections.abc import Collection
from pathlib import Path

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.errors import RunError
from higgsfield.contract.profile import (
    ProfileReply,
    ProfileRequest,
    RankDone,
    done_name,
    request_path,
    results_dir,
    trace_name,
)
from higgsfield.contract.replies_disk import FileEntry
from higgsfield.contract.states import ACTIVE
from higgsfield.node.runs.stacks import armed, live_workers
from higgsfield.node.runs.stop import refresh
from higgsfield.node.state.records import RunDir, RunRecord, write_json

SLURM = "slurm"   # a Slurm run's record's runtime (written by its batch step, :mod:`higgsfield.node.slurm_task`)

POLL_S = 0.1


class NotProfiled(RunError):
    """A run that is not running here: nothing to profile (one line, exit 2)."""

    exit_code = 2


def new_id(now: float | None = None) -> str:
    t = time.time() if now is None else now
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(t)) + "-" + secrets.token_hex(3)


def profile(rd: RunDir, *, steps: int, ranks: Collection[int] = (), memory: bool = False,
            timeout: float = 60.0) -> ProfileReply:
    """Ask this node's live ranks of the run (``ranks``: only those) to profile ``steps`` steps; see the module.

    ``missing`` names the ranks asked here that did not answer in time; a rank not live here (another node's,
    or none) is not asked, so a reply with neither ``done`` nor ``missing`` means this node had none to ask."""
    if not rd.exists():
        raise NotProfiled(f"no run '{rd.run}' of project '{rd.project}' on this node")
    record = refresh(rd)
    if record.state not in ACTIVE:
        raise NotProfiled(f"run '{rd.run}' is {record.state}, not running: only a live run can be profiled")
    live = _live(rd, record, set(ranks) or None)
    pid = new_id()
    if not live:
        return ProfileReply(run=rd.run, state=record.state, id=pid, root=str(results_dir(rd.path, pid)))
    deadline = time.time() + timeout
    req = ProfileRequest(id=pid, steps=steps, deadline=deadline, ranks=sorted(live), memory=memory)
    write_json(request_path(rd.path), encode(req))
    out = results_dir(rd.path, pid)
    done: dict[int, RankDone] = {}
    while time.time() < deadline and len(done) < len(live):
        for rank in live:
            if rank not in done:
                got = _read_done(rd, out, rank)
                if got is not None:
                    done[rank] = got
        if len(done) < len(live):
            if not _live(rd, record, [r for r in live if r not in done]) or \
                    (record.runtime == SLURM and rd.read().state not in ACTIVE):
                break   # the ranks still awaited are gone (the run ended): no use waiting
            time.sleep(POLL_S)
    return ProfileReply(run=rd.run, state=refresh(rd).state, id=pid, root=str(out),
                        done=[done[r] for r in sorted(done)], missing=sorted(set(live) - set(done)),
                        files=_files(out, done.values()))


def _live(rd: RunDir, record: RunRecord, ranks: Collection[int] | None) -> Collection[int]:
    """The run's live ranks to ask: this node's workers; for a Slurm run (its directory is the shared workdir's,
    read by the login node, its ranks on compute nodes) every rank that armed in this start of the job."""
    if record.runtime != SLURM:
        return live_workers(rd, ranks)
    since = record.started_at or 0.0
    return sorted(r for r, a in armed(rd).items() if a.time >= since and (ranks is None or r in ranks))


def _read_done(rd: RunDir, out: Path, rank: int) -> RankDone | None:
    try:
        return decode(RankDone, read_json(out / done_name(rank), root=rd.home.root))
    except (OSError, DecodeError):
        return None


def _files(out: Path, done: Collection[RankDone]) -> list[FileEntry]:
    """The answered ranks' result files (trace, memory snapshot): plain files of ``out`` only."""
    names = []
    for d in done:
        names += [trace_name(d.rank)] + ([d.memory] if d.memory else [])
    entries = []
    for n in names:
        try:
            if "/" in n or not stat.S_ISREG(os.lstat(out / n).st_mode):
                continue
        except OSError:
            continue
        entries.append(_entry(out, n))
    return entries


def _entry(root: Path, name: str) -> FileEntry:
    """One result file: its name under ``root``, size and sha256 (as ``invoker files`` lists a pull's)."""
    digest, size = hashlib.sha256(), 0
    with open(root / name, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return FileEntry(path=name, size=size, sha256=digest.hexdigest())
