"""A rank's Chrome trace read back: where its profiled steps went, and every rank's traces in one timeline.

:func:`summarize` reads one ``torch.profiler`` Chrome trace (``rank<N>.trace.json``) and
splits each ``ProfilerStep#<n>`` range of the main thread into three shares that add up
to the step's wall time:

- **compute**: covered by a top-level operator of the main thread (``cpu_op``) that is no
  collective, or by a GPU kernel or copy that is no NCCL kernel;
- **communication**: covered by a collective (``c10d::*``, ``gloo:*``, ``nccl:*``, an NCCL
  kernel, ``record_param_comms``) and not already compute: the time a rank spends in or
  waiting on the wire, on any thread;
- **waiting**: the rest, under no operator at all: Python between ops, the data loader,
  a sleep, a host blocked on ``work.wait()`` outside the profiler's ops.

Its ``top`` operators are ranked by self time (an op's time minus its children's) over the
profiled steps. :func:`merge` lays every rank's trace on one clock (each file's
``baseTimeNanoseconds``) with one process per node and rank (``pid`` = its index, named
``<node> rank <r>`` by ``process_name`` metadata, sorted by rank), which Perfetto and
chrome://tracing open. Stdlib only: the laptop runs it, never torch.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

STEP_RE = re.compile(r"ProfilerStep#(\d+)")
_COMM = re.compile(r"^(c10d::|gloo:|nccl:|record_param_comms)|nccl", re.IGNORECASE)
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
PID_STRIDE = 16        # a rank's processes (host, GPU streams) are pid rank_index*16 + k in the merged trace


@dataclass(frozen=True)
class OpTime:
    name: str
    self_ms: float
    calls: int


@dataclass(frozen=True)
class TraceSummary:
    """One rank's profiled steps: their count and wall time, the three shares (0..1) and the top operators."""

    steps: list[int]
    step_ms: float
    compute: float
    communication: float
    waiting: float
    top: list[OpTime] = field(default_factory=list)


def _events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    ev = trace.get("traceEvents") if isinstance(trace, dict) else None
    return [e for e in ev if isinstance(e, dict)] if isinstance(ev, list) else []


def _span(e: dict[str, Any]) -> tuple[float, float] | None:
    ts, dur = e.get("ts"), e.get("dur")
    if isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and dur >= 0:
        return float(ts), float(ts) + float(dur)
    return None


