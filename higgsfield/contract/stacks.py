"""Every rank's stacks at a stall, and what they say together: the diagnosis of a hung run.

A hung run gives no error to show: its ranks are alive and wait. What explains it is
where each rank is: most of them wait in the same collective (``all_reduce``), one is
somewhere else (a data loader asleep, a rank that skipped a ``barrier``). The node
takes its ranks' stacks (:mod:`higgsfield.node.runs.stacks`: each worker's
``faulthandler`` dumps on a signal, so no ptrace is needed), they travel to the run's
coordinator as :class:`RankStacks` dicts, and :func:`diagnose` groups the ranks by
their main thread's stack: the largest group is what the run waits in, the others
are the odd ranks, named ``node/rank`` in a one-line summary that becomes a failed
run's reason (``stalled: <summary>``). :func:`render` is what ``higgsfield stacks`` prints.

Stdlib only: the node, the laptop and the Slurm task all read it. Frames are kept
innermost LAST (as Python's tracebacks print them), unlike faulthandler's output.

Use::

    threads = parse_faulthandler(text)                   # a rank's dump
    d = diagnose([RankStacks("hfnode1", 0, 4242, threads), ...])
    d.summary    # "hfnode1/0, hfnode2/0 wait in all_reduce at train.py:88; hfnode2/1 is at data.py:17 `...`"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from higgsfield.contract.codec import rule
from higgsfield.contract.decode import cut

MAX_THREADS = 256
MAX_FRAMES = 512
MAX_NATIVE = 64_000
MAIN = "MainThread"

#: The torch.distributed calls a rank blocks in while it waits for the others.
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "gather",
    "scatter", "barrier", "monitored_barrier", "send", "recv", "wait", "gather_object", "scatter_object_list",
})

# Files that are not the user's code: a group is placed at its innermost frame outside these.
_LIBRARY = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d[.\d]*/|^<frozen |/higgsfield/node/)")


# -- the rules of the decoded fields: strings cut to a bound, lists of at most so many items ------------

def _cut(limit: int) -> Callable[[str], str]:
    """A field's check: the string cut to ``limit`` characters (a node's text is shown, never trusted)."""
    return lambda v: cut(v, limit)


def _at_most(limit: int, each: int | None = None) -> Callable[[tuple[object, ...]], tuple[object, ...]]:
    """A field's check: at most ``limit`` items (``each``: every item a string, cut to that)."""
    def check(v: tuple[object, ...]) -> tuple[object, ...]:
        if len(v) > limit:
            raise ValueError(f"has {len(v)} items (at most {limit})")
        return v if each is None else tuple(cut(str(x), each) for x in v)
    return check


def _counted(v: int) -> None:
    if v < 0:
        raise ValueError("must be an integer >= 0")


@dataclass(frozen=True)
class Frame:
    """One call: the function, its file and line, and ``code``, the source line (read on the node)."""

    WHAT: ClassVar[str] = "frame"

    function: str = field(metadata=rule(check=_cut(500)))
    file: str = field(metadata=rule(check=_cut(2000)))
    line: int = field(metadata=rule(check=_counted))
    code: str = field(default="", metadata=rule(check=_cut(2000)))

    @property
    def at(self) -> str:
        """``train.py:88``: the file's base name and the line."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


@dataclass(frozen=True)
class Thread:
    """One thread's stack, innermost frame LAST; ``name`` is :data:`MAIN` for the main thread."""

    WHAT: ClassVar[str] = "thread"

    name: str = field(metadata=rule(check=_cut(200)))
    frames: tuple[Frame, ...] = field(metadata=rule(check=_at_most(MAX_FRAMES)))


@dataclass(frozen=True)
class RankStacks:
    """One rank's threads as its node took them (``native``: py-spy's native stacks, when it was there)."""

    WHAT: ClassVar[str] = "rank's stacks"

    node: str = field(metadata=rule(check=_cut(253)))
    rank: int = field(metadata=rule(check=_counted))
    pid: int = field(metadata=rule(check=_counted))
    threads: tuple[Thread, ...] = field(metadata=rule(check=_at_most(MAX_THREADS)))
    native: str = field(default="", metadata=rule(check=_cut(MAX_NATIVE)))

    @property
    def who(self) -> str:
        """``hfnode1/0``: how a diagnosis names the rank."""
        return f"{self.node}/{self.rank}"

    @property
    def main(self) -> Thread | None:
        """The main thread (the one named :data:`MAIN`, else the last one faulthandler listed: the oldest)."""
        for t in self.threads:
            if t.name == MAIN:
                return t
        return self.threads[-1] if self.threads else None


