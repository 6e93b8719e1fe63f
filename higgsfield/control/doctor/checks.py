"""``higgsfield doctor``: a read-only preflight of every node, in parallel, in seconds.

Per node: reachable over SSH, host key pinned and matching, passwordless sudo, Docker
usable by the login user, GPUs (count, driver, CUDA) or none, free disk where images
and checkpoints go, clock skew against this machine, the invoker at this version, the
project environment that ``runtime: process`` runs in (present / stale / missing); and
across nodes: node 0 reachable from the others on the rendezvous port range (node 0
listens briefly on a free port there, the others connect).

Nothing on a node is changed and no host key is pinned: a node that is not pinned, or
whose key changed, is refused before authentication and reported with the key it
offers (``higgsfield setup`` pins it; ``setup --repin`` re-pins it), and no check runs
there, since its identity is unverified. Every problem comes with the command that fixes it.

A node costs two SSH sessions, whatever the checks: one probe asks it every read-only
command at once and measures its clock (:mod:`higgsfield.control.remote.probe`), and one more
listens (node 0) or connects (the others) for the rendezvous check, which runs
meanwhile. Each check is a function of the probe's answers.

A Slurm cluster's login node (``diagnose(cfg.on_login_node())``) gets the checks that
mean something there: the clock, the invoker and the project environment in the
workdir, and Slurm's own view (:mod:`higgsfield.control.backends.slurm.preflight`): the commands, the
partition with its nodes, idle nodes and GPUs from sinfo, and a run's job accepted.

Use::

    report = await diagnose(cfg)
    report.ok, report.problems(), report.to_dict()
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import higgsfield
from higgsfield.contract.errors import ConnectError, HiggsfieldError, HostKeyError, HostNotPinnedError
from higgsfield.contract.ports import RENDEZVOUS_PORTS
from higgsfield.contract.units import human_bytes
from higgsfield.control.backends.slurm import SlurmSettings
from higgsfield.control.backends.slurm import preflight as pf
from higgsfield.control.remote.base import CommandResult, Transport
from higgsfield.control.remote.fanout import Group, Member, NodeResult, select_nodes
from higgsfield.control.remote.invoker import invoker_argv, invoker_bin
from higgsfield.control.remote.probe import Clock, Read, probe

if TYPE_CHECKING:
    from higgsfield.control.config import Config, NodeConfig

MIN_FREE_GIB = 10.0
MIN_FREE_FRACTION = 0.10   # of the filesystem under the state dir or the checkpoints: below, prune
MAX_SKEW_S = 2.0
COMMAND_TIMEOUT_S = 20.0

_LISTEN = """\
import socket, sys, time
lo, hi, wait, want = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
for port in range(lo, hi + 1):
    s = socket.socket()
    try:
        s.bind(("", port))
        break
    except OSError:
        s.close()
else:
    print("none", flush=True)
    sys.exit(3)
s.listen(64)
s.settimeout(0.2)
print(port, flush=True)
end, got = time.monotonic() + wait, 0
while got < want and time.monotonic() < end:
    try:
        c, _ = s.accept()
        c.close()
        got += 1
    except socket.timeout:
        pass
