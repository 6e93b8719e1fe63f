"""A node's live feed for the dashboard, typed: ``invoker stats --follow``'s lines, decoded once on the control side.

The node prints one JSON object per line (:mod:`higgsfield.node.observe.watch`)::

    {"node": {...NodeSample...}}                                  a machine sample, every few seconds
    {"runs": [record, ...], "full": true, "queue": [...], "skipped": [line, ...]}   when they change

:meth:`FeedLine.parse` turns a line into a :class:`FeedLine`: the sample as a
:class:`NodeSample` (each GPU a :class:`GpuSample`), the records as
:class:`~higgsfield.contract.runspec.NodeRunView`, the queue as :class:`QueueEntry`. Each part
decodes on its own, as the dashboard always read them: a part that does not decode is
left out (the rest of the line stands), a record or queue entry that does not decode is
left out of its list, and a line that is not the feed's (a login banner) is None. A line
of another ``version`` (``FEED_VERSION``; none: version 1, the shape the feed always had)
is a one-line :class:`~higgsfield.contract.decode.DecodeError` naming which side to upgrade.

The node builds its samples as these same types (:mod:`higgsfield.node.observe.stats`,
:mod:`higgsfield.node.runtime.gpus`) and prints their ``to_dict()``: a sample is defined once, here.

The dashboard sends the page :meth:`NodeSample.to_dict` and :meth:`QueueEntry.to_dict`: the
keys and order the node printed (``app.js`` reads them).

Use::

    line = FeedLine.parse(raw)            # None: not a feed line
    if line and line.node: line.node.cpu_percent, [g.util_percent for g in line.node.gpus]
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.replies import Typed, each, nonnegative, run_name
from higgsfield.contract.runspec import NodeRunView
from higgsfield.contract.text import one_line, shown

FEED_VERSION = 1
"""The schema of a feed line; a line without ``version`` is of this one (the node never sent one)."""

MAX_SKIPPED = 100       # skip lines kept per node, each cut to SKIP_CHARS
SKIP_CHARS = 600


@dataclass(frozen=True)
class GpuSample(Typed):
    """One GPU of a sample; a figure the GPU cannot report (NVML's NotSupported, nvidia-smi's [N/A]) is None."""

    WHAT: ClassVar[str] = "GPU sample"

    index: int
    name: str
    util_percent: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temperature_c: float | None = None

    def check(self) -> None:
        nonnegative(self, "index", "util_percent", "mem_used_mib", "mem_total_mib")


@dataclass(frozen=True)
class NodeSample(Typed):
    """One sample of a node's machine: sizes in bytes, ``cpu_percent`` of all cores (0..100)."""

    WHAT: ClassVar[str] = "machine sample"

    time: float
    cpu_percent: float
    cpu_count: int
    load1: float
    mem_used: int
    mem_total: int
    disk_used: int
    disk_total: int
    gpus: list[GpuSample] = field(default_factory=list)

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"gpus": each(GpuSample, "GPU sample")}

    def check(self) -> None:
        nonnegative(self, "cpu_percent", "cpu_count", "mem_used", "mem_total", "disk_used", "disk_total")


@dataclass(frozen=True)
class QueueEntry(Typed):
    """One run in a node's queue (every project's: they wait for the same slots): the slots it holds
    (None: it waits), how many it wants, whether they are its own until it ends (``committed``)."""

    WHAT: ClassVar[str] = "queue entry"

    project: str
    run: str
    want: int | None = None
    slots: list[int] | None = None
    committed: bool = False

    def check(self) -> None:
        run_name(self.run)

    def to_dict(self) -> dict[str, Any]:
        """What the page gets of the entry (never the supervisor's pid or the rendezvous port)."""
        return {"project": self.project, "run": self.run, "want": self.want,
                "slots": None if self.slots is None else list(self.slots), "committed": self.committed}


@dataclass(frozen=True)
class FeedLine:
    """One line of a node's feed: the parts it carries (None: not in this line)."""

    node: NodeSample | None = None
    runs: list[NodeRunView] | None = None
    full: bool = False
    """``runs`` is every record of the project (else only those that changed)."""
    queue: list[QueueEntry] | None = None
    skipped: list[str] | None = None
    """One line per file of the project the node could not decode."""

    @classmethod
    def parse(cls, raw: str) -> FeedLine | None:
        """The line decoded; None when it is not the feed's (not JSON, not an object); DecodeError (one line)
        when it is of another version."""
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return cls.from_dict(data) if isinstance(data, dict) else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeedLine:
        version = data.get("version", FEED_VERSION)
        if version != FEED_VERSION:
            raise DecodeError(f"a feed line of version {shown(version)} (this higgsfield reads {FEED_VERSION}): "
                              "upgrade higgsfield here or on the node")
        node = None
        if data.get("node") is not None:
            with contextlib.suppress(DecodeError):
                node = NodeSample.from_dict(data.get("node"))
        runs, queue, skipped = data.get("runs"), data.get("queue"), data.get("skipped")
        return cls(node=node, runs=_each(NodeRunView.from_dict, runs) if isinstance(runs, list) else None,
                   full=bool(data.get("full")),
                   queue=_each(QueueEntry.from_dict, queue) if isinstance(queue, list) else None,
                   skipped=[one_line(str(x), SKIP_CHARS) for x in skipped[:MAX_SKIPPED]]
                   if isinstance(skipped, list) else None)


def _each(decode: Callable[[object], Any], items: list[Any]) -> list[Any]:
    """Every item that decodes (a damaged one hides only itself)."""
    out = []
    for x in items:
        with contextlib.suppress(DecodeError):
            out.append(decode(x))
    return out