@dataclass(frozen=True)
class SavedStacks:
    """``RUN_DIR/stacks.json``: the ranks' stacks a node (or a Slurm job) took at the run's stall, and when."""

    WHAT: ClassVar[str] = "stacks file"
    VERSION: ClassVar[int] = 1

    ranks: tuple[RankStacks, ...] = field(metadata=rule(check=_at_most(1 << 16)))
    taken_at: float = 0.0


# -- faulthandler's text ------------------------------------------------------------------------

_HEAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*?)\s*$')
_STACK_HEAD = re.compile(r"^Stack \(most recent call first\):\s*$")


def parse_faulthandler(text: str, main_ident: int | None = None) -> tuple[Thread, ...]:
    """The threads of a ``faulthandler.dump_traceback(all_threads=True)`` dump, frames innermost LAST.

    Each thread is named by its ident as faulthandler prints it (``0x7f3a...``), the
    thread whose ident is ``main_ident`` (``threading.main_thread().ident``) :data:`MAIN`.
    Lines it does not know (``<no Python frame>``, ``...`` for a cut stack) are skipped;
    a second dump appended to the text starts over (the last dump is the one kept).
    """
    threads: list[tuple[str, list[Frame]]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head is not None or _STACK_HEAD.match(line):
            name = "0x0" if head is None else head.group(2)
            if head is not None and main_ident is not None and int(name, 16) == main_ident:
                name = MAIN
            elif head is not None and head.group(3):
                name = f"{name} {head.group(3)}"
            if any(n == name for n, _ in threads):   # an older dump's thread again: a new dump began
                threads = []
            current = []
            threads.append((name, current))
            continue
        frame = _FRAME.match(line)
        if frame is not None and current is not None:
            n = frame.group(2)
            current.append(Frame(function=frame.group(3), file=frame.group(1), line=int(n) if n.isdigit() else 0))
    return tuple(Thread(name, tuple(reversed(frames[:MAX_FRAMES]))) for name, frames in threads[:MAX_THREADS])


# -- the diagnosis ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """Ranks (``node/rank``) whose main threads have the same stack, and ``where`` they are, in words."""

    WHAT: ClassVar[str] = "group"

    ranks: tuple[str, ...] = field(metadata=rule(check=_at_most(1 << 16, each=300)))
    where: str = field(metadata=rule(check=_cut(2000)))
    frames: tuple[Frame, ...] = field(metadata=rule(check=_at_most(MAX_FRAMES)))

    @property
    def waiting(self) -> bool:
        """The group waits in a collective (for the others)."""
        return _collective(self.frames) is not None


@dataclass(frozen=True)
class Diagnosis:
    """The groups (largest first), the ranks outside the largest (``odd``), and one line saying it all."""

    WHAT: ClassVar[str] = "diagnosis"

    groups: tuple[Group, ...] = field(metadata=rule(check=_at_most(4096)))
    odd: tuple[str, ...] = field(metadata=rule(check=_at_most(1 << 16, each=300)))
    summary: str = field(metadata=rule(check=_cut(4000)))

    @property
    def first_odd(self) -> tuple[str, int | None] | None:
        """(node, rank) of the first odd rank (rank None when the name has no rank), or None."""
        if not self.odd:
            return None
        node, _, rank = self.odd[0].rpartition("/")
        return (node, int(rank)) if rank.isdigit() and node else (self.odd[0], None)


def _collective(frames: Sequence[Frame]) -> str | None:
    """The innermost torch.distributed collective in ``frames``, if the stack is in one."""
    for f in reversed(frames):
        if f.function in COLLECTIVES and "/torch/" in f.file:
            return f.function
    return None


def _user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's code (not the standard library, site-packages or higgsfield's node side)."""
    for f in reversed(frames):
        if not _LIBRARY.search(f.file):
            return f
    return frames[-1] if frames else None


def _where(frames: Sequence[Frame]) -> str:
    if not frames:
        return "without a Python stack (it did not answer)"
    coll = _collective(frames)
    user = _user_frame(frames)
    assert user is not None
    if coll is not None:
        return f"in {coll} at {user.at}"
    code = f" `{user.code.strip()}`" if user.code.strip() else ""
    return f"at {user.at}{code}"


NO_ANSWER = "without stacks (no answer from the node)"
"""Where the nodes named in ``diagnose(..., silent=)`` are: a node that hangs whole is the likeliest culprit."""


def diagnose(stacks: Sequence[RankStacks], silent: Sequence[str] = ()) -> Diagnosis:
    """Group the ranks by their main thread's stack (functions, file base names and lines): largest group
    first (on a tie, one that waits in a collective), then the groups that do not wait in one (what the others
    wait for); ``odd`` the ranks outside the largest group, in that order.

    ``silent`` names the nodes that sent no stacks at all. They are one group, never the largest and never
    waiting, so they are odd: when every rank that answered waits in a collective, the run is named by the
    node that did not answer, not by a rank that only waits for it."""
    keyed: dict[tuple[tuple[str, str, int], ...], list[tuple[int, RankStacks]]] = {}
    for i, s in enumerate(stacks):
        main = s.main
        frames = main.frames if main is not None else ()
        # the same code on another node lives under another home or release directory: compare base names
        keyed.setdefault(tuple((f.function, f.file.rsplit("/", 1)[-1], f.line) for f in frames), []).append((i, s))
    groups: list[tuple[tuple[int, bool, int], Group]] = []
    for members in keyed.values():
        first = members[0][1].main
        frames = first.frames if first is not None else ()
        g = Group(ranks=tuple(s.who for _, s in members), where=_where(frames), frames=frames)
        groups.append(((-len(members), not g.waiting, members[0][0]), g))
    ranked = [g for _, g in sorted(groups, key=lambda kg: kg[0])]
    rest = ranked[1:] + ([Group(ranks=tuple(silent), where=NO_ANSWER, frames=())] if silent else [])
    # after the largest group, the odd ones not waiting in a collective first: what the others wait for
    ordered = tuple(ranked[:1] + sorted(rest, key=lambda g: (g.waiting, -len(g.ranks))))
    odd = tuple(r for g in ordered[1 if ranked else 0:] for r in g.ranks)
    return Diagnosis(groups=ordered, odd=odd, summary=_summary(ordered))


def _summary(groups: Sequence[Group]) -> str:
    if not groups:
        return "no rank's stack could be taken"
    parts = []
    for g in groups:
        verb = "wait" if g.waiting else ("is" if len(g.ranks) == 1 else "are")
        if g.waiting and len(g.ranks) == 1:
            verb = "waits"
        parts.append(f"{', '.join(g.ranks)} {verb} {g.where}")
    return cut("; ".join(parts), 1500)


def render(stacks: Sequence[RankStacks], diagnosis: Diagnosis) -> str:
    """What ``higgsfield stacks`` prints: the summary, each group with its stack, then every rank's threads."""
    out = [diagnosis.summary, ""]
    for i, g in enumerate(diagnosis.groups, 1):
        label = "odd" if i > 1 else "most"
        out.append(f"group {i} ({label}, {len(g.ranks)} rank{'s' if len(g.ranks) != 1 else ''}): "
                   f"{', '.join(g.ranks)} {g.where}")
        out.extend(_frames(g.frames, "    "))
        out.append("")
    for s in stacks:
        out.append(f"== {s.who} (pid {s.pid}) ==")
        if not s.threads:
            out.append("  (no stack: the rank did not answer)")
        for t in s.threads:
            out.append(f"  thread {t.name}:")
            out.extend(_frames(t.frames, "    "))
        if s.native:
            out.append("  native (py-spy):")
            out.extend("    " + line for line in s.native.splitlines())
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _frames(frames: Sequence[Frame], indent: str) -> list[str]:
    lines = []
    for f in frames:
        lines.append(f'{indent}File "{f.file}", line {f.line}, in {f.function}')
        if f.code.strip():
            lines.append(f"{indent}  {f.code.strip()}")
    return lines
