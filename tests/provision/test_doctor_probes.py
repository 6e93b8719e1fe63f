"""Doctor checks against canned probe answers (GPU parsing, docker access, clock skew, invoker version)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

import higgsfield
from higgsfield.control import doctor
from higgsfield.control.config import Config
from higgsfield.control.doctor import checks, probe
from higgsfield.control.remote.base import CommandResult, Transport
from higgsfield.control.remote.probe import Clock

SMI_CSV = "NVIDIA H200, 550.54.15, 143771 MiB\nNVIDIA H200, 550.54.15, 143771 MiB\n"
SMI = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |\n"


class Canned(Transport):
    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.node = "n"
        self.answers = answers

    async def run(self, argv: Sequence[str], *, input: str | bytes | None = None, timeout: float | None = None,
                  check: bool = True) -> CommandResult:
        key = " ".join(argv)
        for prefix, (code, out, err) in self.answers.items():
            if key.startswith(prefix):
                return CommandResult("n", tuple(argv), code, out, err)
        return CommandResult("n", tuple(argv), 127, "", "not found")

    def stream(self, argv: Sequence[str], *, input: str | bytes | None = None) -> AsyncIterator[str]:
        raise NotImplementedError

    async def put_bytes(self, data: bytes, path: str, *, mode: int = 0o600) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def _cfg() -> Config:
    return Config.model_validate({"name": "p", "nodes": [{"host": "gpu-1"}]})


def _facts(answers: dict[tuple[str, ...], tuple[int, str, str]], **kw: object) -> doctor.Facts:
    """The probe's answers as a node would give them (a command not listed answers 127, as if not found)."""
    return doctor.Facts("n", {argv: CommandResult("n", argv, *a) for argv, a in answers.items()}, **kw)  # type: ignore[arg-type]


def test_gpus_parsed_and_missing_runtime_flagged() -> None:
    f = _facts({probe.GPU_QUERY: (0, SMI_CSV, ""), probe.SMI: (0, SMI, ""),
                probe.DOCKER_INFO: (0, '{"ServerVersion": "27.1", "Runtimes": {"runc": {}}}', "")})
    p = checks._gpus(f)
    assert p.data["count"] == 2 and p.data["driver"] == "550.54.15" and p.data["cuda"] == "12.4"
    assert p.summary == "2 x NVIDIA H200, driver 550.54.15, CUDA 12.4"
    assert not p.ok and p.fix == "higgsfield setup --step nvidia"
    f.answers[probe.DOCKER_INFO] = CommandResult("n", probe.DOCKER_INFO, 0, '{"Runtimes": {"nvidia": {}, "runc": {}}}', "")
    assert checks._gpus(f).ok
    assert checks._gpus(_facts({})).summary == "none"


def test_docker_access_clock_and_invoker() -> None:
    cfg = _cfg()
    node = cfg.nodes[0]
    denied = _facts({probe.DOCKER_INFO: (1, "", "permission denied while trying to connect to the Docker daemon socket")})
    p = checks._docker(denied)
    assert not p.ok and p.fix == "higgsfield setup --step docker-group"
    p = checks._clock(Clock(30.0, 0.01))
    assert not p.ok and p.summary.startswith("+30") and "timedatectl" in (p.fix or "")
    assert checks._clock(Clock(0.004, 0.002)).summary == "+0.00s"
    assert not checks._clock(None).ok
    version = probe._version_argv(cfg, node)
    assert version == (".higgsfield/venv/bin/higgsfield", "--version")
    p = checks._invoker(cfg, node, _facts({version: (0, "higgsfield, version 0.0.9\n", "")}))
    assert not p.ok and "0.0.9 differs" in (p.problem or "")
    assert checks._invoker(cfg, node, _facts({version: (0, f"higgsfield, version {higgsfield.__version__}\n", "")})).ok
    df = "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/x 100 50 1048576 50% /\n"
    p = checks._disk(_facts({probe.DF_HOME: (0, df, "")}))
    assert not p.ok and p.summary == "checkpoints 1 GiB" and "less than 10 GiB" in (p.problem or "")
    assert checks._sudo(_facts({}, uid=0)).summary == "root"
    assert checks._sudo(_facts({probe.SUDO_OK: (1, "", "sudo: a password is required\n")}, uid=1000)).summary == \
        "asks password"


def test_one_probe_answers_every_check_on_a_local_node(tmp_path: Path) -> None:
    """diagnose on localhost: every check gets its answer (and the clock) from the one probe."""
    cfg = Config.model_validate({"name": "p", "nodes": [{"host": "localhost"}]})
    cfg.path = tmp_path / "higgsfield.yml"
    report = asyncio.run(doctor.diagnose(cfg))
    checks = report.nodes[0].checks
    assert set(checks) >= {"ssh", "host key", "sudo", "docker", "gpus", "disk", "clock", "invoker", "environment"}
    assert checks["ssh"].ok and checks["disk"].data["free_gib"]["checkpoints"] > 0
    assert abs(checks["clock"].data["skew_s"]) < 0.05 and checks["clock"].data["rtt_s"] < 1


def test_sudo_asking_for_a_password_is_a_clear_setup_error(tmp_path: Path) -> None:
    from higgsfield.contract.errors import StepFailed
    from higgsfield.control.provision.context import NodeContext, NodeLog, SetupOptions
    from higgsfield.control.provision.system import OsStep
    from higgsfield.control.provision.wheels import Artifacts

    cfg = _cfg()
    t = Canned({"uname -sm": (0, "Linux x86_64\n", ""), "cat /etc/os-release": (0, 'PRETTY_NAME="Ubuntu 22.04"\n', ""),
                "id -un": (0, "alice\n", ""), "id -u": (0, "1000\n", ""),
                "sudo -n true": (1, "", "sudo: a password is required\n")})
    log = NodeLog(tmp_path / "n.log")
    ctx = NodeContext(cfg, cfg.nodes[0], t, log, SetupOptions(), Artifacts(tmp_path))
    with pytest.raises(StepFailed) as err:
        asyncio.run(OsStep().check(ctx))
    log.close()
    assert "passwordless sudo is required for alice (sudo: a password is required)" in str(err.value)
    assert "alice ALL=(ALL) NOPASSWD:ALL" in str(err.value) and "/etc/sudoers.d/alice" in str(err.value)


def test_doctor_refuses_an_unpinned_node_and_runs_nothing_there(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
    from sshserver import fake_server

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            cfg = Config.model_validate({"name": "p", "nodes": [{"host": "127.0.0.1", "port": srv.port, "name": "n1"}],
                                         "ssh": {"user": "tester", "identity_file": str(srv.client_key_path),
                                                 "retries": 0}})
            cfg.path = tmp_path / "higgsfield.yml"
            report = await doctor.diagnose(cfg)
            assert srv.commands == []  # no check ran on a host whose identity is unverified
            checks = report.nodes[0].checks
            assert set(checks) <= {"ssh", "host key", "rendezvous"}
            assert checks["host key"].summary == "not pinned"
            assert f"[127.0.0.1]:{srv.port} offers host key SHA256:" in (checks["host key"].problem or "")
            assert "not pinned in" in (checks["host key"].problem or "")
            assert (checks["host key"].fix or "").startswith("higgsfield setup")
            assert not cfg.known_hosts_path.exists()

    asyncio.run(main())
