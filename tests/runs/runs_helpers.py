"""Helpers of the multi-node tests (the fixtures are in conftest.py)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polling import pause_after

STATE = ".hfrt"
SECRET = "s3cr3t-value-hfrt-0042"   # the cluster project's one secret (its git-ignored env file)


def exe(name: str) -> str:
    """The full path of a program (commands are never looked up through a shell)."""
    return shutil.which(name) or name


@dataclass
class Cluster:
    dir: Path
    bed: object
    nodes: list[str]

    def hf(self, *args: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("HIGGSFIELD_DEBUG", None)
        r = subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=self.dir, env=env,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"higgsfield {' '.join(args)} exited {r.returncode}\n"
                                 f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
        return r

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "higgsfield", *args], cwd=self.dir,  # noqa: S603
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def home(self, i: int) -> Path:
        return Path(f"/home/hfnode{i}")

    def run_dir(self, i: int, run: str) -> Path:
        return self.home(i) / STATE / "runs" / "hfrt" / run


def wait_for(pred, timeout: float, what: str, poll: float = 0.3):  # type: ignore[no-untyped-def]
    """``pred()`` once it is true, polled at most every ``poll`` s (:func:`polling.pause_after`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        v = pred()
        if v:
            return v
        pause_after(t0, poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_processes(run_dir: Path) -> list[int]:
    """Host pids (any namespace) whose environment belongs to ``run_dir`` (needs root)."""
    needle = f"HIGGSFIELD_RUN_DIR={run_dir}".encode()
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(e))
        except OSError:
            continue
    return out


def status(c: Cluster) -> dict[str, dict]:  # type: ignore[type-arg]
    """``higgsfield status --json``: run name -> its merged status."""
    import json

    r = c.hf("status", "--json", timeout=120)
    return {x["run"]: x for x in json.loads(r.stdout)["runs"]}


def record(c: Cluster, i: int, run: str) -> dict:  # type: ignore[type-arg]
    """Node i's record of ``run`` read from its disk ({} while there is none)."""
    import json

    try:
        return dict(json.loads((c.run_dir(i, run) / "run.json").read_text()))
    except (OSError, ValueError):
        return {}


def node_states(c: Cluster, run: str) -> list[str]:
    """The state each node that holds ``run`` records, read from its disk: what a wait polls.

    A poll of ``status`` is a CLI, and an SSH session and an invoker on each node: about 1.4 CPU-s on this
    machine, which the other lane shares, every second or two of a wait. A test waits on the records,
    then asks ``status`` what it asserts.
    """
    return [s for name in c.nodes if (s := record(c, int(name.removeprefix("hfnode")), run).get("state"))]


def containers(run: str) -> list[str]:
    out = subprocess.run([exe("docker"), "ps", "-a", "--format", "{{.Names}}", "--filter",
                          "label=org.higgsfield.run=" + run], capture_output=True, text=True, check=True).stdout
    return out.split()


LINE = re.compile(r"^(hfnode\d+)/(\d+|launcher) \| (.*)$")


def lines_by_rank(out: str) -> dict[tuple[str, str], list[str]]:
    """``node/rank | text`` lines of ``run``/``logs`` output, grouped by (node, rank), in order."""
    by: dict[tuple[str, str], list[str]] = {}
    for ln in out.splitlines():
        m = LINE.match(ln)
        if m:
            by.setdefault((m.group(1), m.group(2)), []).append(m.group(3))
    return by


def node_processes(i: int, state: str = STATE) -> list[int]:
    """Every process of node i's user that belongs to its ``state`` dir (the bed is shared with other tests)."""
    uid = pwd.getpwnam(f"hfnode{i}").pw_uid
    mark = f"/home/hfnode{i}/{state}".encode()
    found = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            if os.stat(f"/proc/{e}").st_uid != uid:
                continue
            with open(f"/proc/{e}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{e}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if state.encode() in cmd or mark in env:
            found.append(int(e))
    return found


def runs_conftest() -> Any:
    """tests/runs/conftest.py as a module of its own, loaded once (its bed loader and make_cluster), for
    the suites that build their clusters the same way on hosts of their own (tests/faults, tests/ui)."""
    import importlib.util

    name = "_hf_runs_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "conftest.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def restore_hosts(tb: Any, indices: tuple[int, ...]) -> None:
    """Hosts ``indices`` exist and run sshd with no command delay; their users are in the docker group."""
    tb.ensure_hosts(0, tb.state_dir(), indices=list(indices), reset_docker_group=False, delay=None)
    for i in indices:
        tb.add_to_docker_group(tb.make_host(i))


def bed_for(indices: tuple[int, ...]) -> Any:
    """The test bed with hosts ``indices`` restored (a session fixture's body); skips without root or a bed."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("the test bed needs root")
    tb = runs_conftest()._load_bed()
    st = tb.status()
    if not st["dockerd"]["answers"] or not st["images"].get(tb.BASE_IMAGE):
        pytest.skip("test bed not up: python3 scripts/testbed/testbed.py up")
    restore_hosts(tb, indices)
    return tb
