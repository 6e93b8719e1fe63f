"""``status`` on a node holding 1,000 run records, 10 of them damaged, against 1,000 healthy ones.

A damaged record must cost no more than a healthy one: the node decodes every file
once, skips the ones that don't decode with one line, and shows the rest (issue 22).
Both states hold 1,000 run directories of one project on one local node (the
invoker's own state directory layout: ``run.json``, ``spec.json`` and a log dir per
run, finished runs with an error tail). In the damaged one, 10 of them are replaced
by one each of: truncated JSON, a JSON list, a field of the wrong type, binary bytes,
a 200,000-line error tail (2.6 MB: over the record size cap), a string error tail,
a symlink out of the state dir, a symlinked run directory, a directory named with
ESC bytes, and a record whose run name is ``../x``. Nine are skipped with a line;
the string error tail is bounded to one line and its run still shows.

Measured, alternating the two states so drift hits both alike, N rounds each:

- the node side alone: ``higgsfield invoker status`` (what the control side runs over SSH);
- the whole command: ``higgsfield status --json`` in a project whose node is this
  machine (config, connect, the node's verb, merge, print).

The ratio damaged / healthy of the medians is the figure (target <= 1.2). The script
also checks what the damaged state must show: 991 runs, one skip line per skipped
file on stderr, the string tail as one line, exit 0. Exit status 1 when a check or the target fails.

    .venv/bin/python bench/status_records.py              # 1,000 records, 5 rounds
    .venv/bin/python bench/status_records.py --runs 200 --rounds 3

Needs nothing but this checkout's venv; no test bed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROJECT = "bench_status"
TARGET = 1.2
DAMAGED = 10


def _record(run: str, i: int) -> dict[str, object]:
    from higgsfield.contract.codec import encode
    from higgsfield.node.state.records import RunRecord

    failed = i % 7 == 0
    rec = RunRecord(project=PROJECT, experiment="train", run=run, node="localhost", node_rank=0, nnodes=1,
                    nproc=2, state="failed" if failed else "succeeded", command=["torchrun", "-m", "x"],
                    exit_code=1 if failed else 0, started_at=1.7e9 + i, ended_at=1.7e9 + i + 60,
                    reason="rank 1 exited 1" if failed else None,
                    failed_rank=1 if failed else None, failed_node="localhost" if failed else None,
                    error_tail=[f"line {k} of the error" for k in range(20)] if failed else [])
    return encode(rec)  # type: ignore[no-any-return]


def _spec(run: str, state: Path) -> dict[str, object]:
    from higgsfield.contract.codec import encode
    from higgsfield.contract.runspec import RunSpec

    spec = RunSpec(project=PROJECT, experiment="train", run=run, module="train", code_dir=str(state / "code"),
                   params={"steps": 100, "lr": 0.001, "model": "tiny"}, node="localhost", node_rank=0,
                   nodes=("localhost",), master_addr="127.0.0.1", submitted_at=1.7e9, nproc=2,
                   runtime="process")
    cache = str(state / "cache")
    return {**encode(spec), "gpus": 0, "cache_dir": cache, "checkpoint_dir": f"{cache}/ckpt/{run}",
            "container": f"hf-{run}", "image": None, "python": sys.executable, "stop_grace": 3.0,
            "coord_port": None}


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def fill(state: Path, n: int) -> None:
    """``n`` healthy finished runs of PROJECT under ``state``."""
    for i in range(n):
        run = f"run-{i:05d}"
        d = state / "runs" / PROJECT / run
        (d / "logs").mkdir(parents=True, mode=0o700)
        _write(d / "run.json", _record(run, i))
        _write(d / "spec.json", _spec(run, state))


def damage(state: Path, outside: Path) -> list[str]:
    """Replace the first DAMAGED runs with one damaged shape each; returns the shapes' names."""
    runs = state / "runs" / PROJECT
    victims = sorted(runs.iterdir())[:DAMAGED]
    shapes: list[tuple[str, Callable[[Path], None]]] = []

    def shape(name: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
        def add(f: Callable[[Path], None]) -> Callable[[Path], None]:
            shapes.append((name, f))
            return f
        return add

    @shape("truncated JSON")
    def _(d: Path) -> None:
        text = (d / "run.json").read_text()
        (d / "run.json").write_text(text[: len(text) // 2])

    @shape("a JSON list")
    def _(d: Path) -> None:
        (d / "run.json").write_text("[1, 2, 3]\n")

    @shape("a field of the wrong type")
    def _(d: Path) -> None:
        rec = json.loads((d / "run.json").read_text())
        rec["pids"] = "not a dict"
        rec["node_rank"] = {"x": 1}
        _write(d / "run.json", rec)

    @shape("binary bytes")
    def _(d: Path) -> None:
        (d / "run.json").write_bytes(bytes(range(256)) * 4)

    @shape("a 200,000-line error tail")
    def _(d: Path) -> None:
        rec = json.loads((d / "run.json").read_text())
        rec.update(state="failed", error_tail=[f"frame {k}" for k in range(200_000)])
        _write(d / "run.json", rec)

    @shape("a string error tail")
    def _(d: Path) -> None:
        rec = json.loads((d / "run.json").read_text())
        rec.update(state="failed", error_tail="Traceback: one long string, not a list of lines")
        _write(d / "run.json", rec)

    @shape("a symlink out of the state dir")
    def _(d: Path) -> None:
        target = outside / "foreign.json"
        target.write_text((d / "run.json").read_text())
        (d / "run.json").unlink()
        (d / "run.json").symlink_to(target)

    @shape("a symlinked run directory")
    def _(d: Path) -> None:
        target = outside / "foreign-run"
        shutil.copytree(d, target)
        shutil.rmtree(d)
        d.symlink_to(target, target_is_directory=True)

    @shape("a directory named with ESC bytes")
    def _(d: Path) -> None:
        d.rename(d.with_name("evil\x1b]0;pwned\x07\x1b[31m"))

    @shape("a record whose run name is ../x")
    def _(d: Path) -> None:
        rec = json.loads((d / "run.json").read_text())
        rec["run"] = "../x"
        _write(d / "run.json", rec)

    for d, (_name, f) in zip(victims, shapes, strict=True):
        f(d)
    return [name for name, _ in shapes]


def _project(root: Path, state: Path) -> Path:
    proj = root / f"project-{state.name}"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "train.py").write_text(
        "from higgsfield.experiment import experiment, param\n\n\n"
        '@experiment("train")\n@param("steps", default=100)\ndef train(params):\n    return params\n')
    (proj / "higgsfield.yml").write_text(
        f"name: {PROJECT}\nstate_dir: {state}\nruntime: process\nnodes:\n  - host: localhost\n")
    return proj


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env["HIGGSFIELD_HOME_CONFIG"] = str(home)
    return env


def _time(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    return time.perf_counter() - t0, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    hf = [sys.executable, "-m", "higgsfield"]
    ok = True
    with tempfile.TemporaryDirectory(prefix="hf-bench-status-") as tmp:
        root = Path(tmp)
        outside = root / "outside"
        outside.mkdir()
        states = {"healthy": root / "healthy", "damaged": root / "damaged"}
        for state in states.values():
            fill(state, args.runs)
        shapes = damage(states["damaged"], outside)
        env = _env(root / "home")
        projects = {k: _project(root, s) for k, s in states.items()}
        cmds = {
            "invoker status": lambda k: [*hf, "invoker", "--state-dir", str(states[k]), "status"],
            "status --json": lambda k: [*hf, "status", "--json"],
        }
        times: dict[tuple[str, str], list[float]] = {(c, k): [] for c in cmds for k in states}
        last: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}
        for _ in range(args.rounds):
            for c, argv in cmds.items():
                for k in states:
                    dt, proc = _time(argv(k), projects[k], env)
                    times[(c, k)].append(dt)
                    last[(c, k)] = proc

        print(f"status on one node: {args.runs} run records, healthy vs {DAMAGED} damaged "
              f"({args.rounds} rounds, median wall time)")
        print(f"  damaged shapes: {'; '.join(shapes)}")
        print(f"  {'command':<16} {'healthy':>9} {'damaged':>9} {'ratio':>6}")
        for c in cmds:
            h, d = statistics.median(times[(c, "healthy")]), statistics.median(times[(c, "damaged")])
            ratio = d / h
            verdict = "ok" if ratio <= TARGET else f"over the target {TARGET}"
            print(f"  {c:<16} {h:>8.3f}s {d:>8.3f}s {ratio:>6.2f}  {verdict}")
            ok &= ratio <= TARGET

        # What the damaged node must show: every healthy run, the skips named, exit 0.
        for c in cmds:
            for k in states:
                proc = last[(c, k)]
                if proc.returncode != 0:
                    print(f"  FAIL {c} ({k}): exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
                    ok = False
        runs = _runs(last.get(("status --json", "damaged")))
        want = args.runs - DAMAGED + 1
        skips = [ln for ln in last[("status --json", "damaged")].stderr.splitlines() if "skipped" in ln]
        tails = [len(r.get("error_tail") or []) for r in runs]
        print(f"  damaged node: {len(runs)} runs shown (want {want}), {len(skips)} skip line(s) on stderr "
              f"(want {DAMAGED - 1}), longest error tail shown {max(tails, default=0)} lines")
        if len(runs) != want or len(skips) != DAMAGED - 1:
            ok = False
            print("  FAIL: the damaged node must show every healthy run and name each damaged file")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


def _runs(proc: subprocess.CompletedProcess[str] | None) -> list[dict[str, Any]]:
    """The runs ``status --json`` printed (its ``runs`` list); none when it failed."""
    if proc is None or proc.returncode != 0:
        return []
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return []
    runs = data.get("runs") if isinstance(data, dict) else data
    return runs if isinstance(runs, list) else []


if __name__ == "__main__":
    sys.exit(main())
