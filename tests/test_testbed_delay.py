"""The benchmarks' delayed test-bed host: every SSH session waits, is logged, and still does what was asked.

bench/setup_fanout.py counts on this wrapper (sshd ``ForceCommand``) for its figures:
the delay must apply to every session, SFTP included, the client's command must run
unchanged (quoting, newlines, exit status), and each session must be one log line.
Uses the bench's own host (hfnode30, 127.0.0.32) through bench/_bed.py, under its lock.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from types import ModuleType

import asyncssh
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

REPO = Path(__file__).resolve().parents[1]
DELAY = 0.4


def _bed() -> ModuleType:
    import testbed  # tests/ is on sys.path (rootdir conftest)

    return testbed.bench_bed()


@pytest.fixture(scope="module")
def bed() -> ModuleType:
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root")
    return _bed()


def _ssh(tb: ModuleType, host: object, command: str) -> tuple[subprocess.CompletedProcess[str], float]:
    sdir = tb.state_dir()
    argv = ["ssh", "-F", "/dev/null", "-i", str(sdir / "client" / "id_ed25519"), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={sdir / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-p", str(host.port),  # type: ignore[attr-defined]
            f"{host.user}@{host.address}", command]  # type: ignore[attr-defined]
    start = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)  # noqa: S603
    return p, time.monotonic() - start


@pytest.mark.timeout(180)
def test_every_session_is_delayed_logged_and_runs_unchanged(bed: ModuleType, tmp_path: Path) -> None:
    tb = bed.load_testbed()
    with bed.bench_hosts(1, delay=DELAY, docker=False) as hosts:
        h = hosts[0]
        assert f"ForceCommand sleep {DELAY:g};" in h.sshd_config.read_text()
        before = bed.session_count(h)

        # a command with quoting and a newline, as shlex.join builds them; its output and status pass through
        p, spent = _ssh(tb, h, "python3 -c 'import sys\nprint(sys.argv[1:])' 'a b' \"c'd\"; exit 7")
        assert p.returncode == 7, p.stderr
        assert p.stdout.strip() == "['a b', \"c'd\"]"
        assert spent >= DELAY

        # SFTP (a subsystem request, which ForceCommand also replaces), with asyncssh as setup uses it
        known = tmp_path / "known_hosts"
        known.write_text(tb.known_hosts_line(h) + "\n")

        async def put_and_read() -> tuple[float, str]:
            async with asyncssh.connect(h.address, h.port, username=h.user, known_hosts=str(known),
                                        client_keys=[str(tb.state_dir() / "client" / "id_ed25519")],
                                        config=None) as conn:
                start = time.monotonic()
                async with conn.start_sftp_client() as sftp, \
                        sftp.open("bench-delay-test.txt", "wb", asyncssh.SFTPAttrs(permissions=0o600)) as f:
                    await f.write(b"payload\n")
                sent = time.monotonic() - start
                r = await conn.run("stat -c %a bench-delay-test.txt && cat bench-delay-test.txt "
                                   "&& rm bench-delay-test.txt", check=True)
                return sent, str(r.stdout)

        sent, out = asyncio.run(put_and_read())
        assert out.split() == ["600", "payload"]
        assert sent >= DELAY

        # one line per session, in order: the ssh command, the SFTP session, the check
        assert bed.session_count(h) - before == 3
        commands = bed.session_commands(h, before)
        assert commands[0].startswith("python3 -c 'import sys print(sys.argv[1:])'")
        assert commands[1] == "internal-sftp"
        assert commands[2].startswith("stat -c %a bench-delay-test.txt")
    # the bench stops its hosts at the end
    assert not tb.host_running(h)


@pytest.mark.timeout(120)
def test_no_delay_means_no_wrapper(bed: ModuleType) -> None:
    tb = bed.load_testbed()
    with bed.bench_hosts(1, delay=None, docker=False) as hosts:
        h = hosts[0]
        assert "ForceCommand" not in h.sshd_config.read_text()
        assert tb.command_delay(h) is None
        before = bed.session_count(h)
        p, _ = _ssh(tb, h, "echo plain")
        assert p.returncode == 0 and p.stdout == "plain\n"
        assert bed.session_count(h) == before  # nothing wraps or logs the session
