"""Only ``higgsfield setup`` trusts a new host; every other command refuses it, before logging in.

On a real sshd (test-bed host 23, this file's own, so its log shows every login):

- each command (run, deploy, status, logs, kill, doctor, ci run/kill/deploy) against the
  node unpinned, and against a changed key: one line naming the node, ``host:port``,
  the offered fingerprint and the fix, exit 1 (a refused host is a RemoteError, like an
  unreachable one), known_hosts byte for byte unchanged, and the sshd log shows the
  connection dropped before authentication;
- setup: no terminal -> refused with the flag to use; CI=true -> refused even at a
  terminal; a "n" at the prompt -> nothing pinned or sent; "y" -> pinned, then
  provisioned; ``--accept-new-host-keys``; ``--repin`` shows and asks too; a dry run pins nothing.

And on an in-process asyncssh server (no root needed, so these run in ``make test-fast``):
``run`` with a secret against an unpinned server never logs in, so no session, command
or secret ever reaches it; setup fetches the key without a login and asks before sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

REPO = Path(__file__).resolve().parents[1]
TRUST_HOST = 23  # this file's test-bed host (hfnode23 on 127.0.0.25): nobody else logs in there
SECRET = "s3cret-never-sent-9f1c"
EXPERIMENT = '''\
from higgsfield.experiment import experiment, param


@experiment("probe")
@param("x", default=1, description="anything")
def probe(params):
    print(params.x)
'''


# -- running the CLI as a user does -------------------------------------------

def _env(project: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HIGGSFIELD_", "GITHUB_")) and k != "CI"}
    env.update(COLUMNS="250", HIGGSFIELD_HOME_CONFIG=str(project / ".home-config"), **(extra or {}))
    return env


def hf(project: Path, *args: str, env: dict[str, str] | None = None, answer: str | None = None,
       timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``python -m higgsfield ARGS`` in ``project``; with ``answer``, stdin is a terminal that types it."""
    argv = [sys.executable, "-m", "higgsfield", *args]
    if answer is None:
        return subprocess.run(argv, cwd=project, env=_env(project, env), stdin=subprocess.DEVNULL,  # noqa: S603
                              capture_output=True, text=True, timeout=timeout, check=False)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, cwd=project, env=_env(project, env), stdin=slave,  # noqa: S603
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(slave)
    try:
        os.write(master, answer.encode())  # the terminal holds it until the prompt reads it
        out, err = proc.communicate(timeout=timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _git(d: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=d, check=True, capture_output=True,  # noqa: S603,S607
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def make_project(root: Path, host: str, port: int, user: str, node: str, key: Path) -> Path:
    """A committed project with one node, a secret in ``env``, an experiment, and a CI key file."""
    root.mkdir(parents=True)
    (root / "higgsfield.yml").write_text(
        f"name: trust\nnodes:\n  - host: {host}\n    port: {port}\n    user: {user}\n    name: {node}\n"
        f"ssh:\n  identity_file: {key}\n  connect_timeout: 5\n  retries: 0\nsecrets: [HF_TRUST_SECRET]\n")
    (root / "src").mkdir()
    (root / "src" / "probe.py").write_text(EXPERIMENT)
    (root / "env").write_text(f"HF_TRUST_SECRET={SECRET}\n")
    (root / "env").chmod(0o600)
    (root / ".gitignore").write_text("env\n.higgsfield/\n.home-config/\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "trust test project")
    ci_key = root / ".home-config" / "runner_key"
    ci_key.parent.mkdir(parents=True)
    shutil.copyfile(key, ci_key)
    ci_key.chmod(0o600)
    return root


def _random_key_line(name: str) -> tuple[str, str]:
    """A known_hosts line pinning a fresh key for ``name``, and that key's fingerprint."""
    key = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    return f"{name} {key.export_public_key().decode().strip()}\n", key.get_fingerprint("sha256")


def _fingerprint(pubkey_file: Path) -> str:
    return str(asyncssh.read_public_key(str(pubkey_file)).get_fingerprint("sha256"))


# -- the commands: refused before authentication --------------------------------

COMMANDS: dict[str, list[str]] = {
    "run": ["run", "probe", "-p", "x=2"],
    "deploy": ["deploy"],
    "status": ["status"],
    "logs": ["logs", "probe-20250101-0000-abcd"],
    "kill": ["kill", "probe"],
    "doctor": ["doctor"],
    "prune": ["prune", "--older-than", "1d"],
    "pull": ["pull", "probe-20250101-0000-abcd"],
    "ci run": ["ci", "run", "probe"],
    "ci kill": ["ci", "kill", "probe"],
    "ci deploy": ["ci", "deploy"],
}


@pytest.fixture(scope="module")
def host(testbed_sshd: Any) -> Any:
    """Test-bed host 23, up, with the laptop key authorized (this module's own host)."""
    from testbed import impl

    h = impl.make_host(TRUST_HOST, testbed_sshd.state_dir)
    impl.ensure_user(h, testbed_sshd.client_pubkey)
    impl.start_host(h)
    return h


@pytest.fixture(scope="module")
def project(host: Any, testbed_sshd: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("trust") / "p", host.address, host.port, host.user, host.name,
                        testbed_sshd.client_key)


class SshdLog:
    """The host's sshd log from a mark on: what the server saw of one command."""

    def __init__(self, host: Any) -> None:
        self.path = Path(host.logfile)
        self.mark = self.path.stat().st_size if self.path.exists() else 0

    def since(self) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.mark)
            return f.read().decode(errors="replace")

    def wait_for(self, text: str, limit: float = 5.0) -> str:
        deadline = time.monotonic() + limit
        while text not in self.since():
            assert time.monotonic() < deadline, f"sshd never logged {text!r}:\n{self.since()}"
            time.sleep(0.05)
        return self.since()


def _state(project: Path, host: Any, state: str) -> tuple[bytes, str]:
    """Write known_hosts for ``state`` ("unpinned": another host only; "changed": a wrong key); -> (bytes, error)."""
    entry = f"[{host.address}]:{host.port}"
    offered = _fingerprint(Path(host.host_pubkey))
    other, _ = _random_key_line("[127.0.0.250]:2222")  # the file exists (CI needs it committed), not for this node
    if state == "unpinned":
        text = other
        error = (f"{host.name}: {entry} offers host key {offered}, which is not pinned in .higgsfield/known_hosts: "
                 "refusing to connect; run 'higgsfield setup' to check the fingerprint and pin it, then commit "
                 "the file")
    else:
        line, wrong = _random_key_line(entry)
        text = other + line
        error = (f"{host.name}: host key of {entry} changed: it offers {offered}, but .higgsfield/known_hosts pins "
                 f"{wrong}. Refusing to connect (this could be a man-in-the-middle); if the node was reinstalled "
                 f"or rekeyed on purpose, re-pin it with: higgsfield setup --repin {host.name}")
    known = project / ".higgsfield" / "known_hosts"
    known.parent.mkdir(exist_ok=True)
    known.write_text(text)
    return known.read_bytes(), error


@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.timeout(240)
@pytest.mark.parametrize("state", ["unpinned", "changed"])
def test_every_command_but_setup_refuses_before_logging_in(host: Any, project: Path, state: str) -> None:
    known = project / ".higgsfield" / "known_hosts"
    for name, args in COMMANDS.items():
        before, error = _state(project, host, state)
        log = SshdLog(host)
        ci = name.startswith("ci ")
        env = {"HF_TRUST_SECRET": SECRET}
        if ci:  # what a job sets: the key file it wrote, the form's values, GitHub's annotations
            env |= {"HIGGSFIELD_SSH_KEY_FILE": str(project / ".home-config" / "runner_key"),
                    "HIGGSFIELD_PARAM_x": "2", "GITHUB_ACTIONS": "true"}
        proc = hf(project, *args, env=env)
        print(f"\n$ higgsfield {' '.join(args)}  -> exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        assert "Traceback" not in proc.stderr and SECRET not in proc.stdout + proc.stderr
        assert proc.returncode == 1, name
        if name == "doctor":  # a report: the node's host-key problem is one line, with its fix
            problem = error.split(": ", 1)[1]
            fix = " -> fix: higgsfield setup (it shows the fingerprint and asks" if state == "unpinned" else "\n"
            assert f"✗ {host.name}: host key: {problem}{fix}" in proc.stdout, name  # changed: the fix is in it
            assert proc.stderr == "error: 1 problem(s) on 1 of 1 node(s)\n"
        else:  # deploy prints what it is about to ship first
            assert proc.stderr.endswith(f"\nerror: {error}\n") or proc.stderr == f"error: {error}\n", name
            assert proc.stderr.count("error:") == 1
        if ci:
            assert f"::error title=higgsfield {name}::{error}" in proc.stdout
        assert known.read_bytes() == before, name  # nothing pinned, nothing rewritten
        seen = log.wait_for("[preauth]")  # the server saw the connection end before authentication...
        assert "Accepted publickey" not in seen and "session" not in seen.lower(), (name, seen)  # ...and no login


# -- setup: the one place that trusts, after showing and asking ----------------

@pytest.fixture
def fresh(host: Any, testbed_sshd: Any, tmp_path: Path) -> Path:
    """A project that has never pinned the host."""
    return make_project(tmp_path / "p", host.address, host.port, host.user, host.name, testbed_sshd.client_key)


def _pinned_line(host: Any) -> str:
    keytype, b64 = Path(host.host_pubkey).read_text().split()[:2]
    return f"[{host.address}]:{host.port} {keytype} {b64} higgsfield:{host.name}\n"


def _no_login(log: SshdLog) -> None:
    seen = log.wait_for("[preauth]")
    assert "Accepted publickey" not in seen, seen


@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.timeout(240)
def test_setup_refuses_without_a_terminal_or_in_ci_and_asks_at_a_terminal(host: Any, fresh: Path) -> None:
    known = fresh / ".higgsfield" / "known_hosts"
    offered = _fingerprint(Path(host.host_pubkey))
    entry = f"[{host.address}]:{host.port}"
    listed = f"{host.name}  {entry}  ED25519  {offered}"

    log = SshdLog(host)
    proc = hf(fresh, "setup", "--step", "os")
    assert proc.returncode == 1 and listed in proc.stdout
    assert proc.stderr == (f"error: {host.name}: host key not pinned in .higgsfield/known_hosts: {entry} offers "
                           f"{offered}; stdin is not a terminal, so setup cannot ask: compare the fingerprints with "
                           "the nodes' own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and re-run with "
                           "--accept-new-host-keys\n")
    assert not known.exists()
    _no_login(log)

    log = SshdLog(host)
    proc = hf(fresh, "setup", "--step", "os", env={"CI": "true"}, answer="y\n")  # a terminal, but CI: never asks
    assert proc.returncode == 1 and "[y/N]" not in proc.stdout
    assert proc.stderr.startswith(f"error: {host.name}: host key not pinned") and proc.stderr.count("\n") == 1
    assert "CI is set, and in CI setup trusts a new host key only with --accept-new-host-keys" in proc.stderr
    assert not known.exists()
    _no_login(log)

    log = SshdLog(host)
    proc = hf(fresh, "setup", "--step", "os", answer="n\n")
    assert proc.returncode == 1 and listed in proc.stdout and "Trust and pin this key? [y/N]" in proc.stdout
    assert proc.stderr == (f"error: {host.name}: host key not pinned in .higgsfield/known_hosts: {entry} offers "
                           f"{offered}; not accepted: nothing was pinned, and nothing was sent to any node\n")
    assert not known.exists()
    _no_login(log)

    log = SshdLog(host)
    proc = hf(fresh, "setup", "--step", "os", answer="y\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert listed in proc.stdout and "Trust and pin this key? [y/N]" in proc.stdout
    assert f"{host.name}  os: done" in proc.stdout and f"pinned {host.name}'s host key {offered}" in proc.stdout
    assert known.read_text() == _pinned_line(host)
    assert "Accepted publickey for " + host.user in log.wait_for("Accepted publickey")  # provisioned after pinning

    log = SshdLog(host)
    proc = hf(fresh, "status")  # pinned by setup: the other commands now log in
    assert "host key" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Accepted publickey for " + host.user in log.wait_for("Accepted publickey")
    proc = hf(fresh, "setup", "--step", "os")  # nothing new: no question, no flag needed, nothing changed
    assert proc.returncode == 0 and "[y/N]" not in proc.stdout and "nothing changed" in proc.stdout
    assert known.read_text() == _pinned_line(host)


@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.timeout(180)
def test_accept_flag_pins_for_automation_even_in_ci_and_a_dry_run_pins_nothing(host: Any, fresh: Path) -> None:
    known = fresh / ".higgsfield" / "known_hosts"
    offered = _fingerprint(Path(host.host_pubkey))
    proc = hf(fresh, "setup", "--step", "os", "--dry-run", "--accept-new-host-keys")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"trusted (dry run, not pinned) {host.name}'s host key {offered}" in proc.stdout
    assert not known.exists()
    proc = hf(fresh, "setup", "--step", "os", "--accept-new-host-keys", env={"CI": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pinning 1 host key(s): --accept-new-host-keys" in proc.stdout and offered in proc.stdout
    assert known.read_text() == _pinned_line(host)


@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.timeout(180)
def test_a_changed_key_is_refused_by_setup_too_and_repin_shows_and_asks(host: Any, fresh: Path) -> None:
    known = fresh / ".higgsfield" / "known_hosts"
    entry = f"[{host.address}]:{host.port}"
    offered = _fingerprint(Path(host.host_pubkey))
    line, wrong = _random_key_line(entry)  # as if the node had been rekeyed since it was pinned
    known.parent.mkdir()
    known.write_text(line)

    log = SshdLog(host)
    proc = hf(fresh, "setup", "--step", "os", "--accept-new-host-keys")  # the flag never accepts a changed key
    assert proc.returncode == 1
    assert f"{host.name}: connect: host key of {entry} changed: it offers {offered}" in proc.stdout
    assert f"higgsfield setup --repin {host.name}" in proc.stdout
    assert known.read_text() == line
    _no_login(log)

    proc = hf(fresh, "setup", "--step", "os", "--repin", host.name, answer="n\n")
    assert proc.returncode == 1 and f"{offered}  (pinned now: {wrong})" in proc.stdout
    assert known.read_text() == line
    proc = hf(fresh, "setup", "--step", "os", "--repin", host.name)
    assert proc.returncode == 1 and "stdin is not a terminal" in proc.stderr and known.read_text() == line
    proc = hf(fresh, "setup", "--step", "os", "--repin", host.name, answer="y\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Trust and pin this key? [y/N]" in proc.stdout and f"{host.name}  os: done" in proc.stdout
    assert known.read_text() == _pinned_line(host)  # the old key is gone
    proc = hf(fresh, "setup", "--step", "os", "--repin", host.name)  # unchanged: nothing to ask
    assert proc.returncode == 0 and "the host key it offers is the one already pinned" in proc.stdout


# -- secrets go to pinned hosts only (in-process asyncssh server) ----------------

@contextlib.contextmanager
def _server_thread(tmp: Path) -> Iterator[Any]:
    """tests/remote/sshserver.py's server, in a thread of its own, for a CLI subprocess to reach."""
    sys.path.insert(0, str(REPO / "tests" / "remote"))
    from sshserver import fake_server

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    cm = fake_server(tmp)
    try:
        yield asyncio.run_coroutine_threadsafe(cm.__aenter__(), loop).result(10)
    finally:
        asyncio.run_coroutine_threadsafe(cm.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.timeout(120)
def test_run_with_a_secret_never_reaches_an_unpinned_server(tmp_path: Path) -> None:
    with _server_thread(tmp_path) as srv:
        project = make_project(tmp_path / "p", srv.host, srv.port, "tester", "n1", srv.client_key_path)
        proc = hf(project, "run", "probe", "-p", "x=2", "--detach")
        assert proc.returncode == 1 and SECRET not in proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"error: n1: [127.0.0.1]:{srv.port} offers host key ")
        assert len(srv.connections) == 1  # it was reached...
        assert srv.auths == [] and srv.commands == [] and srv.sftp_sessions == []  # ...and never logged into
        assert not (project / ".higgsfield" / "known_hosts").exists()


@pytest.mark.timeout(120)
def test_setup_shows_and_asks_before_anything_reaches_a_new_server(tmp_path: Path) -> None:
    """The same flow as on the test bed, without root: the key is fetched without a login, then asked for."""
    with _server_thread(tmp_path) as srv:
        project = make_project(tmp_path / "p", srv.host, srv.port, "tester", "n1", srv.client_key_path)
        known = project / ".higgsfield" / "known_hosts"
        offered = str(srv.host_key.get_fingerprint("sha256"))
        for answer in (None, "n\n"):  # no terminal; a terminal that says no
            proc = hf(project, "setup", "--step", "os", answer=answer)
            assert proc.returncode == 1 and f"n1  [127.0.0.1]:{srv.port}  ED25519  {offered}" in proc.stdout
            assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
            assert srv.auths == [] and srv.commands == [] and not known.exists()
        assert len(srv.connections) == 2  # one bare key exchange per try
        proc = hf(project, "setup", "--step", "os", answer="y\n")
        # pinned, then provisioned: the stand-in server answers `uname -sm` with its own command line,
        # so the os check fails, after it ran there with the pinned key
        assert known.read_text().startswith(f"[127.0.0.1]:{srv.port} ssh-ed25519 ")
        assert srv.auths == ["tester"] and "uname -sm" in srv.commands
        assert proc.returncode == 1 and "n1: os: n1 runs uname -sm" in proc.stdout


def test_only_setup_writes_a_pin() -> None:
    """No module but :mod:`higgsfield.control.provision.trust` (what setup runs) calls ``PinnedHosts.pin``."""
    import ast

    callers = set()
    for path in (REPO / "higgsfield").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pin":
                callers.add(str(path.relative_to(REPO)))
    assert callers == {"higgsfield/control/provision/trust.py"}
