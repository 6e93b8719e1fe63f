"""The prune request: what the control side asks each node to remove, in the shape both sides read.

``higgsfield prune`` and deploy's retention build a :class:`PrunePolicy` and send
:meth:`PrunePolicy.to_json` on the node's stdin; the node's ``invoker prune`` reads it back
with :meth:`PrunePolicy.from_dict` and plans from the same fields. One class on both sides,
in the stdlib-only contract beside :mod:`higgsfield.contract.runspec`, so a field added on one side
cannot be missing on the other. A node older than the control side names the field it does
not know, in one line, rather than ignoring it (an ignored ``runs`` would prune by age alone).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from higgsfield.contract.errors import RunError
from higgsfield.contract.names import is_run_name
from higgsfield.contract.text import shown

FLAGS = ("checkpoints", "images", "dry_run")


class PruneError(RunError):
    """A prune request this node cannot read (a bad field): one line, exit 2, nothing removed."""

    exit_code = 2


@dataclass(frozen=True)
class PrunePolicy:
    """What to remove. With ``runs``, exactly those (and only if older than ``older_than_s``
    when that is given too); otherwise a run goes when it is older than ``older_than_s``
    *or* past the newest ``keep_runs``; with neither, no run goes. ``checkpoints`` takes a
    removed run's checkpoints too, ``images`` the project's unused images, and ``dry_run``
    lists what would go."""

    older_than_s: float | None = None
    keep_runs: int | None = None
    runs: tuple[str, ...] = ()
    checkpoints: bool = False
    images: bool = False
    dry_run: bool = False

    def to_json(self) -> str:
        d = asdict(self)
        d["runs"] = list(self.runs)
        return json.dumps(d)

    @classmethod
    def from_dict(cls, d: object) -> PrunePolicy:
        """The policy in ``d`` (parsed JSON), each field checked: :class:`PruneError` names the bad one."""
        if not isinstance(d, dict):
            raise PruneError("the prune request is not a JSON object")
        unknown = sorted(set(d) - {"older_than_s", "keep_runs", "runs", *FLAGS})
        if unknown:
            raise PruneError(f"the prune request has unknown field(s) {', '.join(map(shown, unknown))}: "
                             "is the invoker older than the control side? (higgsfield setup --step invoker)")
        age, keep, runs = d.get("older_than_s"), d.get("keep_runs"), d.get("runs") or []
        if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float)) or not age >= 0):
            raise PruneError(f"'older_than_s' {shown(age)} is not a number of seconds")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise PruneError(f"'keep_runs' {shown(keep)} is not a count")
        if not isinstance(runs, list) or not all(is_run_name(r) for r in runs):
            raise PruneError(f"'runs' {shown(runs)} is not a list of run names")
        flags = {k: d.get(k, False) for k in FLAGS}
        for k, v in flags.items():
            if not isinstance(v, bool):
                raise PruneError(f"{shown(k)} {shown(v)} is not true or false")
        return cls(older_than_s=None if age is None else float(age), keep_runs=keep, runs=tuple(runs), **flags)
