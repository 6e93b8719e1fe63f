"""Buddy copies: each node's checkpoint part is kept by the next node of the ring, so a lost disk loses no step.

Used by :class:`higgsfield.checkpoint.Checkpoint` in node-local mode. After each
complete save (:meth:`Buddies.after_save`, a collective that returns at once) every
node's lead sends its part to the lead of the next node (node ``i`` to ``i+1``, the
last to node 0) and receives the part of the node before it, in a background thread
over a gloo group of the leads (:mod:`higgsfield._lib.buddy_wire`): training never
waits for it. The copy lies in ``<run dir>/.replicas/step_*/part<i>/`` with its
manifest; a copy still on its way when the next save completes makes that save skip
its copy rather than wait. Once a node's part of a step is known to be held by its
buddy, the node's ``step_*`` gets a ``BUDDY`` file naming where: that step is
recoverable without this node. Keep-last-k prunes the copies with their steps.

On a load (:func:`restore`, a collective), every node's lead says which parts it
holds, its own and its copies; :func:`~higgsfield._lib.buddy_plan.plan` picks the
newest step of which every part is held somewhere; the copies it would use are
checked against their manifests (a damaged one is named in one line and left out,
and the plan is made again without it); the parts a node lacks are sent to it by a
node that holds them; and each node's lead puts its step directory together: its
own part again (a spare that took a lost node's place), or every part in one
directory (a run on fewer or other ranks, which DCP loads on any number of ranks).
The load that follows is the ordinary one. The mirror is asked only for a step
newer than what the nodes can put together.

Why the gloo group has a timeout of its own: a buddy that dies mid-copy must not
hold a thread (or a process's exit) forever; the thread is a daemon, and an
exchange that failed makes the next save build a new group.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from higgsfield._lib.buddy_plan import Held, Plan, plan
from higgsfield._lib.buddy_wire import MANIFEST, manifest, recv_part, send_part, verify
from higgsfield._lib.ckpt_agree import agree, attempt
from higgsfield._lib.ckpt_layout import MARKER, PREFIX, TMP, Layout, step_of

__all__ = ["BUDDY", "ENV", "REPLICAS", "Buddies", "restore", "wanted"]

REPLICAS = ".replicas"
BUDDY = "BUDDY"
GROUP_TIMEOUT_S = 300.0
ENV = "HIGGSFIELD_CHECKPOINT_BUDDIES"   # "0": no buddy copies (the benchmark's baseline; a bucket that suffices)


def wanted(given: bool | None) -> bool:
    """``Checkpoint(buddies=...)``, else the environment (on unless it says 0/false/no)."""
    if given is not None:
        return given
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _say(msg: str) -> None:
    print(f"higgsfield: {msg}", file=sys.stderr, flush=True)


def copy_path(directory: Path, step: int, part: int) -> Path:
    return directory / REPLICAS / f"{PREFIX}{step:08d}" / f"part{part}"


def _leads(layout: Layout) -> list[int]:
    return [min(layout.ranks(n)) for n in range(len(layout.names))]


class Buddies:
    """The buddy copies of one :class:`~higgsfield.checkpoint.Checkpoint` (its directory on this node)."""

    def __init__(self, directory: Path, enabled: bool = True) -> None:
        self.directory, self.enabled = directory, enabled
        self._group: Any = None
        self._thread: threading.Thread | None = None
        self._broken = False
        self._received: int | None = None   # the newest step whose copy this lead received whole

    def group(self, layout: Layout) -> Any:
        """The leads' own gloo group (made once; again after a failed exchange). Collective."""
        if self._group is None:
            self._group = dist.new_group(ranks=_leads(layout), backend="gloo",
                                         timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        return self._group

    def after_save(self, final: Path, layout: Layout) -> None:
        """Start this node's exchange of the step just completed at ``final``; returns at once. Collective."""
        if layout.shared or len(layout.names) < 2 or not self.enabled:
            return
        rank = dist.get_rank()
        lead = layout.lead(rank)
        busy = self._thread is not None and self._thread.is_alive()
        states: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(states, (busy, self._broken, self._received) if lead else None)
        per_node = {layout.node_of[r]: s for r, s in enumerate(states) if s is not None}
        if lead:
            self._record(layout, per_node)
        if any(s[0] for s in per_node.values()):
            if rank == 0:
                _say(f"no buddy copy of {final.name}: the copy of the save before is still on its way")
            return
        if any(s[1] for s in per_node.values()):
            self._group, self._broken = None, False   # a failed exchange may have left the group out of step
        group = self.group(layout)
        if lead:
            self._thread = threading.Thread(target=self._exchange, args=(final, layout, group), daemon=True,
                                            name="higgsfield-buddy-copy")
            self._thread.start()

    def _record(self, layout: Layout, per_node: dict[int, Any]) -> None:
        """Mark this node's step that its buddy now holds whole (``BUDDY``: recoverable without this node)."""
        node = layout.node_of[dist.get_rank()]
        buddy = (node + 1) % len(layout.names)
        step = per_node.get(buddy, (False, False, None))[2]
        own = self.directory / f"{PREFIX}{step:08d}" if step is not None else None
        if own is not None and own.is_dir() and not (own / BUDDY).exists():
            try:
                (own / BUDDY).write_text(json.dumps({"copy_on": layout.names[buddy], "node": buddy}))
            except OSError:
                pass   # advisory: the copy itself is what a load looks for

    def _exchange(self, final: Path, layout: Layout, group: Any) -> None:
        node = layout.node_of[dist.get_rank()]
        n = len(layout.names)
        leads = _leads(layout)
        step = step_of(final)
        prev = (node - 1) % n
        failures: list[str] = []

        def send() -> None:
            try:
                send_part(final, manifest(final, step, node), leads[(node + 1) % n], group)
            except Exception as e:  # noqa: BLE001 - a failed copy is one line; training goes on
                failures.append(f"to node {layout.names[(node + 1) % n]}: {type(e).__name__}: {e}")

        sender = threading.Thread(target=send, daemon=True, name="higgsfield-buddy-send")
        sender.start()
        try:
            recv_part(leads[prev], copy_path(self.directory, step, prev), group)
            self._received = step
        except Exception as e:  # noqa: BLE001
            failures.append(f"from node {layout.names[prev]}: {type(e).__name__}: {e}")
        sender.join()
        if failures:
            self._broken = True
            _say(f"buddy copy of {final.name} failed ({'; '.join(failures)}); the mirror, if any, still has it")

    def join(self, timeout: float | None = None) -> None:
        """Wait for the exchange in flight (a run's end may; a copy cut by the exit is simply not there)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def prune(self, keep: set[int]) -> None:
        """A node's lead: drop the copies of steps keep-last-k dropped (and a copy's leftovers)."""
        root = self.directory / REPLICAS
        if not root.is_dir() or (self._thread is not None and self._thread.is_alive()):
            return
        for d in root.iterdir():
            if not d.name.startswith(PREFIX) or step_of(d) not in keep:
                shutil.rmtree(d, ignore_errors=True)


# -- the load -----------------------------------------------------------------------------------------


def _my_holdings(directory: Path, node: int, complete: Callable[[], list[Path]]) -> list[Held]:
    held = []
    for d in complete():
        try:
            m = json.loads((d / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and m.get("mode") == "node-local":
            held.append(_held(node, step_of(d), m, copy=False))
    root = directory / REPLICAS
    for d in sorted(root.glob(f"{PREFIX}*/part*")) if root.is_dir() else []:
        try:
            m = json.loads((d / MANIFEST).read_text())["marker"]
            held.append(_held(node, step_of(d.parent), m, copy=True))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return held


def _held(node: int, step: int, m: dict[str, Any], copy: bool) -> Held:
    return Held(node=node, step=step, part=int(m["node"]), parts=int(m["nodes"]), world_size=int(m["world_size"]),
                ranks=tuple(int(r) for r in m["ranks"]), engine=str(m.get("engine", "fsdp")), copy=copy)


def _nodes_now(layout: Layout) -> tuple[list[list[int]], int | None]:
    """node -> its ranks as the load sees them, and this rank's node if it is its node's lead (else None)."""
    rank = dist.get_rank()
    if layout.shared:   # one directory for all: one "node", rank 0 its lead
        return [list(range(dist.get_world_size()))], 0 if rank == 0 else None
    return [layout.ranks(n) for n in range(len(layout.names))], layout.node_of[rank] if layout.lead(rank) else None


def restore(buddies: Buddies, layout: Layout, complete: Callable[[], list[Path]],
            newer_than: int | None) -> Path | None:
    """Put together the newest step newer than ``newer_than`` that the nodes' parts and copies make whole,
    when that needs a copy or a move; its local path, or None (nothing newer, or every node loads its own
    part as it is). Collective."""
    directory = buddies.directory
    ranks_now, me = _nodes_now(layout)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, _my_holdings(directory, me, complete) if me is not None else None)
    held = [h for part in gathered if part for h in part]
    while True:
        found = plan(held, ranks_now, newer_than)
        if found is None or found.local:
            return None
        bad = _check_copies(found, directory, me)
        if not bad:
            break
        held = [h for h in held if not (h.copy and h.step == found.step and (h.node, h.part) in bad)]
    return _bring(found, buddies, layout, me)


def _check_copies(found: Plan, directory: Path, me: int | None) -> set[tuple[int, int]]:
    """The copies the plan uses that fail their manifest (each holder checks its own), said in one line each."""
    mine = {}
    for node, part in found.copies_used:
        if node == me:
            why = verify(copy_path(directory, found.step, part))
            if why is not None:
                mine[part] = why
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, (me, mine) if me is not None and mine else None)
    bad = set()
    for item in out:
        if item is not None:
            node, parts = item
            for part, why in parts.items():
                bad.add((node, part))
                if dist.get_rank() == 0:
                    _say(f"the buddy copy of part {part} of {PREFIX}{found.step:08d} on node {node} is not used: {why}")
    return bad


def _bring(found: Plan, buddies: Buddies, layout: Layout, me: int | None) -> Path:
    directory = buddies.directory
    final = directory / f"{PREFIX}{found.step:08d}"
    what = f"restore of {final.name} from the nodes' parts and buddy copies"
    group = buddies.group(layout) if not layout.shared else None
    leads = _leads(layout) if not layout.shared else [0]

    def move() -> None:
        for mv in found.moves:   # the same order on every lead: each send meets its receive
            if me == mv.src:
                src = _source(directory, found.step, mv.part)
                send_part(src, manifest(src, found.step, mv.part), leads[mv.dst], group)
            elif me == mv.dst:
                recv_part(leads[mv.src], copy_path(directory, found.step, mv.part), group)

    agree(what, attempt(move) if me is not None else None, directory)

    def assemble() -> None:
        assert me is not None
        _assemble(directory, found, me)

    agree(what, attempt(assemble) if me is not None else None, directory)
    if dist.get_rank() == 0:
        how = "its own part on each node" if found.same_shape else f"all {len(found.needs[0])} parts on each node"
        _say(f"resuming from {final.name}, put together from the nodes' parts and buddy copies ({how})")
    return final


def _source(directory: Path, step: int, part: int) -> Path:
    """Where this node holds ``part`` of ``step``: its own step directory, else its copy."""
    own = directory / f"{PREFIX}{step:08d}"
    try:
        if json.loads((own / MARKER).read_text()).get("node") == part:
            return own
    except (OSError, ValueError, AttributeError):
        pass
    return copy_path(directory, step, part)


def _link_tree(src: Path, dst: Path) -> None:
    """Copy ``src``'s files into ``dst`` (hard links where the filesystem allows), the manifest left out."""
    for p in src.rglob("*"):
        if not p.is_file() or p.name in (MANIFEST, BUDDY):
            continue
        target = dst / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(p, target)
        except OSError:
            shutil.copy2(p, target)


