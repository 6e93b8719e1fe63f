"""A node's live feed for the dashboard, typed: ``invoker stats --follow``'s lines, decoded once on the control side.

The node prints one JSON object per line (:mod:`higgsfield.node.observe.watch`)::

    {"node": {...NodeSample...}}                                  a machine sample, every few seconds
    {"runs": [record, ...], "full": true, "queue": [...], "skipped": [line, ...]}   when they change

:meth:`FeedLine.parse` turns a line into a :class:`FeedLine` (``codec.decode``): the sample as a
:class:`NodeSample` (each GPU a :class:`GpuSample`), the records as
:class:`~higgsfield.contract.noderuns.NodeRunView`, the queue as :class:`QueueEntry`. Each part
decodes on its own, as the dashboard always read them: a part that does not decode is
left out (the rest of the line stands), a record or queue entry that does not decode is
left out of its list, and a line that is not the feed's (a login banner) is None. A line
of another ``version`` (``FEED_VERSION``; none: version 1, the shape the feed always had)
is a one-line :class:`~higgsfield.contract.decode.DecodeError` naming which side to upgrade.

The node builds its samples as these same types (:mod:`higgsfield.node.observe.stats`,
:mod:`higgsfield.node.runtime.gpus`) and prints them (``codec.encode``): a sample is defined once, here.

The dashboard sends the page the encoded :class:`NodeSample` and :class:`QueueEntry`: the
keys and order the node printed (``app.js`` reads them).

Use::

    line = FeedLine.parse(raw)            # None: not a feed line
    if line and line.node: line.node.cpu_percent, [g.util_percent for g in line.node.gpus]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.names import is_run_name
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.text import one_line, shown

FEED_VERSION = 1
"""The schema of a feed line; a line without ``version`` is of this one (the node never sent one)."""

MAX_SKIPPED = 100       # skip lines kept per node, each cut to SKIP_CHARS
SKIP_CHARS = 600
MAX_TEXT = 8192         # a GPU's name, a project's: far below this

T = TypeVar("T")


def _not_negative(v: float) -> None:
    if v < 0:
        raise ValueError(f"must not be negative, not {v}")


def _text(v: str) -> None:
    if len(v) > MAX_TEXT:
        raise ValueError(f"is too long ({len(v)} characters; at most {MAX_TEXT})")


def _run(v: str) -> None:
    if not is_run_name(v):
        raise ValueError(f"{shown(v)} is not a run name")


NOT_NEGATIVE = rule(check=_not_negative)


@dataclass(frozen=True)
class GpuSample:
    """One GPU of a sample; a figure the GPU cannot report (NVML's NotSupported, nvidia-smi's [N/A]) is None."""

    WHAT: ClassVar[str] = "GPU sample"

    index: int = field(metadata=NOT_NEGATIVE)
    name: str = field(metadata=rule(check=_text))
    util_percent: float | None = field(default=None, metadata=NOT_NEGATIVE)
    mem_used_mib: float | None = field(default=None, metadata=NOT_NEGATIVE)
    mem_total_mib: float | None = field(default=None, metadata=NOT_NEGATIVE)
    temperature_c: float | None = None


@dataclass(frozen=True)
class NodeSample:
    """One sample of a node's machine: sizes in bytes, ``cpu_percent`` of all cores (0..100)."""

    WHAT: ClassVar[str] = "machine sample"

    time: float
    cpu_percent: float = field(metadata=NOT_NEGATIVE)
    cpu_count: int = field(metadata=NOT_NEGATIVE)
    load1: float
    mem_used: int = field(metadata=NOT_NEGATIVE)
    mem_total: int = field(metadata=NOT_NEGATIVE)
    disk_used: int = field(metadata=NOT_NEGATIVE)
    disk_total: int = field(metadata=NOT_NEGATIVE)
    gpus: list[GpuSample] = field(default_factory=list)


@dataclass(frozen=True)
class QueueEntry:
    """One run in a node's queue (every project's: they wait for the same slots): the slots it holds
    (None: it waits), how many it wants, whether they are its own until it ends (``committed``).

    What the page gets of the entry: never the supervisor's pid or the rendezvous port."""

    WHAT: ClassVar[str] = "queue entry"

    project: str = field(metadata=rule(check=_text))
    run: str = field(metadata=rule(check=_run))
    want: int | None = None
    slots: list[int] | None = None
    committed: bool = False


def _each(item: Callable[[object], T]) -> Callable[[object], list[T] | None]:
    """A part that is a list: every item that decodes (a damaged one hides only itself); None if not a list."""
    def each(v: object) -> list[T] | None:
        if not isinstance(v, list):
            return None
        out = []
        for x in v:
            try:
                out.append(item(x))
            except DecodeError:
                continue
        return out
    return each


def _sample(v: object) -> NodeSample | None:
    """The sample, or None when it does not decode (the rest of the line stands)."""
    try:
        return decode(NodeSample, v)
    except DecodeError:
        return None


def _view(v: object) -> NodeRunView:
    return decode(NodeRunView, v)


def _skipped(v: object) -> list[str] | None:
    return [one_line(str(x), SKIP_CHARS) for x in v[:MAX_SKIPPED]] if isinstance(v, list) else None


@dataclass(frozen=True)
class FeedLine:
    """One line of a node's feed: the parts it carries (None: not in this line), each decoded on its own."""

    WHAT: ClassVar[str] = "feed line"
    VERSION: ClassVar[int] = FEED_VERSION

    node: NodeSample | None = field(default=None, metadata=rule(decode=_sample))
    runs: list[NodeRunView] | None = field(default=None, metadata=rule(decode=_each(_view)))
    full: bool = field(default=False, metadata=rule(decode=bool))
    """``runs`` is every record of the project (else only those that changed)."""
    queue: list[QueueEntry] | None = field(default=None,
                                           metadata=rule(decode=_each(lambda x: decode(QueueEntry, x))))
    skipped: list[str] | None = field(default=None, metadata=rule(decode=_skipped))
    """One line per file of the project the node could not decode."""

    @classmethod
    def parse(cls, raw: str) -> FeedLine | None:
        """The line decoded; None when it is not the feed's (not JSON, not an object); DecodeError (one line)
        when it is of another version."""
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return decode(cls, data) if isinstance(data, dict) else None
