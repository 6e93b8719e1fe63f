"""Building the project environment of ``runtime: process`` (``invoker env``, which deploy runs).

:func:`build` makes the venv for the deployed code's requirements.txt unless one with its
key (:mod:`higgsfield.node.code.env_key`) is complete, verifies it, writes ``env.json`` and
prunes the project's other environments (:mod:`higgsfield.node.code.environment`).

- **higgsfield**: not installed from an index. The venv's ``higgsfield-invoker.pth``
  puts ``<venv>/higgsfield-invoker`` first on ``sys.path``, and that directory holds a
  single link, ``higgsfield``, to the invoker's own package: the same code the Docker
  runtime mounts at ``/opt/higgsfield-invoker``. A run therefore uses the nodes' exact
  build (a checkout, a fork, a pre-release), ``higgsfield setup`` upgrading the invoker
  upgrades every environment at once, and none of the invoker's dependencies
  (pydantic, asyncssh...) leak into the project's environment.
- **pip, not uv**: pip honours the node's own pip configuration (``/etc/pip.conf``:
  a cluster's mirror, a wheel directory, constraints), which is how shared clusters
  point at their packages; uv reads none of it. pip is also already there (the
  invoker's venv has it), so nothing more is shipped. It runs as the invoker's pip
  aimed at the new venv (``pip --python``).
- **No byte-compiling of the whole venv** (``pip --no-compile``, and no ``compileall``):
  that is every file of torch, most of which no run imports, about 30 CPU-seconds a
  build. The import check that completes the environment (:func:`_verify`) compiles
  what a run's start imports (torch, ``torch.distributed``, the entry point); anything
  else is compiled once, by the first import of it (Python writes each ``.pyc``
  atomically, so ranks importing at once are safe).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from higgsfield.contract import layout
from higgsfield.contract.codec import decode, encode
from higgsfield.contract.errors import RunError
from higgsfield.contract.replies import EnvReply
from higgsfield.node.code.env_key import added, env_key, read_requirements, torch_added
from higgsfield.node.code.environment import (
    COMPLETE,
    EnvRecord,
    code_dir_of,
    complete,
    env_python,
    invoker_package,
    prune,
    read_record,
    reply_of,
    site_packages,
)
from higgsfield.node.runtime.env import kept_basics
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.locks import exclusive
from higgsfield.node.state.records import write_json

BUILD_TIMEOUT_S = 3600.0
LINK_DIR = "higgsfield-invoker"
PTH_NAME = "higgsfield-invoker.pth"
_SHOWN = ("Collecting ", "Processing ", "Installing collected packages", "Successfully installed", "ERROR")

Progress = Callable[[str], None]


def _locked(root: Path) -> contextlib.AbstractContextManager[None]:
    """One build per project and node at a time (two deploys at once wait for each other)."""
    return exclusive(root / layout.LOCK)


def link_invoker(env_dir: Path) -> None:
    """Point the environment's ``higgsfield`` at the invoker's package (first on ``sys.path``)."""
    links = Path(env_dir) / LINK_DIR
    links.mkdir(exist_ok=True)
    link = links / "higgsfield"
    target = invoker_package()
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        tmp = links / f".higgsfield-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    site = site_packages(env_dir)
    site.mkdir(parents=True, exist_ok=True)
    # An "import" line of a .pth runs at start-up: put the link first, as PYTHONPATH does in a container.
    line = f"import sys; p = {str(links)!r}; p in sys.path or sys.path.insert(0, p)\n"
    pth = site / PTH_NAME
    if not pth.is_file() or pth.read_text() != line:
        pth.write_text(line)


def _pip(env_dir: Path) -> list[str]:
    """pip aimed at ``env_dir``: the invoker's own (``--python``, pip >= 22.3), else the venv's own."""
    if importlib.util.find_spec("pip") is not None:
        try:
            version = tuple(int(x) for x in importlib.metadata.version("pip").split(".")[:2])
        except (importlib.metadata.PackageNotFoundError, ValueError):
            version = (0, 0)
        if version >= (22, 3):
            return [sys.executable, "-m", "pip", "--python", str(env_python(env_dir))]
    return [str(env_python(env_dir)), "-m", "pip"]


def _run_logged(argv: list[str], log: Any, progress: Progress, *, deadline: float, what: str) -> None:
    """Run ``argv``, its output appended to ``log``; pip's milestones go to ``progress``."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,  # noqa: S603
                            stdin=subprocess.DEVNULL, env={**os.environ, "PIP_PROGRESS_BAR": "off",
                                                           "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    timer = threading.Timer(max(1.0, deadline - time.monotonic()), proc.kill)
    timer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            text = line.strip()
            if text and not text.startswith("WARNING: Location"):
                tail = [*tail[-4:], text]
            if text.startswith(_SHOWN):
                progress(text if len(text) <= 160 else text[:157] + "...")
        rc = proc.wait()
    finally:
        timer.cancel()
        log.flush()
    if time.monotonic() >= deadline and rc != 0:
        raise RunError(f"{what} took over {BUILD_TIMEOUT_S:.0f}s and was stopped (log: {log.name})")
    if rc != 0:
        last = next((t for t in reversed(tail) if t.startswith("ERROR")), tail[-1] if tail else "no output")
        raise RunError(f"{what} failed: {last} (log: {log.name})")


def build(home: NodeState, project: str, *, code_dir: Path | None = None,
          progress: Progress = lambda _msg: None, timeout: float = BUILD_TIMEOUT_S) -> EnvReply:
    """Build the environment for the deployed code's requirements.txt unless it exists; returns what happened."""
    code = code_dir_of(home, project, code_dir)
    requirements = read_requirements(code)
    key = env_key(requirements)
    root = home.envs(project)
    env_dir = root / key
    t0 = time.monotonic()
    with _locked(root):
        built = not complete(env_dir)
        if built:
            _create(env_dir, code, requirements, home.env_build_log(project), progress,
                    deadline=t0 + timeout)
        else:
            progress("unchanged")
        link_invoker(env_dir)
        rec = read_record(home, project) or EnvRecord()
        if built or rec.key != key:
            facts = _verify(env_dir, progress) if built else _facts(env_dir)
            rec = EnvRecord(key=key, dir=str(env_dir), python=str(env_python(env_dir)), torch=facts.torch,
                            torch_added=torch_added(requirements),
                            built_at=time.time() if built else rec.built_at,
                            seconds=round(time.monotonic() - t0, 2) if built else rec.seconds)
            home.env_record(project).parent.mkdir(parents=True, exist_ok=True)
            write_json(home.env_record(project), encode(rec))
        removed = prune(home, project, keep=env_dir)
    return reply_of(rec, built=built, pruned=removed, seconds=round(time.monotonic() - t0, 3))


def _create(env_dir: Path, code: Path, requirements: str, log_file: Path, progress: Progress, *,
            deadline: float) -> None:
    shutil.rmtree(env_dir, ignore_errors=True)  # a half-built one from an interrupted deploy
    log_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_file, "w") as log:
            progress("creating the venv")
            venv = [sys.executable, "-m", "venv", "--without-pip", str(env_dir)]
            pip = _pip(env_dir)
            if pip[0] != sys.executable:  # no usable pip here: the venv brings its own
                venv.remove("--without-pip")
            _run_logged(venv, log, progress, deadline=deadline, what="creating the venv")
            extra = added(requirements)
            reqs = ["-r", str(code / "requirements.txt")] if (code / "requirements.txt").is_file() else []
            n = sum(1 for ln in requirements.splitlines() if ln.strip() and not ln.strip().startswith(("#", "-")))
            progress(f"installing {n} requirement(s) from requirements.txt"
                     + (f" + {' '.join(extra)} (not in requirements.txt)" if extra else ""))
            _run_logged([*pip, "install", "--no-compile", "--no-input", *reqs, *extra],
                        log, progress, deadline=deadline, what="pip install of the project environment")
    except BaseException:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise


