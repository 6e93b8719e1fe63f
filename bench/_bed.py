"""Shared plumbing of the fan-out, launch and log-streaming benchmarks: the bench's own test-bed hosts.

The three scripts (``setup_fanout.py``, ``launch_latency.py``, ``log_stream.py``) drive
the real CLI (``higgsfield setup | doctor | deploy | run | logs``) against real sshd
hosts of the test bed (``scripts/testbed/testbed.py``). They use hosts 30..45 only
(users ``hfnode30..45`` on 127.0.0.32-47, port 2222), never 0..23, which other tests
share. Each script:

1. takes ``.testbed/bench.lock`` (one bench at a time: they share the hosts);
2. creates or starts its hosts, optionally with a per-command delay (sshd
   ``ForceCommand``: every SSH session sleeps, then runs its command; each session
   is logged in ``.testbed/sessions/hfnodeN.log``, which is how the sessions per node
   are counted);
3. writes a throw-away project in a temporary directory and runs the real
   ``higgsfield setup`` once (the first run applies what is missing), then measures;
4. stops its hosts' sshd at the end (users and homes stay, so the next bench run's
   first setup has little to do).

Needs root (it creates users and sshd daemons), like the test bed. Stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
FIRST_INDEX = 30
LAST_INDEX = 45  # inclusive: 16 hosts, 127.0.0.32-47


def load_testbed() -> ModuleType:
    """scripts/testbed/hftestbed/, the test bed package (one implementation for the CLI, the tests and the benches)."""
    name = "_higgsfield_testbed_impl"
    if name in sys.modules:
        return sys.modules[name]
    package = REPO / "scripts" / "testbed" / "hftestbed"
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its modules import each other through it; dataclasses look it up
    spec.loader.exec_module(mod)
    return mod


class BenchError(RuntimeError):
    """The bench cannot run here (not root, test bed down) or a command it drives failed."""


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def bench_hosts(count: int, *, delay: float | None = None, docker: bool = True) -> Iterator[list]:
    """Hosts 30..30+count-1 up (with ``delay`` per SSH session, or none), stopped again afterwards."""
    if os.geteuid() != 0:
        raise BenchError("the bench creates test-bed hosts (users, sshd): run it as root, after `make testbed`")
    if not 1 <= count <= LAST_INDEX - FIRST_INDEX + 1:
        raise BenchError(f"at most {LAST_INDEX - FIRST_INDEX + 1} bench hosts (indices {FIRST_INDEX}-{LAST_INDEX})")
    tb = load_testbed()
    sdir = tb.state_dir()
    if docker and not (tb.docker_answers(timeout=10) and tb.image_exists(tb.BASE_IMAGE)):
        raise BenchError(f"the test bed's dockerd or {tb.BASE_IMAGE} is missing: run `make testbed` first")
    sdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(sdir / "bench.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another bench holds .testbed/bench.lock; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        indices = list(range(FIRST_INDEX, FIRST_INDEX + count))
        t0 = time.monotonic()
        with tb.state_lock(sdir):
            hosts = tb.ensure_hosts(0, sdir, indices=indices, delay=delay, reset_docker_group=False)
        say(f"hosts {hosts[0].name}..{hosts[-1].name} up in {time.monotonic() - t0:.1f}s"
            + (f", every SSH session delayed {delay:g}s" if delay is not None else ""))
        try:
            yield hosts
        finally:
            with tb.state_lock(sdir):
                for h in hosts:
                    tb.stop_host(h, kill_sessions=True)
            say(f"stopped the sshd of {hosts[0].name}..{hosts[-1].name}")
    finally:
        os.close(fd)


def deploy_key_home() -> Path:
    """A HIGGSFIELD_HOME_CONFIG kept between bench runs: the same deploy key, so nodes keep theirs."""
    return load_testbed().state_dir() / "bench" / "home-config"


def ensure_deploy_key(project: str) -> None:
    key = deploy_key_home() / "keys" / project / "deploy_key"
    if key.is_file() and key.with_suffix(".pub").is_file():
        return
    key.parent.mkdir(parents=True, exist_ok=True)
    key.unlink(missing_ok=True)
    subprocess.run([shutil.which("ssh-keygen") or "ssh-keygen", "-q", "-t", "ed25519", "-N", "",  # noqa: S603
                    "-C", f"higgsfield-bench-{project}", "-f", str(key)], check=True)


@dataclass
class Result:
    """One CLI command's outcome and wall time."""

    argv: list[str]
    code: int
    out: str
    err: str
    seconds: float

    def tail(self, n: int = 15) -> str:
        return "\n".join((self.out + self.err).strip().splitlines()[-n:])


