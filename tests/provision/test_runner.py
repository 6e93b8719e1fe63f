"""The provision runner with stand-in steps on a localhost node and an unreachable one (no sshd needed)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import ClassVar

import pytest

from higgsfield.control.config import Config
from higgsfield.control.provision import Check, Outcome, SetupOptions, Step, StepFailed, provision
from higgsfield.control.provision import runner as runner_mod
from higgsfield.control.provision.context import NodeContext


class _Fake(Step):
    applied: ClassVar[list[str]] = []

    def __init__(self, name: str, state: str, needs: tuple[str, ...] = ()) -> None:
        self.name = name  # type: ignore[misc]
        self.title = name  # type: ignore[misc]
        self.needs = needs  # type: ignore[misc]
        self.state = state
        self.done = state == "done"

    async def check(self, ctx: NodeContext) -> Check:
        await ctx.run(["echo", f"checking {self.name}"])
        if self.state == "skip":
            return Check(False, "not here", skip=True)
        if self.state == "fail-check":
            raise StepFailed("the check found a problem")
        return Check(self.done, "in place" if self.done else "missing")

    async def apply(self, ctx: NodeContext) -> str:
        _Fake.applied.append(self.name)
        if self.state == "fail-apply":
            await ctx.run(["sh", "-c", "echo detailed-output-xyz; exit 4"])
        self.done = True
        return "made it so"


def _cfg(tmp_path: Path, nodes: list[dict[str, object]]) -> Config:
    cfg = Config.model_validate({"name": "p", "nodes": nodes, "ssh": {"connect_timeout": 1, "retries": 0}})
    cfg.path = tmp_path / "higgsfield.yml"
    return cfg


@pytest.fixture
def fake_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    _Fake.applied = []
    steps = (_Fake("a", "done"), _Fake("b", "apply"), _Fake("c", "fail-apply"), _Fake("d", "apply", needs=("c",)),
             _Fake("e", "skip"), _Fake("f", "apply", needs=("a",)))
    monkeypatch.setattr(runner_mod, "STEPS", steps)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def test_steps_run_in_order_and_failures_are_contained(tmp_path: Path, fake_steps: None) -> None:
    cfg = _cfg(tmp_path, [{"host": "localhost"}, {"host": "127.0.0.1", "port": _closed_port(), "name": "gone", "user": "tester"}])
    events: list[tuple[str, str, str]] = []
    report = asyncio.run(provision(cfg, options=SetupOptions(cache_dir=tmp_path / "cache"),
                                   on_event=lambda n, s, st, d: events.append((n, s, st))))
    local, gone = report.nodes
    assert [(s.step, s.outcome) for s in local.steps] == [
        ("a", Outcome.DONE), ("b", Outcome.APPLIED), ("c", Outcome.FAILED), ("d", Outcome.NOT_RUN),
        ("e", Outcome.SKIPPED), ("f", Outcome.APPLIED)]
    assert _Fake.applied == ["b", "c", "f"]
    assert "needs c" in local.steps[3].detail
    assert not report.ok and not local.ok
    log = tmp_path / ".higgsfield" / "logs" / "setup" / "localhost.log"
    assert local.log_path == log and "detailed-output-xyz" in log.read_text()
    failure = next(f for f in report.failures() if f.startswith("localhost"))
    assert "localhost: c: 'sh' exited 4" in failure and str(log) in failure
    # the unreachable node is reported, the other one was not held up
    assert gone.error and "cannot connect" in gone.error and "gone" not in gone.error
    assert all(s.outcome == Outcome.NOT_RUN for s in gone.steps)
    assert any(f.startswith("gone: connect: cannot connect to") for f in report.failures())
    assert ("localhost", "b", "running") in events and ("localhost", "b", "applied") in events


def test_dry_run_applies_nothing(tmp_path: Path, fake_steps: None) -> None:
    cfg = _cfg(tmp_path, [{"host": "localhost"}])
    report = asyncio.run(provision(cfg, dry_run=True, steps=["a", "b", "e"]))
    assert [(s.step, s.outcome) for s in report.nodes[0].steps] == [
        ("a", Outcome.DONE), ("b", Outcome.WOULD_APPLY), ("e", Outcome.SKIPPED)]
    assert _Fake.applied == [] and report.ok and not report.unchanged


def test_unknown_step_and_node_are_config_errors(tmp_path: Path) -> None:
    from higgsfield.contract.errors import ConfigError

    cfg = _cfg(tmp_path, [{"host": "localhost"}])
    with pytest.raises(ConfigError, match="unknown step nope"):
        asyncio.run(provision(cfg, steps=["nope"]))
    with pytest.raises(ConfigError, match="no node named 'gpu-9'"):
        asyncio.run(provision(cfg, nodes=["gpu-9"]))


def test_dry_run_changes_no_pins(tmp_path: Path, fake_steps: None) -> None:
    import asyncssh

    from higgsfield.control.provision.trust import HostScan, NewHostKey

    port = _closed_port()
    cfg = _cfg(tmp_path, [{"host": "127.0.0.1", "port": port, "name": "gone", "user": "tester"}])
    known = cfg.known_hosts_path
    known.parent.mkdir(parents=True)
    pinned = f"[127.0.0.1]:{port} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEtwJl8lWtZHGYBWr1vVu+sxrsBmHY3R3PmMtbBRGB8N\n"
    known.write_text(pinned)
    new = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    scan = HostScan(new=[NewHostKey("gone", "127.0.0.1", port, new, replaces=("SHA256:old",))])  # an accepted --repin
    report = asyncio.run(provision(cfg, dry_run=True, host_keys=scan))
    assert known.read_text() == pinned  # a dry run pins nothing, even an accepted key
    assert not report.ok and "cannot connect" in (report.nodes[0].error or "")
    asyncio.run(provision(cfg, host_keys=scan))
    assert known.read_text().splitlines() == [f"[127.0.0.1]:{port} {new.export_public_key().decode().strip()} "
                                              "higgsfield:gone"]  # pinned before connecting, old key gone


def test_an_unexpected_exception_is_that_nodes_result(tmp_path: Path, fake_steps: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(tmp_path, [{"host": "localhost"}, {"host": "127.0.0.1", "name": "buggy", "user": "tester"}])
    from higgsfield.control.remote import fanout

    real = fanout.transport_for

    class Buggy:
        node = "buggy"

        async def connect(self) -> None:
            raise RuntimeError("a bug")

        async def close(self) -> None:
            return None

    def fake(cfg: Config, node: object, **kw: object) -> object:
        return Buggy() if getattr(node, "name", None) == "buggy" else real(cfg, node, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fanout, "transport_for", fake)
    report = asyncio.run(provision(cfg, steps=["a", "b"], options=SetupOptions(cache_dir=tmp_path / "cache")))
    local, buggy = report.nodes
    assert local.ok and [s.outcome for s in local.steps] == [Outcome.DONE, Outcome.APPLIED]
    assert buggy.error == "unexpected error: RuntimeError: a bug" and not report.ok
    assert [s.outcome for s in buggy.steps] == [Outcome.NOT_RUN, Outcome.NOT_RUN]
    assert "RuntimeError: a bug" in (tmp_path / ".higgsfield" / "logs" / "setup" / "buggy.log").read_text()