print("accepted", got, flush=True)
"""
SUDO_OK = ("sudo", "-n", "true")
DOCKER_INFO = ("docker", "info", "--format", "{{json .}}")  # one call: the version and the runtimes
GPU_QUERY = ("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
SMI = ("nvidia-smi",)
DF_HOME = ("df", "-Pk", ".")
DF_IMAGES = ("sh", "-c", 'd=$(docker info --format "{{.DockerRootDir}}" 2>/dev/null) && [ -n "$d" ] && df -Pk "$d"')

_CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])).close()"


@dataclass
class Probe:
    """One check on one node."""

    ok: bool
    summary: str
    problem: str | None = None
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeDiagnosis:
    node: str
    rank: int
    checks: dict[str, Probe] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return [f"{self.node}: {name}: {p.problem}" + (f" -> fix: {p.fix}" if p.fix else "")
                for name, p in self.checks.items() if not p.ok and p.problem]


@dataclass
class DoctorReport:
    nodes: list[NodeDiagnosis]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(p.ok for n in self.nodes for p in n.checks.values())

    def problems(self) -> list[str]:
        return [p for n in self.nodes for p in n.problems]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "version": higgsfield.__version__,
                "nodes": [{"node": n.node, "rank": n.rank, "checks": {k: asdict(v) for k, v in n.checks.items()}}
                          for n in self.nodes],
                "problems": self.problems()}


@dataclass
class Facts:
    """What one node answered: the probe's results by argv, its login's uid, its clock."""

    node: str
    answers: dict[tuple[str, ...], CommandResult] = field(default_factory=dict)
    uid: int | None = None
    clock: Clock | None = None

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        got = self.answers.get(tuple(argv))
        return got if got is not None else CommandResult(self.node, tuple(argv), 127, "", "not asked")


def reads(cfg: Config, node: NodeConfig) -> list[tuple[str, ...]]:
    """Every command the checks read on ``node``."""
    env = _env_argv(cfg, node)
    if cfg.slurm is not None:  # a cluster's login node: Slurm's view instead of sudo, Docker and local GPUs
        return [_version_argv(cfg, node), _usage_argv(cfg, node), *([env] if env else []), *_slurm_reads(cfg)]
    out = [SUDO_OK, DOCKER_INFO, GPU_QUERY, SMI, DF_HOME, DF_IMAGES, _version_argv(cfg, node), _usage_argv(cfg, node)]
    return out + ([env] if env else [])


def _slurm_reads(cfg: Config) -> list[tuple[str, ...]]:
    s = _slurm_settings(cfg)
    return [pf.WHICH, pf.SINFO, pf.test_only_argv(s)]


def _slurm_settings(cfg: Config) -> SlurmSettings:
    assert cfg.slurm is not None
    return SlurmSettings.from_mapping(cfg.slurm.model_dump(exclude_none=True), "slurm")


def _slurm(cfg: Config, f: Facts, d: NodeDiagnosis) -> None:
    """The commands, the partition (its nodes, idle ones, GPUs from sinfo), and a run's job accepted."""
    s = _slurm_settings(cfg)
    found = pf.commands(f(pf.WHICH).stdout)
    d.checks["slurm"] = Probe(found.ok, found.summary, found.problem, found.fix)
    if not found.ok:
        return
    parts = pf.parse_sinfo(f(pf.SINFO).stdout)
    part = pf.partition(s, parts)
    d.checks["partition"] = Probe(part.ok, part.summary, part.problem, part.fix,
                                  {"partitions": [asdict(p) for p in parts]})
    test = f(pf.test_only_argv(s))
    sub = pf.submit(s, test.ok, test.stdout, test.stderr)
    d.checks["account"] = Probe(sub.ok, sub.summary, sub.problem, sub.fix)


async def diagnose(cfg: Config, nodes: Sequence[str] | None = None) -> DoctorReport:
    """Check the chosen nodes (default: all) concurrently; never raises for a node's problem."""
    start = time.monotonic()
    group = Group.of(cfg, select_nodes(cfg, names=nodes or ()))  # verify host keys, never pin
    diags = {m.name: NodeDiagnosis(m.name, cfg.nodes.index(m.node)) for m in group.members}
    try:
        connected = await group.run(lambda m: _connect(cfg, m, diags[m.name]))
        up = Group([m for m, r in zip(group.members, connected, strict=True) if r.value])
        checked, _ = await asyncio.gather(up.run(lambda m: _check_node(cfg, m, diags[m.name])),
                                          _rendezvous(cfg, group, up, diags))
        results: list[NodeResult[Any]] = [*connected, *checked]
        for r in (r for r in results if not r.ok):  # the connection was lost, or a bug: that node's one problem
            diags[r.node].checks["ssh"] = Probe(False, "error", f"the checks could not run: {r.reason}")
    finally:
        await group.close()
    return DoctorReport(list(diags.values()), time.monotonic() - start)


async def _run(t: Transport, argv: Sequence[str]) -> CommandResult:
    return await t.run(argv, check=False, timeout=COMMAND_TIMEOUT_S)


