"""``higgsfield setup`` end to end on real sshd hosts and the test bed's dockerd.

Run in order (one project for the module): fresh hosts (refused without a terminal,
then pinned with --accept-new-host-keys) -> re-run changes nothing -> one sshd stopped
-> one host key changed. The hosts are test-bed hosts 11-13, this module's own: their
homes are wiped and one is rekeyed, which must not happen under the shared hfnode0-3
that other tests use at the same time. ``make test`` runs them; ``make test-fast`` skips them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from testbed import Testbed

import higgsfield
from higgsfield.control.config import load_config
from higgsfield.control.remote.ssh import SSHTransport

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

BASE_IMAGE = "higgsfield-testbase:torch2.13"
HOSTS = (11, 12, 13)  # this module's own test-bed hosts (20 and 21 are tests/slurm's, which runs beside)


@pytest.fixture(scope="module")
def hosts(testbed: Testbed) -> list[Any]:
    """Hosts 11-13, up, made fresh: homes reset, users out of the docker group."""
    from testbed import impl

    out = []
    for i in HOSTS:
        h = impl.make_host(i, testbed.state_dir)
        impl.ensure_user(h, testbed.client_pubkey)
        impl.start_host(h)
        testbed.reset_home(h)
        testbed.remove_from_docker_group(h)
        out.append(h)
    return out


@pytest.fixture(scope="module")
def project(testbed: Testbed, hosts: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project listing the hosts, with no host key pinned yet."""
    bed = testbed
    root = tmp_path_factory.mktemp("setup-project")
    nodes = "".join(f"  - host: {h.address}\n    port: {h.port}\n    user: {h.user}\n    name: {h.name}\n"
                    for h in hosts)
    (root / "higgsfield.yml").write_text(
        f"name: setup_e2e\nnodes:\n{nodes}ssh:\n  identity_file: {bed.client_key}\n"
        f"  connect_timeout: 3\n  retries: 1\ndocker:\n  base_image: {bed.base_image or BASE_IMAGE}\n")
    home_config = root / ".home-config"
    key = home_config / "keys" / "setup_e2e" / "deploy_key"
    key.parent.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)  # noqa: S603,S607
    return root


def _setup(project: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_") and k != "CI"}
    env["HIGGSFIELD_HOME_CONFIG"] = str(project / ".home-config")
    env["COLUMNS"] = "250"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "higgsfield", "setup", *args], cwd=project, env=env,  # noqa: S603
                          capture_output=True, text=True, timeout=timeout, check=False)
    spent = time.monotonic() - start
    print(f"\nhiggsfield setup {' '.join(args)}: exit {proc.returncode} in {spent:.1f}s\n{proc.stdout}{proc.stderr}")
    return proc, spent


async def _on_nodes(project: Path, argv: list[str]) -> list[str]:
    cfg = load_config(project / "higgsfield.yml")
    ts = [SSHTransport.from_config(cfg, n) for n in cfg.nodes]
    try:
        results = await asyncio.gather(*(t.run(argv, check=False) for t in ts))
        return [r.stdout.strip() if r.ok else f"FAILED {r.exit_status}: {r.stderr.strip()}" for r in results]
    finally:
        await asyncio.gather(*(t.close() for t in ts))


def _snapshot(hosts: list[Any]) -> dict[str, tuple[bytes, int]]:
    snap = {}
    for h in hosts:
        for rel in (".ssh/config", ".ssh/higgsfield_deploy_key", ".higgsfield/venv/higgsfield-build"):
            p = Path(h.home) / rel
            snap[f"{h.name}:{rel}"] = (p.read_bytes(), p.stat().st_mtime_ns)
    return snap


