"""The test bed itself works: key login with pinned host keys, sudo, faults, Docker, torch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import testbed as tbmod

pytestmark = pytest.mark.slow


@pytest.mark.sshd
def test_key_login_to_every_host_with_pinned_host_keys(testbed_sshd: tbmod.Testbed,
                                                       tmp_path: Path) -> None:
    tb = testbed_sshd
    assert len(tb.hosts) >= 2
    known = tb.write_known_hosts(tmp_path / "known_hosts")  # the real keys, read from disk
    for h in tb.hosts:
        assert h.address.startswith("127.") and h.address == f"127.0.0.{h.index + 2}"
        p = subprocess.run(
            [tbmod.exe("ssh"), "-F", "/dev/null", "-i", str(tb.client_key), "-o", "IdentitiesOnly=yes",
             "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
             "-o", "StrictHostKeyChecking=yes", "-p", str(h.port), f"{h.user}@{h.address}",
             'echo "$(id -un) $HOME $SSH_CONNECTION"'],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        user, home, _cip, _cport, server_ip, server_port = p.stdout.split()
        assert (user, home) == (h.user, str(h.home))
        assert (server_ip, int(server_port)) == (h.address, h.port)


@pytest.mark.sshd
def test_every_host_picks_rendezvous_ports_no_other_host_picks(testbed_sshd: tbmod.Testbed) -> None:
    """The hosts share this machine's ports, where real nodes never do: each names a range of its own to the
    invoker (``HIGGSFIELD_RENDEZVOUS_PORTS``, sshd's SetEnv), below the ephemeral ports."""
    ranges = []
    for h in testbed_sshd.hosts:
        p = testbed_sshd.ssh(h, "echo $HIGGSFIELD_RENDEZVOUS_PORTS")
        assert p.returncode == 0, p.stderr
        lo, hi = map(int, p.stdout.strip().split("-"))
        assert lo <= hi < 32768, (h.user, lo, hi)
        ranges.append(range(lo, hi + 1))
    ports = [port for r in ranges for port in r]
    assert len(ports) == len(set(ports)), ranges


@pytest.mark.sshd
def test_passwordless_sudo_on_every_host(testbed_sshd: tbmod.Testbed) -> None:
    for h in testbed_sshd.hosts:
        p = testbed_sshd.ssh(h, "sudo -n true && sudo -n id -u")
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "0"


@pytest.mark.sshd
def test_wrong_host_key_is_refused(testbed_sshd: tbmod.Testbed, tmp_path: Path) -> None:
    tb = testbed_sshd
    h0, h1 = tb.hosts[0], tb.hosts[1]
    # pin host 0's name to host 1's key: strict checking must refuse the login
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{h0.known_hosts_name} {tb.known_hosts_line(h1).split(' ', 1)[1]}\n")
    p = tb.ssh(h0, "true", known_hosts=wrong)
    assert p.returncode == 255
    assert "Host key verification failed" in p.stderr
    # and an unknown host is refused too (nothing is ever added automatically)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    p = tb.ssh(h0, "true", known_hosts=empty)
    assert p.returncode == 255 and "Host key verification failed" in p.stderr
    assert empty.read_text() == ""


@pytest.mark.sshd
def test_stop_and_start_a_host(testbed_faults, testbed_sshd: tbmod.Testbed) -> None:  # type: ignore[no-untyped-def]
    tb = testbed_sshd
    h = tb.hosts[1]
    testbed_faults.stop_host(h)
    assert not tb.host_running(h)
    p = tb.ssh(h, "true", timeout=30)
    assert p.returncode == 255 and "refused" in p.stderr.lower(), p.stderr
    assert tb.ssh(tb.hosts[0], "true").returncode == 0  # the others are unaffected
    testbed_faults.start_host(h)
    assert tb.ssh(h, "true").returncode == 0


@pytest.mark.sshd
def test_rekey_host_changes_the_key_and_is_undone(testbed_faults, testbed_sshd: tbmod.Testbed,  # type: ignore[no-untyped-def]
                                                   tmp_path: Path) -> None:
    tb = testbed_sshd
    h = tb.hosts[-1]
    old = tb.write_known_hosts(tmp_path / "old_known_hosts")
    old_line = tb.known_hosts_line(h)
    new_pub = testbed_faults.rekey_host(h)
    assert new_pub.split()[1] not in old_line
    p = tb.ssh(h, "true", known_hosts=old)
    assert p.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in p.stderr
    assert tb.ssh(h, "true").returncode == 0  # tb.known_hosts follows the new key
    testbed_faults.restore()
    assert tb.known_hosts_line(h) == old_line
    assert tb.ssh(h, "true", known_hosts=old).returncode == 0


@pytest.mark.docker
def test_base_image_has_torch(testbed: tbmod.Testbed) -> None:
    assert testbed.base_image == "higgsfield-testbase:torch2.13"
    p = subprocess.run(
        [tbmod.exe("docker"), "run", "--rm", "--network", "host", testbed.base_image,
         "python3", "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, timeout=300, env=testbed.docker_env())
    assert p.returncode == 0, p.stderr
    version = p.stdout.strip()
    assert version.split("+")[0] == tbmod.TORCH_VERSION, version  # "2.13.0+cpu"
    assert "numpy" not in p.stderr.lower()


@pytest.mark.docker
def test_base_image_has_the_control_side_deps(testbed: tbmod.Testbed) -> None:
    p = subprocess.run(
        [tbmod.exe("docker"), "run", "--rm", "--network", "host", testbed.base_image, "python3", "-c",
         "import click, pydantic, yaml, jinja2, rich, asyncssh, docker; print('ok')"],
        capture_output=True, text=True, timeout=300, env=testbed.docker_env())
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    p = subprocess.run([tbmod.exe("docker"), "run", "--rm", "--network", "host", testbed.base_image,
                        "sh", "-c", "git --version && ssh -V"],
                       capture_output=True, text=True, timeout=120, env=testbed.docker_env())
    assert p.returncode == 0, p.stderr


@pytest.mark.sshd
@pytest.mark.docker
def test_docker_group_helper_gives_a_node_the_engine(testbed: tbmod.Testbed, testbed_faults) -> None:  # type: ignore[no-untyped-def]
    h = testbed.hosts[-1]
    was_member = testbed.in_docker_group(h)
    if was_member:  # a test before this one gave it the engine on purpose: take it away, then give it back
        testbed.remove_from_docker_group(h)
    try:
        p = testbed.ssh(h, "docker version --format '{{.Server.Version}}'")
        assert p.returncode != 0 and "permission denied" in p.stderr.lower(), p.stdout + p.stderr
        testbed_faults.add_to_docker_group(h)
        p = testbed.ssh(h, "docker version --format '{{.Server.Version}}'")
        assert p.returncode == 0 and p.stdout.strip(), p.stderr
        testbed_faults.restore()
        assert not testbed.in_docker_group(h)
    finally:
        if was_member:
            testbed.add_to_docker_group(h)