@dataclass(frozen=True)
class Probe:
    """What a new environment's python says of itself (``.complete`` keeps it): torch's version, and where its
    ``higgsfield`` comes from (it must be the invoker's package)."""

    WHAT: ClassVar[str] = "environment probe"

    torch: str | None = None
    higgsfield: str = ""


def _verify(env_dir: Path, progress: Progress) -> Probe:
    """Import torch and higgsfield with the new python: the environment is complete only if both load."""
    link_invoker(env_dir)
    probe = ("import json, torch, torch.distributed, higgsfield.node.entrypoint as e; "
             "print(json.dumps({'torch': torch.__version__, 'higgsfield': e.__file__}))")
    # in the environment a run's processes get (its kept basics), so it writes the .pyc files of what it imports
    # (see the module doc) where a run would, even on a node that sets PYTHONDONTWRITEBYTECODE
    r = subprocess.run([str(env_python(env_dir)), "-c", probe], capture_output=True, text=True,  # noqa: S603
                       timeout=300, cwd=env_dir, env=kept_basics(os.environ))
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        shutil.rmtree(env_dir, ignore_errors=True)
        raise RunError(f"the new project environment does not import torch and higgsfield: {tail}")
    facts = decode(Probe, json.loads(r.stdout.strip().splitlines()[-1]))
    if not Path(facts.higgsfield).resolve().is_relative_to(invoker_package()):
        shutil.rmtree(env_dir, ignore_errors=True)
        raise RunError(f"the project environment imports higgsfield from {facts.higgsfield}, not the "
                       f"invoker's {invoker_package()}")
    (env_dir / COMPLETE).write_text(json.dumps(encode(facts)) + "\n")
    progress(f"ready: torch {facts.torch}")
    return facts


def _facts(env_dir: Path) -> Probe:
    """What :func:`_verify` found when it completed ``env_dir`` (nothing known: a ``.complete`` unreadable)."""
    try:
        return decode(Probe, json.loads((Path(env_dir) / COMPLETE).read_text()))
    except (OSError, ValueError):
        return Probe()