async def _check_node(cfg: Config, m: Member, d: NodeDiagnosis) -> None:
    p = await probe(m.transport, [Read(a, timeout=COMMAND_TIMEOUT_S) for a in reads(cfg, m.node)], clock=True,
                    timeout=COMMAND_TIMEOUT_S + 10)
    if p.error is not None:  # every check reads the probe's answers: without python3 none can run
        d.checks["ssh"] = Probe(False, "no python3", f"cannot probe the node: {p.error}",
                                "install python3 on the node (higgsfield setup --step invoker does)")
        return
    facts = Facts(m.name, {r.argv: a for r, a in p.answers.items()}, p.uid, p.clock)
    if cfg.slurm is not None:
        d.checks["clock"] = _clock(facts.clock)
        d.checks["invoker"] = _invoker(cfg, m.node, facts)
        d.checks["environment"] = _environment(cfg, m.node, facts)
        d.checks["usage"] = _usage(cfg, m.node, facts)
        _slurm(cfg, facts, d)
        return
    d.checks["sudo"] = _sudo(facts)
    d.checks["docker"] = _docker(facts)
    d.checks["gpus"] = _gpus(facts)
    d.checks["disk"] = _disk(facts)
    d.checks["clock"] = _clock(facts.clock)
    d.checks["invoker"] = _invoker(cfg, m.node, facts)
    d.checks["environment"] = _environment(cfg, m.node, facts)
    d.checks["usage"] = _usage(cfg, m.node, facts)


async def _connect(cfg: Config, m: Member, d: NodeDiagnosis) -> bool:
    node, t = m.node, m.transport
    if node.is_local:
        d.checks["ssh"] = Probe(True, "local")
        d.checks["host key"] = Probe(True, "-")
        return True
    port = cfg.node_port(node)
    start = time.monotonic()
    try:
        await t.connect()
    except HostNotPinnedError as e:
        d.checks["ssh"] = Probe(True, "reachable")
        d.checks["host key"] = Probe(False, "not pinned", e.reason,
                                     "higgsfield setup (it shows the fingerprint and asks before pinning), "
                                     "then commit the known_hosts file")
        return False
    except HostKeyError as e:
        d.checks["ssh"] = Probe(True, "reachable")
        d.checks["host key"] = Probe(False, "CHANGED", e.reason)  # the reason names the re-pin command
        return False
    except ConnectError as e:
        d.checks["ssh"] = Probe(False, "unreachable", e.reason,
                                f"check that the node is up and sshd listens on {node.host}:{port}; "
                                "ssh.user / identity_file in higgsfield.yml")
        return False
    d.checks["ssh"] = Probe(True, f"ok {time.monotonic() - start:.2f}s")
    # connected: the transport accepts pinned keys only
    d.checks["host key"] = Probe(True, "matches", data={"fingerprint": t.fingerprint})
    return True


def _json(r: CommandResult) -> dict[str, Any]:
    try:
        got = json.loads(r.stdout) if r.ok else {}
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def _sudo(f: Facts) -> Probe:
    if f.uid == 0:
        return Probe(True, "root")
    r = f(SUDO_OK)
    if r.ok:
        return Probe(True, "passwordless")
    why = (r.stderr.strip().splitlines() or ["sudo failed"])[-1]
    return Probe(False, "asks password" if "password" in why else "no", f"passwordless sudo is required ({why})",
                 "on the node: echo \"$USER ALL=(ALL) NOPASSWD:ALL\" | sudo tee /etc/sudoers.d/$USER")


def _docker(f: Facts) -> Probe:
    r = f(DOCKER_INFO)
    version = str(_json(r).get("ServerVersion") or "")
    if r.ok and version:
        return Probe(True, version, data={"version": version})
    err = r.stderr.strip().lower()
    if r.exit_status == 127:
        return Probe(False, "missing", "docker is not installed", "higgsfield setup --step docker")
    if "permission denied" in err:
        return Probe(False, "no access", "the login user cannot use docker (not in the docker group)",
                     "higgsfield setup --step docker-group")
    return Probe(False, "down", f"the docker engine does not answer: {r.stderr.strip()[-200:]}",
                 "higgsfield setup --step docker (or: sudo systemctl start docker)")


def _gpus(f: Facts) -> Probe:
    r = f(GPU_QUERY)
    rows = [[c.strip() for c in ln.split(",")] for ln in r.stdout.splitlines() if ln.strip()] if r.ok else []
    if not rows:
        return Probe(True, "none", data={"count": 0})
    m = re.search(r"CUDA Version:\s*([\d.]+)", f(SMI).stdout)
    cuda = m.group(1) if m else None
    data = {"count": len(rows), "names": [r[0] for r in rows], "driver": rows[0][1] if len(rows[0]) > 1 else None,
            "cuda": cuda, "memory": [r[2] for r in rows if len(r) > 2]}
    summary = f"{len(rows)} x {rows[0][0]}, driver {data['driver']}, CUDA {cuda or '?'}"
    info = f(DOCKER_INFO)
    if info.ok and "nvidia" not in (_json(info).get("Runtimes") or {}):
        return Probe(False, summary, "docker has no nvidia runtime: containers will not see the GPUs",
                     "higgsfield setup --step nvidia", data)
    return Probe(True, summary, data=data)


