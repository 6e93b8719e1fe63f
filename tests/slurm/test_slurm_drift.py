"""The drift check inside a Slurm job: the allocation's nodes compared before torchrun, on the real cluster.

The bed's nodes share one machine, so their facts are equal; one is made to differ the
way a real node does, by what the facts read on that node only: n2's slurmd runs in its
own mount namespace, and there (only there, for the test's length) a directory holding a
driver's ``nvidia/version`` and one GPU's ``information`` is bind-mounted on ``/proc/driver``.
Nothing of the install changes. The job on n1+n2 then fails before training with the
difference in its record (what ``higgsfield status`` shows), and the same job started with
``--allow-drift`` runs. The pure parts (the facts files, the verdict, the request's flag,
the plan) are tested without the bed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import pause_after
from slurm_helpers import SECRET, Cluster, offline_backend

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.drift import NodeFacts
from higgsfield.contract.slurmjob import PinnedSlurmRun, SlurmRequest, decode_request, pinned_json
from higgsfield.node import slurm_drift
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

DRIVER = "535.104.05"
MODEL = "NVIDIA H100 80GB HBM3"
MARKER = "hf-drift-test"


# -- the pure parts, no cluster ------------------------------------------------------------------

def _rd(tmp_path: Path) -> RunDir:
    rd = RunDir(NodeState(tmp_path), "proj", "run1")
    rd.path.mkdir(parents=True)
    return rd


@pytest.mark.timeout(30)
def test_each_node_writes_its_facts_and_a_difference_is_one_line_naming_node_value_and_majority(
        tmp_path: Path) -> None:
    rd = _rd(tmp_path)
    mine = slurm_drift.job_facts("n1")
    assert mine.python and mine.invoker and mine.packages and mine.torch == mine.packages.get("torch")
    # n2 wrote first, with another numpy and a driver: a node's own file, as its task writes it
    other = dataclasses.replace(mine, node="n2", driver=DRIVER,
                                packages={**(mine.packages or {}), "numpy": "1.0.0"})
    folder = slurm_drift.attempt_dir(rd, "7.0")
    folder.mkdir(parents=True)
    (folder / "n2.json").write_text(json.dumps(encode(other)))
    report = slurm_drift.check(rd, "7.0", ["n1", "n2"], "n1", wait_s=5)
    assert report.unreachable == {}
    lines = [d.line() for d in report.differences]
    numpy = (mine.packages or {}).get("numpy", "none")
    assert lines == ["n2: NVIDIA driver 535.104.05 (the other 1 node: none)",
                     f"n2: numpy 1.0.0 (the other 1 node: {numpy})"]
    assert slurm_drift.verdict(rd, "7.0") == report.differences         # what the batch step reads
    assert slurm_drift.verdict(rd, "7.1") == []                          # another attempt's: none
    assert slurm_drift.reason(report.differences) == \
        "the nodes differ (2 differences), stopped before training; --allow-drift runs anyway"
    assert slurm_drift.lines(report.differences) == lines
    assert decode(NodeFacts, json.loads((folder / "n1.json").read_text())).node == "n1"


@pytest.mark.timeout(30)
def test_a_node_that_writes_no_facts_is_named_and_the_others_are_compared(tmp_path: Path) -> None:
    rd = _rd(tmp_path)
    t0 = time.monotonic()
    report = slurm_drift.check(rd, "8.0", ["n1", "n2"], "n1", wait_s=0.3)
    assert time.monotonic() - t0 < 3
    assert report.differences == [] and list(report.unreachable) == ["n2"]


@pytest.mark.timeout(30)
def test_a_node_task_on_drifted_nodes_starts_no_torchrun_unless_drift_is_allowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from higgsfield.control.backends.slurm import template_spec
    from higgsfield.node import slurm_task

    rd = _rd(tmp_path)
    other = dataclasses.replace(slurm_drift.job_facts("n2"), driver=DRIVER)
    folder = slurm_drift.attempt_dir(rd, "9.0")
    folder.mkdir(parents=True)
    (folder / "n2.json").write_text(json.dumps(encode(other)))
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.delenv(slurm_task.PORT_VAR, raising=False)   # torchrun would need it: never reached
    spec = template_spec(project="proj", experiment="probe", run="run1", module="probe", code_dir="/c", params={})
    pinned = PinnedSlurmRun(slurm_task.pin_spec(SlurmRequest(spec=spec), ["n1", "n2"], "n1"))
    (rd.path / "spec.json").write_text(json.dumps(pinned_json(pinned)))
    assert slurm_task.node(rd, "n1") == slurm_drift.DRIFT_EXIT
    assert f"n1: drift: n2: NVIDIA driver {DRIVER} (the other 1 node: none)" in capsys.readouterr().err
    assert slurm_drift.verdict(rd, "9.0")[0].node == "n2"
    assert slurm_task.drift_check(rd, dataclasses.replace(pinned, allow_drift=True), "n1") is True
    assert "(allowed: --allow-drift)" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_allow_drift_travels_in_the_plan_and_the_request(tmp_path: Path) -> None:
    from higgsfield.control.backends import RunRequest
    from higgsfield.control.backends.slurm import template_spec

    backend = offline_backend(tmp_path)
    assert backend.plan(RunRequest("probe", allow_drift=True)).allow_drift is True  # type: ignore[attr-defined]
    assert backend.plan(RunRequest("probe")).allow_drift is False                    # type: ignore[attr-defined]
    spec = template_spec(project="p", experiment="probe", run="r1", module="probe", code_dir="/c", params={})
    req = SlurmRequest(spec=spec, allow_drift=True)
    assert decode_request(json.loads(json.dumps(encode(req)))).allow_drift is True
    older = {k: v for k, v in encode(req).items() if k != "allow_drift"}   # an earlier release's request
    assert decode_request(older).allow_drift is False


# -- on the cluster --------------------------------------------------------------------------------

def _slurmd_pid(node: str) -> int:
    """The pid of the bed's slurmd for ``node`` (``slurmd ... -N node``): its mount namespace is the node's."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"slurmd") and b"-N" in argv and argv[argv.index(b"-N") + 1:][:1] == [
                node.encode()]:
            return int(p.name)
    raise AssertionError(f"no slurmd for {node}: is the Slurm bed up?")


