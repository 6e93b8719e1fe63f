"""The checks: each one a function of a node's probe answers (:class:`~higgsfield.control.doctor.probe.Facts`).

Per node: passwordless sudo, Docker usable by the login user, GPUs (count, driver, CUDA) or
none, free disk where images and checkpoints go, clock skew against this machine, the invoker
at this version, the state dir's disk usage, the project environment that ``runtime: process``
runs in (present / stale / missing); on a Slurm cluster's login node, Slurm's own view
(:mod:`higgsfield.control.backends.slurm.preflight`). Each returns a
:class:`~higgsfield.control.doctor.report.Probe` whose problem names the command that fixes it.
Its own module because the checks are pure: they run no command, so they are tested against
canned answers.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import TYPE_CHECKING, TypeVar

import higgsfield
from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.replies import EnvReply
from higgsfield.contract.replies_disk import UsageReply
from higgsfield.contract.units import human_bytes
from higgsfield.control.backends.slurm import preflight as pf
from higgsfield.control.doctor.probe import (
    DF_HOME,
    DF_IMAGES,
    GPU_QUERY,
    SMI,
    SUDO_OK,
    Facts,
    _env_argv,
    _usage_argv,
    _version_argv,
)
from higgsfield.control.doctor.report import CheckName, NodeDiagnosis, Probe
from higgsfield.control.remote.base import CommandResult
from higgsfield.control.remote.docker_info import DOCKER_INFO, docker_info
from higgsfield.control.remote.probe import Clock

R = TypeVar("R")

if TYPE_CHECKING:
    from higgsfield.control.config import Config, NodeConfig
    from higgsfield.control.config.slurm import SlurmConfig

MIN_FREE_GIB = 10.0
MIN_FREE_FRACTION = 0.10   # of the filesystem under the state dir or the checkpoints: below, prune
MAX_SKEW_S = 2.0


def _slurm(s: SlurmConfig, f: Facts, d: NodeDiagnosis) -> None:
    """The commands, the partition (its nodes, idle ones, GPUs from sinfo), and a run's job accepted."""
    found = pf.commands(f(pf.WHICH).stdout)
    d.checks[CheckName.SLURM] = Probe(found.ok, found.summary, found.problem, found.fix)
    if not found.ok:
        return
    parts = pf.parse_sinfo(f(pf.SINFO).stdout)
    part = pf.partition(s, parts)
    d.checks[CheckName.PARTITION] = Probe(part.ok, part.summary, part.problem, part.fix,
                                  {"partitions": [asdict(p) for p in parts]})
    test = f(pf.test_only_argv(s))
    sub = pf.submit(s, test.ok, test.stdout, test.stderr)
    d.checks[CheckName.ACCOUNT] = Probe(sub.ok, sub.summary, sub.problem, sub.fix)


def _reply(r: CommandResult, reply: type[R]) -> tuple[R | None, str]:
    """An invoker verb's reply, decoded (None: it did not answer one), and why not in one line."""
    why = (r.stderr.strip().splitlines() or ["no answer"])[-1]
    if not r.ok:
        return None, why
    try:
        return decode(reply, json.loads(r.stdout)), why
    except ValueError as e:   # not JSON (the stderr says why), or a reply that does not decode (it says)
        return None, str(e) if isinstance(e, DecodeError) else why


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
    version = docker_info(r).ServerVersion
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
    if info.ok and not docker_info(info).nvidia:
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


def _invoker(cfg: Config, node: NodeConfig, f: Facts) -> Probe:
    r = f(_version_argv(cfg, node))
    m = re.search(r"version\s+(\S+)", r.stdout) if r.ok else None
    if m is None:
        return Probe(False, "missing", "the invoker is not installed", "higgsfield setup --step invoker")
    if m.group(1) != higgsfield.__version__:
        return Probe(False, m.group(1), f"invoker {m.group(1)} differs from this higgsfield "
                     f"{higgsfield.__version__}", "higgsfield setup --step invoker", {"version": m.group(1)})
    return Probe(True, m.group(1), data={"version": m.group(1)})


def _usage(cfg: Config, node: NodeConfig, f: Facts) -> Probe:
    """The state dir's and the checkpoints' bytes, and the free space where they are: below
    MIN_FREE_FRACTION free, the fix is ``higgsfield prune`` (retention: makes deploy do it)."""
    r = f(_usage_argv(cfg, node))
    got, why = _reply(r, UsageReply)
    if got is None or not got.free:
        return Probe(False, "?", f"cannot read the state dir's disk usage ({why})", "higgsfield setup --step invoker")
    data = {"state_dir": got.state_dir, "state_bytes": got.state_bytes, "checkpoint_bytes": got.checkpoint_bytes,
            "free": [encode(e) for e in got.free]}
    gib = 1024 ** 3
    low = [e for e in got.free if e.total_bytes > 0 and e.free_bytes < MIN_FREE_FRACTION * e.total_bytes]
    least = min(got.free, key=lambda e: e.free_bytes)
    summary = (f"state {human_bytes(got.state_bytes)}, checkpoints {human_bytes(got.checkpoint_bytes)}, "
               f"{human_bytes(least.free_bytes)} free")
    if low:
        where = ", ".join(f"{e.what} ({e.path}: {e.free_bytes / gib:.1f} of {e.total_bytes / gib:.0f} GiB)"
                          for e in low)
        return Probe(False, summary, f"less than {MIN_FREE_FRACTION:.0%} free for {where}",
                     "higgsfield prune --dry-run, then higgsfield prune (set retention: so deploy prunes)", data)
    return Probe(True, summary, data=data)


def _environment(cfg: Config, node: NodeConfig, f: Facts) -> Probe:
    """The project environment of ``runtime: process`` (built by deploy): present, stale or missing."""
    argv = _env_argv(cfg, node)
    if argv is None:
        return Probe(True, "not used (runtime: docker)")
    r = f(argv)
    st, why = _reply(r, EnvReply)
    if st is None or st.state is None:
        return Probe(False, "?", f"cannot read the project environment ({why})", "higgsfield setup --step invoker")
    state = st.state
    data = {"state": st.state, "key": st.key, "wanted": st.wanted, "python": st.python, "torch": st.torch}
    if state == "present":
        return Probe(True, f"present {st.key}, torch {st.torch or '?'}", data=data)
    # runtime auto uses it only where no image runs; there a missing environment is not (yet) a problem
    ok = cfg.runtime == "auto"
    if state == "stale":
        return Probe(ok, f"stale {st.key}", "the project environment was built for another "
                     "requirements.txt than the deployed one", "higgsfield deploy", data)
    return Probe(ok, "missing", "no project environment for runtime: process (a venv with torch and "
                 "requirements.txt)", "higgsfield deploy", data)