def test_fresh_hosts_get_ready(hosts: list[Any], project: Path) -> None:
    known = project / ".higgsfield" / "known_hosts"
    # no terminal to ask at: refused, every new node's fingerprint listed, nothing pinned or sent
    proc, _ = _setup(project)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"error: {', '.join(h.name for h in hosts)}: host keys not pinned in ")
    assert "re-run with --accept-new-host-keys" in proc.stderr
    assert f"{len(hosts)} node(s) are not pinned in .higgsfield/known_hosts yet" in proc.stdout
    assert not known.exists() and not any((Path(h.home) / ".higgsfield").exists() for h in hosts)

    proc, _ = _setup(project, "--accept-new-host-keys")
    assert proc.returncode == 0, proc.stderr
    assert f"all {len(hosts)} node(s) ready" in proc.stdout
    out = proc.stdout
    assert "docker-group applied: added <user> to the docker group; reconnected (all nodes)" in out
    assert "invoker applied: installed higgsfield" in out
    assert out.count("pinned hfnode") == len(hosts)
    # the users can run docker in a new login; the invoker reports the control side's version
    assert asyncio.run(_on_nodes(project, ["docker", "info", "--format", "{{.ServerVersion}}"]))[0][0].isdigit()
    versions = asyncio.run(_on_nodes(project, [".higgsfield/venv/bin/higgsfield", "invoker", "version"]))
    assert all(f'"version": "{higgsfield.__version__}"' in v for v in versions), versions
    for h in hosts:
        key = Path(h.home) / ".ssh" / "higgsfield_deploy_key"
        assert key.stat().st_mode & 0o777 == 0o600
        assert (Path(h.home) / ".ssh" / "config").read_text().count("# >>> higgsfield (managed) >>>") == 1
    pinned = known.read_text().splitlines()
    assert sorted(ln.split()[0] for ln in pinned) == sorted(f"[{h.address}]:{h.port}" for h in hosts)


def test_rerun_changes_nothing(hosts: list[Any], project: Path) -> None:
    before = _snapshot(hosts)
    known_before = (project / ".higgsfield" / "known_hosts").read_bytes()
    proc, spent = _setup(project)
    assert proc.returncode == 0, proc.stderr
    assert "every step was already done, nothing changed" in proc.stdout
    assert "applied" not in proc.stdout and "pinned" not in proc.stdout
    assert _snapshot(hosts) == before  # byte for byte, not even rewritten
    assert (project / ".higgsfield" / "known_hosts").read_bytes() == known_before
    assert spent < 60


def test_stopped_sshd_fails_only_that_node_quickly(testbed: Testbed, hosts: list[Any], project: Path) -> None:
    with testbed.host_stopped(hosts[2]) as victim:
        proc, spent = _setup(project)
    assert proc.returncode == 1
    assert f"{victim.name}: connect: cannot connect to {victim.user}@{victim.address}:{victim.port}" in proc.stdout
    assert "connect timeout 3s" in proc.stdout
    assert f"error: setup failed on 1 of {len(hosts)} node(s): {victim.name}" in proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("│ hfnode")]
    assert sum("unreachable" in ln for ln in lines) == 1
    assert sum(ln.count("done") >= 5 for ln in lines) == len(hosts) - 1  # the others finished
    assert spent < 3 * 2 + 1.5 + 30  # 2 attempts x connect timeout + backoff + the other nodes' checks


def test_changed_host_key_is_refused_before_any_command(testbed: Testbed, hosts: list[Any], project: Path) -> None:
    victim = hosts[1]
    log = Path(victim.logfile)
    known = project / ".higgsfield" / "known_hosts"
    with testbed.host_rekeyed(victim) as new_pub:  # the old key is restored afterwards
        logged_before = log.read_text().count("Accepted publickey") if log.exists() else 0
        pinned_before = known.read_bytes()
        proc, _ = _setup(project, "--node", victim.name, "--accept-new-host-keys")  # the flag is no re-pin
        assert proc.returncode == 1
        assert f"host key of [{victim.address}]:{victim.port} changed" in proc.stdout
        assert f"higgsfield setup --repin {victim.name}" in proc.stdout
        node_log = (project / ".higgsfield" / "logs" / "setup" / f"{victim.name}.log").read_text()
        assert "$ " not in node_log  # no command ran
        assert log.read_text().count("Accepted publickey") == logged_before  # never even authenticated
        assert known.read_bytes() == pinned_before
        # re-pinning deliberately shows the new fingerprint next to the old one, then works
        new_fp = str(asyncssh.import_public_key(new_pub).get_fingerprint("sha256"))
        proc, _ = _setup(project, "--node", victim.name, "--repin", victim.name)
        assert proc.returncode == 1 and "stdin is not a terminal" in proc.stderr  # asks, cannot: refused
        assert f"{victim.name}  [{victim.address}]:{victim.port}  ED25519  {new_fp}  (pinned now: SHA256:" in proc.stdout
        assert known.read_bytes() == pinned_before
        proc, _ = _setup(project, "--node", victim.name, "--repin", victim.name, "--accept-new-host-keys")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"pinned {victim.name}'s host key {new_fp}" in proc.stdout
        assert known.read_text().count(f"[{victim.address}]:{victim.port} ") == 1
    # the old key is back: re-pin it, so the module leaves a project that matches its hosts
    proc, _ = _setup(project, "--node", victim.name, "--repin", victim.name, "--accept-new-host-keys")
    assert proc.returncode == 0, proc.stdout + proc.stderr