def _disk(f: Facts) -> Probe:
    free: dict[str, float] = {}
    for what, argv in (("checkpoints", DF_HOME), ("images", DF_IMAGES)):
        r = f(argv)
        lines = r.stdout.strip().splitlines()
        if r.ok and len(lines) >= 2:
            free[what] = int(lines[-1].split()[3]) / 1024 / 1024
    if not free:
        return Probe(False, "?", "cannot read free disk space (df failed)")
    summary = ", ".join(f"{k} {v:.0f} GiB" for k, v in free.items())
    low = [k for k, v in free.items() if v < MIN_FREE_GIB]
    if low:
        return Probe(False, summary, f"less than {MIN_FREE_GIB:g} GiB free for {', '.join(low)}",
                     "free space (docker system prune; old checkpoints under ~/.cache/higgsfield)",
                     {"free_gib": free})
    return Probe(True, summary, data={"free_gib": free})


def _clock(clock: Clock | None) -> Probe:
    """The node's clock against this one's; the skew's uncertainty is half the exchange's round trip."""
    if clock is None:
        return Probe(False, "?", "cannot read the node's clock")
    skew = clock.skew_s
    data = {"skew_s": round(skew, 3), "rtt_s": round(clock.rtt_s, 3)}
    if abs(skew) > MAX_SKEW_S + clock.rtt_s / 2:
        return Probe(False, f"{skew:+.1f}s", f"clock is {skew:+.1f}s off this machine's",
                     "enable time sync on the node: sudo timedatectl set-ntp true", data)
    return Probe(True, f"{skew:+.2f}s", data=data)


def _version_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...]:
    return (*invoker_bin(cfg, node), "--version")


def _invoker(cfg: Config, node: NodeConfig, f: Facts) -> Probe:
    r = f(_version_argv(cfg, node))
    m = re.search(r"version\s+(\S+)", r.stdout) if r.ok else None
    if m is None:
        return Probe(False, "missing", "the invoker is not installed", "higgsfield setup --step invoker")
    if m.group(1) != higgsfield.__version__:
        return Probe(False, m.group(1), f"invoker {m.group(1)} differs from this higgsfield "
                     f"{higgsfield.__version__}", "higgsfield setup --step invoker", {"version": m.group(1)})
    return Probe(True, m.group(1), data={"version": m.group(1)})


def _usage_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...]:
    return (*invoker_argv(cfg, node), "usage", "--project", cfg.name)


def _usage(cfg: Config, node: NodeConfig, f: Facts) -> Probe:
    """The state dir's and the checkpoints' bytes, and the free space where they are: below
    MIN_FREE_FRACTION free, the fix is ``higgsfield prune`` (retention: makes deploy do it)."""
    r = f(_usage_argv(cfg, node))
    got = _json(r)
    free = [e for e in got.get("free") or [] if isinstance(e, dict)] if isinstance(got.get("free"), list) else []
    if not isinstance(got.get("state_bytes"), int) or not free:
        why = (r.stderr.strip().splitlines() or ["no answer"])[-1]
        return Probe(False, "?", f"cannot read the state dir's disk usage ({why})", "higgsfield setup --step invoker")
    data = {k: got.get(k) for k in ("state_dir", "state_bytes", "checkpoint_bytes", "free")}
    gib = 1024 ** 3
    low = [e for e in free if int(e.get("total_bytes") or 0) > 0
           and int(e.get("free_bytes") or 0) < MIN_FREE_FRACTION * int(e["total_bytes"])]
    least = min(free, key=lambda e: int(e.get("free_bytes") or 0))
    ckpt = int(got.get("checkpoint_bytes") or 0)
    summary = (f"state {human_bytes(got['state_bytes'])}, checkpoints {human_bytes(ckpt)}, "
               f"{human_bytes(int(least.get('free_bytes') or 0))} free")
    if low:
        where = ", ".join(f"{e.get('what')} ({e.get('path')}: {int(e.get('free_bytes') or 0) / gib:.1f} of "
                          f"{int(e.get('total_bytes') or 0) / gib:.0f} GiB)" for e in low)
        return Probe(False, summary, f"less than {MIN_FREE_FRACTION:.0%} free for {where}",
                     "higgsfield prune --dry-run, then higgsfield prune (set retention: so deploy prunes)", data)
    return Probe(True, summary, data=data)


