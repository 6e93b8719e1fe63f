"""The real test bed, as seen from tests: sshd hosts, a Docker engine, the base image.

The implementation is the package scripts/testbed/hftestbed/ (stdlib only, also a CLI:
`python3 scripts/testbed/testbed.py up|down|status|...`); this module loads it
and wraps it in a small API for tests:

    tb = ensure_testbed(hosts=4, docker=True, image=True)   # idempotent, needs root
    h = tb.hosts[0]              # Host: name, address, port, user, home, host_pubkey, ...
    tb.client_key                # the "laptop" private key, authorized on every host
    tb.known_hosts               # file pinned with the real host keys (kept current)
    tb.known_hosts_line(h)       # "[127.0.0.2]:2222 ssh-ed25519 AAAA..."
    tb.ssh_argv(h, "id -un")     # ssh argv with host-key checking on
    tb.ssh(h, "sudo -n true")    # run it -> CompletedProcess
    tb.stop_host(h) / tb.start_host(h) / tb.rekey_host(h)     # fault injection
    tb.add_to_docker_group(h) / tb.remove_from_docker_group(h)
    tb.docker_socket, tb.docker_host, tb.base_image

Host i is unix user hfnode{i} with its own sshd on 127.0.0.{i+2}:2222 (host 0 is
127.0.0.2, the natural torchrun master). Node users start outside the docker
group: provisioning is what adds them. Pytest fixtures are in conftest.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
IMPL_PATH = REPO_ROOT / "scripts" / "testbed" / "hftestbed"


def _load_impl():
    name = "_higgsfield_testbed_impl"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, IMPL_PATH / "__init__.py",
                                                  submodule_search_locations=[str(IMPL_PATH)])
    assert spec and spec.loader, IMPL_PATH
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its modules import each other through it; dataclasses look it up
    spec.loader.exec_module(mod)
    return mod


impl = _load_impl()


def bench_bed():
    """bench/_bed.py (the benches' delayed hosts hfnode30+, under their own lock), loaded once by path."""
    name = "_hf_bench_bed"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / "_bed.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

Host = impl.Host
TestbedError = impl.TestbedError
BASE_IMAGE: str = impl.BASE_IMAGE  # higgsfield-testbase:torch2.13 (torch 2.13.0 CPU in /opt/venv)
BOOTSTRAP_IMAGE: str = impl.BOOTSTRAP_IMAGE  # higgsfield-testbase:bookworm (debootstrap only)
TORCH_VERSION: str = impl.TORCH_VERSION
DOCKER_SOCKET: str = impl.DOCKER_SOCKET
DEFAULT_PORT: int = impl.DEFAULT_PORT
exe = impl.exe  # absolute path of a program on PATH: exe("docker"), exe("ssh")


class TestbedUnavailable(Exception):
    """The test bed cannot run here at all (not root, disabled); tests should skip."""

    __test__ = False  # not a pytest test class


@dataclasses.dataclass
class Testbed:
    state_dir: Path
    hosts: list[Host]
    client_key: Path  # private key of the "laptop" identity (public key: client_key + ".pub")
    known_hosts: Path  # known_hosts pinned with every host's real key; updated by rekey_host
    ssh_config: Path  # `ssh -F ssh_config hfnode0` works (aliases = host names)
    docker: bool  # dockerd was ensured
    base_image: str | None  # None unless the image was ensured

    __test__ = False

    # ---- description -------------------------------------------------------

    @property
    def client_pubkey(self) -> str:
        return Path(str(self.client_key) + ".pub").read_text().strip()

    @property
    def docker_socket(self) -> str | None:
        return DOCKER_SOCKET if self.docker else None

    @property
    def docker_host(self) -> str | None:
        """DOCKER_HOST value for the engine (unix:///var/run/docker.sock)."""
        return f"unix://{DOCKER_SOCKET}" if self.docker else None

    def host(self, ref: Host | int | str) -> Host:
        """A Host by Host, index, name (hfnode1) or address (127.0.0.3)."""
        if isinstance(ref, impl.Host):
            return ref
        for h in self.hosts:
            if ref in (h.index, h.name, h.address):
                return h
        raise KeyError(f"no test host {ref!r}")

    def known_hosts_line(self, host: Host | int | str) -> str:
        return impl.known_hosts_line(self.host(host))

    def write_known_hosts(self, path: os.PathLike | str, hosts: Sequence | None = None) -> Path:
        """Write a known_hosts file pinned with the hosts' current keys (default: all)."""
        path = Path(path)
        hs = [self.host(h) for h in hosts] if hosts is not None else self.hosts
        path.write_text("".join(self.known_hosts_line(h) + "\n" for h in hs))
        return path

    def docker_env(self, base: dict | None = None) -> dict:
        """Environment for docker CLI / docker-py pointing at the test engine."""
        env = dict(os.environ if base is None else base)
        env.pop("DOCKER_CONTEXT", None)
        env["DOCKER_HOST"] = f"unix://{DOCKER_SOCKET}"
        return env

    # ---- ssh -----------------------------------------------------------------

    def ssh_argv(self, host: Host | int | str, *command: str,
                 known_hosts: os.PathLike | str | None = None,
                 options: Sequence[str] = ()) -> list[str]:
        """ssh argv for the laptop identity; host-key checking stays strict."""
        h = self.host(host)
        impl._check_loopback(h.address)
        argv = [
            exe("ssh"), "-F", "/dev/null",
            "-i", str(self.client_key),
            "-o", "IdentitiesOnly=yes",
            "-o", "IdentityAgent=none",
            "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "UpdateHostKeys=no",
            "-o", "ConnectTimeout=10",
            "-p", str(h.port),
            *options,
            f"{h.user}@{h.address}",
        ]
        if command:
            argv += ["--", *command]
        return argv

    def ssh(self, host: Host | int | str, command: str, *, check: bool = False,
            timeout: float = 120, input: str | None = None,
            known_hosts: os.PathLike | str | None = None) -> subprocess.CompletedProcess:
        """Run a shell command on a host over real SSH; returns text output."""
        p = subprocess.run(self.ssh_argv(host, command, known_hosts=known_hosts),
                           capture_output=True, text=True, timeout=timeout, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise TestbedError(f"ssh {self.host(host).name} {command!r} -> rc {p.returncode}\n"
                               f"stdout: {p.stdout}\nstderr: {p.stderr}")
        return p

    # ---- fault injection and state changes ---------------------------------

    def host_running(self, host: Host | int | str) -> bool:
        return impl.host_running(self.host(host))

    def stop_host(self, host: Host | int | str, kill_sessions: bool = False) -> bool:
        """Stop the host's sshd (connections are refused). True if it was running."""
        return impl.stop_host(self.host(host), kill_sessions=kill_sessions)

    def start_host(self, host: Host | int | str) -> int:
        """Start the host's sshd if needed; returns its pid."""
        return impl.start_host(self.host(host))

    def rekey_host(self, host: Host | int | str) -> str:
        """Restart the host's sshd with a new host key; self.known_hosts follows.

        Copy a known_hosts first (write_known_hosts) to see the mismatch a user
        would. Returns the new public key ("ssh-ed25519 AAAA... comment")."""
        return impl.rekey_host(self.host(host))

    def host_key(self, host: Host | int | str) -> tuple[bytes, str]:
        """(private key bytes, public key line) of the host, e.g. to restore later."""
        h = self.host(host)
        return h.host_key.read_bytes(), h.host_pubkey.read_text().strip()

    def set_host_key(self, host: Host | int | str, key: tuple[bytes, str]) -> None:
        impl.set_host_key(self.host(host), key[0], key[1])

    @contextlib.contextmanager
    def host_stopped(self, host: Host | int | str, kill_sessions: bool = False) -> Iterator[Host]:
        """with tb.host_stopped(1): ...  (sshd restarted afterwards)"""
        h = self.host(host)
        was = self.stop_host(h, kill_sessions=kill_sessions)
        try:
            yield h
        finally:
            if was:
                self.start_host(h)

    @contextlib.contextmanager
    def host_rekeyed(self, host: Host | int | str) -> Iterator[str]:
        """with tb.host_rekeyed(2) as new_pub: ...  (old key restored afterwards)"""
        saved = self.host_key(host)
        try:
            yield self.rekey_host(host)
        finally:
            self.set_host_key(host, saved)

    def in_docker_group(self, host: Host | int | str) -> bool:
        return impl.in_docker_group(self.host(host).user)

    def add_to_docker_group(self, host: Host | int | str) -> None:
        """Give the node user the engine directly (SSH logins after this see it)."""
        impl.add_to_docker_group(self.host(host))

    def remove_from_docker_group(self, host: Host | int | str) -> None:
        impl.remove_from_docker_group(self.host(host))

    def reset_home(self, host: Host | int | str) -> None:
        """Empty the node's home (back to /etc/skel), keeping authorized_keys."""
        impl.reset_home(self.host(host))


def check_available() -> None:
    """Raise TestbedUnavailable when the bed cannot run here (so tests skip)."""
    if os.environ.get("TESTBED_SKIP", "").lower() in ("1", "true", "yes"):
        raise TestbedUnavailable("TESTBED_SKIP is set")
    if not sys.platform.startswith("linux"):
        raise TestbedUnavailable("the test bed needs Linux")
    if os.geteuid() != 0:
        raise TestbedUnavailable("the test bed needs root (users, sshd daemons, dockerd)")


def ensure_testbed(hosts: int | None = None, docker: bool = True, image: bool = True,
                   reset_docker_group: bool = False,
                   reset_homes: bool = False) -> Testbed:
    """Bring the bed up (idempotent) and describe it.

    hosts: number of sshd hosts (default $TESTBED_HOSTS or 4).
    docker: ensure dockerd; image: also ensure the base image (implies docker).
    reset_docker_group: take the node users out of the docker group. Off by
      default: a session fixture must not undo, mid-session, what another
      fixture set up. `testbed.py up` (run by `make test` before pytest) resets
      it, so a session starts from the real "not provisioned" state.
    reset_homes: empty the node users' homes (same caveat).
    """
    check_available()
    docker = docker or image
    timings = impl.up(hosts=hosts, docker=docker, image=image, reset_homes=reset_homes,
                      reset_docker_group=reset_docker_group)
    sys.stderr.write("[testbed] phase timings:\n" + timings.report() + "\n")
    return describe(hosts=hosts, docker=docker, image=image)


def describe(hosts: int | None = None, docker: bool = True, image: bool = True) -> Testbed:
    """The Testbed object for the current state dir, without changing anything."""
    sdir = impl.state_dir()
    n = impl.host_count(hosts)
    hs = [impl.make_host(i, sdir) for i in range(n)]
    return Testbed(
        state_dir=sdir,
        hosts=hs,
        client_key=sdir / "client" / "id_ed25519",
        known_hosts=sdir / "known_hosts",
        ssh_config=sdir / "ssh_config",
        docker=docker or image,
        base_image=BASE_IMAGE if image else None,
    )


#: Beside the invoker's own dependencies: what a process-runtime run needs from its interpreter. A bed project
#: that never built its environment (most do not: a build costs minutes of the suite) runs in the invoker's
#: interpreter, so it holds what ``deploy`` would put in that environment: torch, and numpy, which the training
#: library needs (``env_key.LIBRARY_NEEDS``: torch.distributed's object collectives).
NODE_VENV_EXTRA = ("torch==2.13.0", "numpy")


def shared_node_venv(state_dir: Path, system_python: str = "/usr/bin/python3") -> Path:
    """The bed's one venv for every node user (tests/runs and tests/slurm): editable higgsfield, its deps, torch, numpy.

    Kept between sessions on a machine that keeps the bed; rebuilt when pyproject.toml changes or the
    checkout moves (the stamp holds both), so an added dependency reaches the nodes' invoker as `setup`
    would bring it to real nodes, and a second clone's suite runs its own code there.
    """
    import fcntl

    venv = state_dir / "runs-invoker-venv"
    # `make test` runs tests/slurm beside the rest: both may want the venv first. The state dir's own
    # lock is not taken: a build holding it would stall the other suite's host stops and starts.
    with open(state_dir / ".venv-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build_node_venv(venv, system_python)
    return venv


def _build_node_venv(venv: Path, system_python: str) -> None:
    import hashlib
    import shutil

    stamp = venv / ".ready"
    want = hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes() + str(REPO_ROOT).encode()
                          + " ".join(NODE_VENV_EXTRA).encode()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want and (venv / "bin" / "higgsfield").exists():
        return
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([system_python, "-m", "venv", str(venv)], check=True)
    # The machine's own pip configuration (its index and wheel cache): the bed's image wheels are only
    # downloaded when the image is built, and a cached image leaves a fresh checkout without them.
    pip = [str(venv / "bin" / "pip"), "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "setuptools>=64", "wheel"], check=True)  # PEP 660 editable installs
    subprocess.run([*pip, "--no-build-isolation", "-e", str(REPO_ROOT), *NODE_VENV_EXTRA], check=True)
    stamp.write_text(want + "\n")
    for p in [venv, *venv.rglob("*")]:
        if p.is_dir():
            p.chmod(p.stat().st_mode | 0o755)


def cpu_torch_requirements(state_dir: Path) -> str:
    """requirements.txt lines that give a node's project venv the CPU build of torch from this machine's disk.

    Node users have none of root's pip configuration, so a bare ``torch==X`` on a node resolves to
    PyPI's CUDA build: about 5 GiB per node venv, which filled a CI machine's disk. ``--find-links``
    names the bed's own wheel folder (the one the base image is built from: torch's CPU wheel, numpy
    and the rest, checked for CUDA wheels; downloaded here when a cached image left none), made
    readable by every node user. pip prefers ``X+cpu`` to ``X`` (a local version sorts after its
    public one). Inside a Docker build the folder is absent, pip only warns, and the base image's
    torch already satisfies the pin.
    """
    links = state_dir / "wheels"
    impl.wheels.download_wheels(links)   # a stamp makes it a no-op once done
    for p in [links, *links.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return f"--find-links {links}\ntorch=={impl.TORCH_VERSION}\n"