def _assemble(directory: Path, found: Plan, node: int) -> None:
    final = directory / f"{PREFIX}{found.step:08d}"
    parts = found.needs[node]
    sources = {p: _source(directory, found.step, p) for p in parts}
    if sources.get(parts[0]) == final and len(parts) == 1:
        return   # its own part, as it is
    tmp = directory / f"{TMP}restore-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p in reversed(parts):   # part 0 last: its .metadata and trainer.pt serve all
        _link_tree(sources[p], tmp)
    if not found.same_shape:   # no node's marker fits: a whole checkpoint in one place
        marker = json.loads((sources[0] / MARKER).read_text())
        (tmp / MARKER).write_text(json.dumps({"step": marker.get("step"), "mode": "assembled",
                                              "world_size": marker.get("world_size"),
                                              "engine": marker.get("engine")}))
    if final.is_dir():   # this node's own part of another node's place: kept as a copy, not lost
        try:
            m = json.loads((final / MARKER).read_text())
            kept = copy_path(directory, found.step, int(m["node"])) if m.get("mode") == "node-local" else None
        except (OSError, ValueError, KeyError, TypeError):
            kept = None
        if kept is not None and not kept.exists():
            kept.parent.mkdir(parents=True, exist_ok=True)
            (final / MANIFEST).write_text(json.dumps(manifest(final, found.step, int(m["node"]))))
            os.rename(final, kept)
        else:
            shutil.rmtree(final)
    os.rename(tmp, final)