class Project:
    """A throw-away higgsfield project for the bench hosts (a git repository, so deploy works)."""

    def __init__(self, name: str, hosts: Sequence, *, runtime: str = "docker", nproc: int = 1,
                 sources: dict[str, str] | None = None, base_image: str | None = None,
                 requirements: str = "# nothing beyond the base image\n", extra_yaml: str = "") -> None:
        self.name = name
        self.extra_yaml = extra_yaml  # more top-level higgsfield.yml keys (checkpoint:, retention:), as YAML
        self.dir = Path(tempfile.mkdtemp(prefix=f"hf-{name}-"))
        self.runtime = runtime
        self.nproc = nproc
        self.base_image = base_image or load_testbed().BASE_IMAGE
        ensure_deploy_key(name)
        (self.dir / "src").mkdir()
        for fname, text in (sources or {}).items():
            (self.dir / "src" / fname).write_text(text)
        (self.dir / "Dockerfile").write_text(
            "# the bench project's image: the test bed's offline base (python, torch); the invoker is mounted\n"
            "ARG BASE_IMAGE=higgsfield-testbase:torch2.13\nFROM ${BASE_IMAGE}\n"
            "COPY requirements.txt /tmp/requirements.txt\nENV PYTHONUNBUFFERED=1\n")
        (self.dir / "requirements.txt").write_text(requirements)
        (self.dir / ".gitignore").write_text("env\n.higgsfield/\n")
        self.set_nodes(hosts)
        git = shutil.which("git") or "git"
        env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "bench project"]):
            subprocess.run([git, *args], cwd=self.dir, env=env, check=True, capture_output=True)  # noqa: S603

    def set_nodes(self, hosts: Sequence) -> None:
        """(Re)write higgsfield.yml listing ``hosts`` (node ranks in that order)."""
        tb = load_testbed()
        key = tb.state_dir() / "client" / "id_ed25519"
        nodes = "".join(f"  - host: {h.address}\n    name: {h.name}\n    user: {h.user}\n" for h in hosts)
        (self.dir / "higgsfield.yml").write_text(
            f"name: {self.name}\n"
            f"nodes:\n{nodes}"
            "ssh:\n"
            f"  port: {hosts[0].port}\n"
            f"  identity_file: {key}\n"
            "  connect_timeout: 10\n"
            "  retries: 1\n"
            f"nproc_per_node: {self.nproc}\n"
            f"runtime: {self.runtime}\n"
            "docker:\n"
            f"  base_image: {self.base_image}\n"
            + self.extra_yaml)
        self.hosts = list(hosts)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
        env.update(HIGGSFIELD_HOME_CONFIG=str(deploy_key_home()), COLUMNS="200", PYTHONUNBUFFERED="1",
                   NO_COLOR="1")
        return env

    def argv(self, *args: str) -> list[str]:
        """The console script a user runs (``higgsfield``), from this interpreter's venv."""
        script = Path(sys.executable).parent / "higgsfield"
        return [str(script), *args] if script.exists() else [sys.executable, "-m", "higgsfield", *args]

    def hf(self, *args: str, timeout: float = 600, check: bool = True) -> Result:
        argv = self.argv(*args)
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=self.dir, env=self.env(), capture_output=True, text=True,  # noqa: S603
                               timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"higgsfield {' '.join(args)} took over {timeout:g}s") from e
        r = Result(argv, p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)
        if check and r.code != 0:
            raise BenchError(f"higgsfield {' '.join(args)} exited {r.code}:\n{r.tail(30)}")
        return r

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), cwd=self.dir, env=self.env(), text=True,  # noqa: S603
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=1)

    def run_dir(self, host: object, run: str) -> Path:
        """The run's directory on a node (the default state_dir ``~/.higgsfield``), read as root."""
        return Path(host.home) / ".higgsfield" / "runs" / self.name / run  # type: ignore[attr-defined]

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def requirements_for(runtime: str) -> str:
    """requirements.txt of a bench project: nothing for Docker (the base image has torch); for plain
    processes, this machine's CPU torch wheel as a file.

    deploy builds a venv per node for ``runtime: process``, adding a bare ``torch`` when
    requirements.txt names none, and the node users' pip has no find-links: it would
    take PyPI's CUDA build (several GB per node; eight at once filled this machine's disk).
    """
    if runtime != "process":
        return "# nothing beyond the base image\n"
    tb = load_testbed()
    dirs = [d for d in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split() if d and "://" not in d]
    wheels = sorted(w for d in dirs for w in Path(d).glob(f"torch-{tb.TORCH_VERSION}*cpu*.whl"))
    if not wheels:
        raise BenchError(f"runtime process needs the CPU wheel of torch {tb.TORCH_VERSION} on this machine "
                         f"(looked in {', '.join(dirs)}): a bare torch would pull the multi-GB CUDA build on "
                         "every node")
    free_gib = shutil.disk_usage("/home").free / 2**30
    if free_gib < 20:
        raise BenchError(f"only {free_gib:.0f} GiB free under /home: a torch venv per node needs about 1 GiB each")
    return f"torch @ {wheels[0].resolve().as_uri()}\n"


def first_setup(project: Project, timeout: float = 1500) -> Result:
    """The real ``higgsfield setup`` on every node of the project (installs what is missing)."""
    say(f"higgsfield setup (first run) on {len(project.hosts)} node(s) ...")
    # A new node's host key is pinned only once the user accepts it; the bench knows the
    # bed's keys are its own (the test bed made them), as a user who checked them would.
    flags = ["--accept-new-host-keys"] if "--accept-new-host-keys" in project.hf("setup", "--help").out else []
    r = project.hf("setup", *flags, timeout=timeout)
    say(f"first setup: {r.seconds:.1f}s")
    return r


def session_count(host: object) -> int:
    """SSH sessions the host's ForceCommand wrapper has logged so far."""
    path = load_testbed().session_log(host)
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def session_commands(host: object, since: int) -> list[str]:
    """The commands of the host's sessions after the first ``since`` (for the profile)."""
    path = load_testbed().session_log(host)
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        lines = f.read().splitlines()[since:]
        return [ln.split(" ", 1)[1] if " " in ln else ln for ln in lines]
    return []


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank (no interpolation past the data)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(round(q * len(s) + 0.5)) - 1))
    return s[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table (also valid Markdown), columns padded."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    fmt.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(fmt)


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"