@contextlib.contextmanager
def gpu_driver_on(node: str) -> Iterator[None]:
    """``/proc/driver/nvidia`` with a driver and one GPU, seen on ``node`` only (its slurmd's mount namespace);
    one left by a run that was killed outright is taken away first (nothing may outlive the test)."""
    pid = _slurmd_pid(node)
    enter = ["nsenter", "--mount", f"--target={pid}", "--"]
    if Path(f"/proc/{pid}/root/proc/driver/{MARKER}").exists():
        subprocess.run([*enter, "umount", "/proc/driver"], check=True, capture_output=True, timeout=30)
    with tempfile.TemporaryDirectory(prefix="hf-drift-") as d:
        root = Path(d)
        (root / MARKER).write_text("a test's fake driver: tests/slurm/test_slurm_drift.py\n")
        gpu = root / "nvidia" / "gpus" / "0000:01:00.0"
        gpu.mkdir(parents=True)
        (root / "nvidia" / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Sat Aug 19 01:13:56 UTC 2023\n")
        (gpu / "information").write_text(f"Model: \t\t {MODEL}\nIRQ: \t\t 42\n")
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        subprocess.run([*enter, "mount", "--bind", str(root), "/proc/driver"], check=True, capture_output=True,
                       timeout=30)
        try:
            yield
        finally:
            subprocess.run([*enter, "umount", "/proc/driver"], check=True, capture_output=True, timeout=30)


def _until_ended(c: Cluster, project: str, run: str, timeout: float = 90) -> Any:
    t0 = time.monotonic()
    while True:
        t1 = time.monotonic()
        st = c(c.engine.status(project, run))
        if st.state in ("succeeded", "failed", "killed") or time.monotonic() - t0 > timeout:
            return st
        pause_after(t1, 0.3)


@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.timeout(150)
def test_a_job_on_drifted_nodes_fails_before_training_unless_drift_is_allowed(
        settings_data: dict[str, Any], known_hosts: Path, workdir: Path) -> None:
    from higgsfield.control.backends.slurm import template_spec
    from higgsfield.control.config.slurm import SlurmConfig

    settings = SlurmConfig.model_validate(settings_data)
    c = Cluster(settings.model_copy(update={"extra": ["--nodelist=n1,n2"]}), known_hosts)
    project = "slurmproj"
    try:
        with gpu_driver_on("n2"):
            t0 = time.monotonic()
            refused = template_spec(project=project, experiment="probe", run=f"drift-{os.getpid()}",
                                    module="slurmprobe", code_dir=str(workdir / "code"), params={}, nproc=1)
            job = c(c.engine.submit(refused, {"HF_SLURM_SECRET": SECRET}))
            st = _until_ended(c, project, refused.run)
            t_refused = time.monotonic() - t0
            assert st.state == "failed", (st.state, st.reason)
            assert st.reason.startswith("the nodes differ (3 differences), stopped before training"), st.reason
            assert st.error_tail == [f"n2: NVIDIA driver {DRIVER} (the other 1 node: none)",   # what status prints
                                     f"n2: GPU model {MODEL} (the other 1 node: none)",
                                     "n2: GPU count 1 (the other 1 node: none)"], st.error_tail
            assert st.failed_node == "n2"
            assert not list(Path(job.paths.logs).glob("rank*.log")), "torchrun started on drifted nodes"

            t1 = time.monotonic()
            allowed = dataclasses.replace(refused, run=f"drift-ok-{os.getpid()}")
            job = c(c.engine.submit(allowed, {"HF_SLURM_SECRET": SECRET}, allow_drift=True))
            st = _until_ended(c, project, allowed.run)
            t_allowed = time.monotonic() - t1
        assert st.state == "succeeded", (st.state, st.reason, st.error_tail)
        assert sorted(st.nodes) == ["n1", "n2"]
        launcher = Path(job.paths.launcher_log).read_text()
        assert f"n2: NVIDIA driver {DRIVER} (the other 1 node: none) (allowed: --allow-drift)" in launcher
        print(f"\ndrifted job refused in {t_refused:.1f}s; with --allow-drift it ran in {t_allowed:.1f}s")
    finally:
        c.close()
