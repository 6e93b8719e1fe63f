"""What torchrun runs in every worker: import the experiment's module and call it.

    torchrun ... -m higgsfield.entrypoint RUN_DIR

``RUN_DIR/spec.json`` names the experiment, its module under ``src/`` and the raw
param values. Each rank's stdout and stderr go to ``RUN_DIR/logs/rank<RANK>.log``
(appended, so a restarted worker continues the same file). A worker that raises
writes ``rank<RANK>.error.json`` with the time, so ``status`` can name the rank
that failed first. The worker dies with its torchrun (PR_SET_PDEATHSIG), so a
killed launcher leaves no orphans. Secrets are already in the environment (torchrun
inherits them from the supervisor, or in a container from the launcher,
:mod:`higgsfield.invoker.launch`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _redirect(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m higgsfield.entrypoint RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    logs = run_dir / "logs"
    _die_with_parent()
    _redirect(logs / f"rank{rank}.log")
    (logs / f"rank{rank}.pid").write_text(str(os.getpid()))
    spec = json.loads((run_dir / "spec.json").read_text())
    try:
        return run(spec)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            _record_error(logs, rank, f"SystemExit({e.code})")
        return code
    except BaseException as e:  # noqa: BLE001 - report every failure of user code
        traceback.print_exc()
        _record_error(logs, rank, f"{type(e).__name__}: {e}")
        return 1


def run(spec: dict) -> int:  # type: ignore[type-arg]
    code_dir = Path(spec["code_dir"])
    src_dir = code_dir / spec.get("src_dir", "src")
    for p in (str(code_dir), str(src_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    from higgsfield.experiment import registry, seed_everything

    importlib.import_module(spec["module"])
    exp = registry().get(spec["experiment"])
    if exp is None:
        raise RuntimeError(f"module {spec['module']} did not register experiment '{spec['experiment']}'")
    params = exp.build_params(spec.get("params") or {})
    if exp.seed is not None:
        seed_everything(exp.seed)
    exp.func(params)
    return 0


def _record_error(logs: Path, rank: int, message: str) -> None:
    try:
        from higgsfield.invoker.records import write_json

        write_json(logs / f"rank{rank}.error.json", {"rank": rank, "time": time.time(), "error": message[:2000]})
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