def _env_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...] | None:
    if cfg.runtime == "docker":
        return None
    argv = [*invoker_argv(cfg, node), "env", "--project", cfg.name, "--check"]
    if node.is_local:
        argv += ["--code-dir", str(cfg.project_dir)]
    return tuple(argv)


def _environment(cfg: Config, node: NodeConfig, f: Facts) -> Probe:
    """The project environment of ``runtime: process`` (built by deploy): present, stale or missing."""
    argv = _env_argv(cfg, node)
    if argv is None:
        return Probe(True, "not used (runtime: docker)")
    r = f(argv)
    try:
        st = json.loads(r.stdout) if r.ok else None
    except ValueError:
        st = None
    if not isinstance(st, dict) or "state" not in st:
        why = (r.stderr.strip().splitlines() or ["no answer"])[-1]
        return Probe(False, "?", f"cannot read the project environment ({why})", "higgsfield setup --step invoker")
    state = str(st["state"])
    data = {k: st.get(k) for k in ("state", "key", "wanted", "python", "torch")}
    if state == "present":
        return Probe(True, f"present {st.get('key')}, torch {st.get('torch') or '?'}", data=data)
    # runtime auto uses it only where no image runs; there a missing environment is not (yet) a problem
    ok = cfg.runtime == "auto"
    if state == "stale":
        return Probe(ok, f"stale {st.get('key')}", "the project environment was built for another "
                     "requirements.txt than the deployed one", "higgsfield deploy", data)
    return Probe(ok, "missing", "no project environment for runtime: process (a venv with torch and "
                 "requirements.txt)", "higgsfield deploy", data)


async def _rendezvous(cfg: Config, chosen: Group, up: Group, diags: dict[str, NodeDiagnosis]) -> None:
    """Node 0 listens on a free port of the rendezvous range; every other reachable node connects to it."""
    master = cfg.nodes[0]
    mname = str(master.name)
    listening = next((m for m in up.members if m.node is master), None)
    others = [m for m in up.members if m.node is not master]
    lo, hi = RENDEZVOUS_PORTS
    if not others:
        return
    if listening is None:
        chose_master = any(m.node is master for m in chosen.members)
        for m in others:
            diags[m.name].checks["rendezvous"] = Probe(True, "node 0 down" if chose_master else "-")
        return
    if master.is_local and any(not m.node.is_local for m in others):
        for m in others:
            diags[m.name].checks["rendezvous"] = Probe(
                False, "localhost", "node 0 is 'localhost', which other machines cannot reach",
                "list node 0 by an address the other nodes can reach")
        return
    listener = listening.transport.stream(["python3", "-c", _LISTEN, str(lo), str(hi), "10", str(len(others))])
    try:
        first = await asyncio.wait_for(listener.__anext__(), COMMAND_TIMEOUT_S)
        if not first.isdigit():
            diags[mname].checks["rendezvous"] = Probe(False, "no port", f"no free port in {lo}-{hi} on node 0",
                                                      "free a port in the range (stale runs?)")
            return
        port = int(first)

        async def connect(m: Member) -> Probe:
            r = await _run(m.transport, ["python3", "-c", _CONNECT, master.host, str(port), "3"])
            if r.ok:
                return Probe(True, f"{master.host}:{port} ok")
            why = (r.stderr.strip().splitlines() or ["failed"])[-1]
            return Probe(False, "blocked", f"cannot reach node 0 at {master.host}:{port} ({why})",
                         f"allow TCP {lo}-{hi} from the other nodes to {master.host} (firewall / security group)")

        for r in await Group(others).run(connect):
            diags[r.node].checks["rendezvous"] = r.value if r.value is not None else Probe(False, "error", r.reason)
        diags[mname].checks["rendezvous"] = Probe(True, f"listens :{port}")
    except (HiggsfieldError, asyncio.TimeoutError, StopAsyncIteration) as e:
        diags[mname].checks["rendezvous"] = Probe(False, "error", f"cannot listen on node 0: {e}")
    finally:
        await listener.aclose()  # type: ignore[attr-defined]