def _covered(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The union of ``spans`` clipped to [lo, hi], as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The length of the union ``a`` outside the union ``b`` (both sorted and disjoint)."""
    inside = 0.0
    for x0, x1 in a:
        for y0, y1 in b:
            inside += max(0.0, min(x1, y1) - max(x0, y0))
    return _length(a) - inside


def summarize(trace: dict[str, Any], top: int = 5) -> TraceSummary:
    """See the module: the shares of the profiled steps and the ``top`` operators by self time."""
    events = _events(trace)
    steps = [(int(m.group(1)), s, e) for e in events
             if (m := STEP_RE.fullmatch(str(e.get("name", "")))) and (s := _span(e)) is not None]
    steps.sort(key=lambda x: x[1][0])
    main = steps[0][2].get("tid") if steps else None
    compute: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    ops: list[tuple[float, float, str, Any]] = []
    for e in events:
        span = _span(e)
        if span is None or e.get("ph") != "X":
            continue
        name, cat = str(e.get("name", "")), e.get("cat")
        if cat == "cpu_op" or cat in _DEVICE_CATS:
            ops.append((span[0], span[1], name, (e.get("pid"), e.get("tid"))))
        is_comm = bool(_COMM.search(name))
        if is_comm and cat in ("cpu_op", "user_annotation", *_DEVICE_CATS):
            comm.append(span)
        elif cat in _DEVICE_CATS or (cat == "cpu_op" and e.get("tid") == main):
            compute.append(span)
    total = c_ms = m_ms = 0.0
    for _, (lo, hi), _ in steps:
        total += hi - lo
        cov = _covered(compute, lo, hi)
        c_ms += _length(cov)
        m_ms += _minus(_covered(comm, lo, hi), cov)
    windows = [s for _, s, _ in steps]
    selfs = _self_times([o for o in ops if any(lo <= o[0] < hi for lo, hi in windows)])
    ranked = sorted(selfs.items(), key=lambda kv: -kv[1][0])[:top]
    share = (lambda x: x / total) if total > 0 else (lambda x: 0.0)
    return TraceSummary(steps=[n for n, _, _ in steps], step_ms=total / 1000,
                        compute=share(c_ms), communication=share(m_ms),
                        waiting=max(0.0, 1.0 - share(c_ms) - share(m_ms)) if total > 0 else 0.0,
                        top=[OpTime(n, round(t / 1000, 3), c) for n, (t, c) in ranked])


def _self_times(ops: list[tuple[float, float, str, Any]]) -> dict[str, tuple[float, int]]:
    """Per op name: the time under it and under none of its children (per thread), and its calls."""
    by_thread: dict[Any, list[tuple[float, float, str, Any]]] = defaultdict(list)
    for o in ops:
        by_thread[o[3]].append(o)
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for items in by_thread.values():
        items.sort(key=lambda o: (o[0], -o[1]))
        stack: list[list[Any]] = []          # [end, name, child time]
        for start, end, name, _ in items:
            while stack and stack[-1][0] <= start:
                _close(stack.pop(), out)
            if stack:
                stack[-1][2] += end - start
            stack.append([end, name, 0.0, end - start])
        while stack:
            _close(stack.pop(), out)
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def _close(frame: list[Any], out: dict[str, list[float]]) -> None:
    end, name, children, dur = frame
    out[name][0] += max(0.0, dur - children)
    out[name][1] += 1


def merge(parts: Sequence[tuple[str, int, dict[str, Any]]]) -> dict[str, Any]:
    """One Chrome trace of every ``(node, rank, trace)``: a process per rank (its GPU streams beside it), all on
    one clock (each trace's ``baseTimeNanoseconds``, else as it is)."""
    merged: list[dict[str, Any]] = []
    bases = [t.get("baseTimeNanoseconds") for _, _, t in parts]
    known = [b for b in bases if isinstance(b, int)]
    origin = min(known) if known else 0
    for i, ((node, rank, trace), base) in enumerate(zip(parts, bases, strict=True)):
        shift = (base - origin) / 1000 if isinstance(base, int) else 0.0
        pids: dict[Any, int] = {}
        for e in _events(trace):
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index", "process_labels"):
                continue
            old = e.get("pid")
            if isinstance(old, str):
                continue   # kineto's own bookkeeping tracks ("Spans", "Traces"): not the rank's work
            if old not in pids:
                pids[old] = i * PID_STRIDE + min(len(pids), PID_STRIDE - 1)
                label = f"{node} rank {rank}" + ("" if not pids or len(pids) == 1 else f" ({old})")
                merged.append({"ph": "M", "name": "process_name", "pid": pids[old], "tid": 0,
                               "args": {"name": label}})
                merged.append({"ph": "M", "name": "process_sort_index", "pid": pids[old], "tid": 0,
                               "args": {"sort_index": pids[old]}})
            e = {**e, "pid": pids[old]}
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + shift
            merged.append(e)
    return {"displayTimeUnit": "ms", "traceEvents": merged,
            "otherData": {"ranks": [f"{node}/{rank}" for node, rank, _ in parts]}}


def shares_line(s: TraceSummary) -> str:
    """``3 steps, 162.0 ms: compute 41%, communication 3%, waiting 56%``."""
    return (f"{len(s.steps)} step(s), {s.step_ms:.1f} ms: compute {s.compute:.0%}, "
            f"communication {s.communication:.0%}, waiting {s.waiting:.0%}")
