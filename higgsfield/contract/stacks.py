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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from higgsfield.contract.decode import DecodeError, cut, kind

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


@dataclass(frozen=True)
class Frame:
    """One call: the function, its file and line, and ``code``, the source line (read on the node)."""

    function: str
    file: str
    line: int
    code: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line, "code": self.code}

    @property
    def at(self) -> str:
        """``train.py:88``: the file's base name and the line."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


@dataclass(frozen=True)
class Thread:
    """One thread's stack, innermost frame LAST; ``name`` is :data:`MAIN` for the main thread."""

    name: str
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "frames": [f.to_dict() for f in self.frames]}


@dataclass(frozen=True)
class RankStacks:
    """One rank's threads as its node took them (``native``: py-spy's native stacks, when it was there)."""

    node: str
    rank: int
    pid: int
    threads: tuple[Thread, ...]
    native: str = ""

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

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "pid": self.pid,
                "threads": [t.to_dict() for t in self.threads], "native": self.native}

    @classmethod
    def from_dict(cls, data: object) -> RankStacks:
        """The stacks in ``data``; :class:`DecodeError` (one line) on any other shape."""
        d = _obj(data, "a rank's stacks")
        threads = _list(d, "threads", MAX_THREADS)
        return cls(node=_s(d, "node", 253), rank=_i(d, "rank"), pid=_i(d, "pid"),
                   threads=tuple(_thread(t) for t in threads), native=_s(d, "native", MAX_NATIVE, default=""))


def _thread(data: object) -> Thread:
    d = _obj(data, "a thread")
    return Thread(name=_s(d, "name", 200), frames=tuple(_frame(f) for f in _list(d, "frames", MAX_FRAMES)))


def _frame(data: object) -> Frame:
    d = _obj(data, "a frame")
    return Frame(function=_s(d, "function", 500), file=_s(d, "file", 2000), line=_i(d, "line"),
                 code=_s(d, "code", 2000, default=""))


def _obj(v: object, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise DecodeError(f"{what} is {kind(v)}, not an object")
    return v


def _list(d: dict[str, Any], key: str, limit: int) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list):
        raise DecodeError(f"'{key}' must be a list, not {kind(v)}")
    if len(v) > limit:
        raise DecodeError(f"'{key}' has {len(v)} items (at most {limit})")
    return v


_NO = object()


def _s(d: dict[str, Any], key: str, limit: int, default: object = _NO) -> str:
    v = d.get(key)
    if v is None and default is not _NO:
        return str(default)
    if not isinstance(v, str):
        raise DecodeError(f"'{key}' must be a string, not {kind(v)}")
    return cut(v, limit)


def _i(d: dict[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise DecodeError(f"'{key}' must be an integer >= 0, not {kind(v)}")
    return v


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

    ranks: tuple[str, ...]
    where: str
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "where": self.where, "frames": [f.to_dict() for f in self.frames]}

    @property
    def waiting(self) -> bool:
        """The group waits in a collective (for the others)."""
        return _collective(self.frames) is not None


@dataclass(frozen=True)
class Diagnosis:
    """The groups (largest first), the ranks outside the largest (``odd``), and one line saying it all."""

    groups: tuple[Group, ...]
    odd: tuple[str, ...]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_dict() for g in self.groups], "odd": list(self.odd), "summary": self.summary}

    @classmethod
    def from_dict(cls, data: object) -> Diagnosis:
        """The diagnosis in ``data``; :class:`DecodeError` (one line) on any other shape."""
        d = _obj(data, "a diagnosis")
        groups = []
        for g in _list(d, "groups", 4096):
            gd = _obj(g, "a group")
            ranks = _list(gd, "ranks", 1 << 16)
            if not all(isinstance(r, str) for r in ranks):
                raise DecodeError("'ranks' must be a list of strings")
            groups.append(Group(ranks=tuple(cut(r, 300) for r in ranks), where=_s(gd, "where", 2000),
                                frames=tuple(_frame(f) for f in _list(gd, "frames", MAX_FRAMES))))
        odd = _list(d, "odd", 1 << 16)
        if not all(isinstance(r, str) for r in odd):
            raise DecodeError("'odd' must be a list of strings")
        return cls(groups=tuple(groups), odd=tuple(cut(r, 300) for r in odd), summary=_s(d, "summary", 4000))

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
