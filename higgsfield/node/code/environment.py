"""The project environment of ``runtime: process``: a venv per node, built by deploy from requirements.txt.

Plain processes need what a training image would give them: torch and the project's
requirements, in an environment of the project's own (never the invoker's venv,
whose pinned control-side packages must not decide the project's versions)::

    <state>/envs/<project>/<key>/              the venv; ``.complete`` once built and verified
    <state>/projects/<project>/env.json        {key, dir, python, torch, torch_added, built_at, seconds}
    <state>/projects/<project>/env-build.log   pip's full output of the last build

The key (:mod:`higgsfield.node.code.env_key`) hashes requirements.txt, what deploy adds
to it and the node's Python: an unchanged environment is never rebuilt, and a changed
one is built beside the old one (:mod:`higgsfield.node.code.env_build`), which a running
run keeps using until it ends.

This module is the environment's life on the node: where it lives, its record, its
:func:`status` (``invoker env --check``, which the control side's ``doctor`` reads: an
:class:`~higgsfield.contract.replies.EnvReply`), the python a run gets
(:func:`python_for_run`), and :func:`prune`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from higgsfield.contract.codec import decode
from higgsfield.contract.errors import RunError
from higgsfield.contract.replies import EnvReply
from higgsfield.contract.states import ACTIVE
from higgsfield.node.code.env_key import env_key, read_requirements
from higgsfield.node.state.home import NodeState

COMPLETE = ".complete"


# -- where it lives -----------------------------------------------------------------

def env_python(env_dir: Path) -> Path:
    return Path(env_dir) / "bin" / "python"


def site_packages(env_dir: Path) -> Path:
    return Path(env_dir) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def invoker_package() -> Path:
    """The invoker's own ``higgsfield`` package directory (what the Docker runtime mounts, too)."""
    import higgsfield

    return Path(higgsfield.__file__).resolve().parent


def code_dir_of(home: NodeState, project: str, code_dir: Path | None) -> Path:
    code = Path(code_dir) if code_dir else home.code(project)
    if not code.is_dir():
        raise RunError(f"project '{project}' is not deployed on this node ({code} is missing): "
                       "run 'higgsfield deploy'")
    return code.resolve()


@dataclass(frozen=True)
class EnvRecord:
    """``env.json``: the project's current environment, as its last build wrote it (None: not known)."""

    WHAT: ClassVar[str] = "env record"

    key: str | None = None
    dir: str | None = None
    python: str | None = None
    torch: str | None = None
    torch_added: str | None = None
    built_at: float | None = None
    seconds: float | None = None


def read_record(home: NodeState, project: str) -> EnvRecord | None:
    """``env.json`` decoded; None when there is none or it does not decode (then it counts as missing)."""
    try:
        return decode(EnvRecord, json.loads(home.env_record(project).read_text()))
    except (OSError, ValueError):
        return None


def reply_of(rec: EnvRecord, **changes: Any) -> EnvReply:
    """The reply of ``env``/``env --check``: the record's fields, and ``changes`` (state, built...)."""
    return EnvReply(**{**asdict(rec), **changes})


def complete(env_dir: Path) -> bool:
    return (Path(env_dir) / COMPLETE).is_file() and env_python(env_dir).exists()


# -- status -------------------------------------------------------------------------

def status(home: NodeState, project: str, code_dir: Path | None = None) -> EnvReply:
    """The environment's state for the deployed code (or ``code_dir``): present, stale or missing, with its record.

    present: built for this requirements.txt; stale: an environment exists, built for
    another requirements.txt (a deploy did not finish); missing: none, or a half-built one.
    """
    rec = read_record(home, project)
    try:
        code: Path | None = code_dir_of(home, project, code_dir)
    except RunError:
        code = None
    want = None
    if code is not None:
        want = env_key(read_requirements(code))
        env_dir = home.envs(project) / want
        if complete(env_dir):
            mine = rec if rec is not None and rec.key == want else EnvRecord()
            return reply_of(mine, state="present", project=project, wanted=want, key=want,
                            python=str(env_python(env_dir)))
    if rec is not None and complete(Path(rec.dir or "")):
        return reply_of(rec, state="stale" if code is not None else "present", project=project, wanted=want)
    return EnvReply(state="missing", project=project, wanted=want)


def python_for_run(home: NodeState, project: str, code_dir: Path) -> str:
    """The interpreter a process-runtime run of ``code_dir`` starts torchrun with.

    The project environment when it matches the code's requirements.txt. Without one,
    the invoker's own interpreter, only if it has torch (a ``localhost`` node runs in
    the user's Python); otherwise a RunError that says to deploy.
    """
    st = status(home, project, code_dir)
    if st.state == "present":
        return str(st.python)
    if st.state == "stale":
        raise RunError(f"the project environment of '{project}' on this node was built for another "
                       "requirements.txt: run 'higgsfield deploy' to rebuild it")
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    raise RunError(f"runtime 'process' needs the project environment of '{project}' (a venv with torch and "
                   "requirements.txt), which is missing on this node: run 'higgsfield deploy'")


# -- prune --------------------------------------------------------------------------

def prune(home: NodeState, project: str, *, keep: Path) -> list[str]:
    """Remove the project's other environments, except those an active run still uses."""
    from higgsfield.node.state.placement import NodeRun
    from higgsfield.node.state.records import list_runs

    root = home.envs(project)
    in_use = {Path(keep).resolve()}
    for rd in list_runs(home, project):
        with contextlib.suppress(OSError, ValueError, RunError):
            python = NodeRun.read(rd.spec_path).placement.python
            if python and rd.read().state in ACTIVE:
                in_use.add(Path(python).parent.parent.resolve())
    removed = []
    for d in root.iterdir() if root.is_dir() else []:
        if d.is_dir() and not d.name.startswith(".") and d.resolve() not in in_use:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    return sorted(removed)
