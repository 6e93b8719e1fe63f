"""The prune request: what the control side asks each node to remove, in the shape both sides read.

``higgsfield prune`` and deploy's retention build a :class:`PrunePolicy` and send
:meth:`PrunePolicy.to_json` on the node's stdin; the node's ``invoker prune`` reads it back
with :func:`read_policy` (``codec.decode``) and plans from the same fields. One class on both sides,
in the stdlib-only contract beside :mod:`higgsfield.contract.runspec`, so a field added on one side
cannot be missing on the other. A node older than the control side names the field it does
not know, in one line, rather than ignoring it (an ignored ``runs`` would prune by age alone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from higgsfield.contract.codec import DecodeError, decode, encode, rule
from higgsfield.contract.errors import RunError
from higgsfield.contract.names import is_run_name
from higgsfield.contract.text import shown


class PruneError(RunError):
    """A prune request this node cannot read (a bad field): one line, exit 2, nothing removed."""

    exit_code = 2


# Each field's decoder says what is wrong in the words a user of ``higgsfield prune`` reads.

def _seconds(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise DecodeError(f"'older_than_s' {shown(v)} is not a number of seconds")
    return float(v)


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise DecodeError(f"'keep_runs' {shown(v)} is not a count")
    return v


def _runs(v: object) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(is_run_name(r) for r in v):
        raise DecodeError(f"'runs' {shown(v)} is not a list of run names")
    return tuple(v)


def _flag(key: str) -> Any:
    def check(v: object) -> bool:
        if not isinstance(v, bool):
            raise DecodeError(f"{shown(key)} {shown(v)} is not true or false")
        return v
    return rule(decode=check)


@dataclass(frozen=True)
class PrunePolicy:
    """What to remove. With ``runs``, exactly those (and only if older than ``older_than_s``
    when that is given too); otherwise a run goes when it is older than ``older_than_s``
    *or* past the newest ``keep_runs``; with neither, no run goes. ``checkpoints`` takes a
    removed run's checkpoints too, ``images`` the project's unused images, and ``dry_run``
    lists what would go."""

    WHAT: ClassVar[str] = "prune request"

    older_than_s: float | None = field(default=None, metadata=rule(decode=_seconds))
    keep_runs: int | None = field(default=None, metadata=rule(decode=_count))
    runs: tuple[str, ...] = field(default=(), metadata=rule(decode=_runs))
    checkpoints: bool = field(default=False, metadata=_flag("checkpoints"))
    images: bool = field(default=False, metadata=_flag("images"))
    dry_run: bool = field(default=False, metadata=_flag("dry_run"))

    def to_json(self) -> str:
        return json.dumps(encode(self))


_KEYS = frozenset(f.name for f in fields(PrunePolicy))


def read_policy(data: object) -> PrunePolicy:
    """The policy in ``data`` (parsed JSON), each field checked: :class:`PruneError` names the bad one; a field
    this node does not know names the node as the older side (an ignored ``runs`` would prune by age alone)."""
    if not isinstance(data, dict):
        raise PruneError("the prune request is not a JSON object")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise PruneError(f"the prune request has unknown field(s) {', '.join(map(shown, unknown))}: "
                         "is the invoker older than the control side? (higgsfield setup --step invoker)")
    try:
        return decode(PrunePolicy, data)
    except DecodeError as e:
        raise PruneError(str(e)) from None
