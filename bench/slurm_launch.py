"""Slurm launch: from submit to every rank started on an idle 2-node allocation, against a hand-written sbatch.

Both jobs do the same: 2 nodes, one ``srun`` task per node, torchrun with the c10d
rendezvous on the allocation's first node, 2 ranks per node, each rank printing
``rank-started <time.time()>`` as its first act (no torch work: the time is what launching
costs). Both are submitted through the login node (test-bed host hfnode21) over SSH:

- higgsfield: a fresh :class:`~higgsfield.control.backends.slurm.SlurmCluster` (its SSH connection included)
  ``submit()``: mkdir, request/secrets/script via SFTP, ``sbatch``; then the job's batch
  step and node tasks (python) around torchrun, the ranks through ``higgsfield.node.entrypoint``
  (its tee, the experiment's import);
- by hand: ``ssh login sbatch hand.sh``, a script already on the login node whose body is
  the ``srun ... torchrun ... probe.py`` line a user would write.

The clock is this machine's on both sides (every Slurm node is on it), so
``max(rank start) - t(submit began)`` is exact. Target: higgsfield / by hand <= 1.2.

Then the log delay: a run whose 4 ranks print a timestamped line every 20 ms for 4 s is
followed with ``SlurmCluster.logs(follow=True)`` (``higgsfield invoker logs -f`` on the
login node, over SSH); delay = arrival here - the rank's print time, p50/p99 over all lines.

    .venv/bin/python bench/slurm_launch.py            # 3 rounds of each
    .venv/bin/python bench/slurm_launch.py --quick    # 1 round

Needs root, the test bed's sshd hosts and its Slurm (``make slurm-testbed``). Exit status 1
when the ratio misses its target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import _bed

REPO = Path(__file__).resolve().parents[1]
LOGIN = 21                      # hfnode21: the tests use hfnode20
TARGET_RATIO = 1.2
TERMINAL = ("succeeded", "failed", "killed")
PROBE = '''\
import os
import time
os.write(1, f"rank-started {time.time()}\\n".encode())  # one write: srun merges the ranks' output
'''
EXPERIMENT = '''\
import os
import time

from higgsfield.experiment import experiment, param


@experiment("launch_probe")
def launch_probe(params):
    print("rank-started", time.time(), flush=True)


@experiment("chatty")
@param("seconds", default=4.0)
def chatty(params):
    end = time.time() + params.seconds
    i = 0
    while time.time() < end:
        print(f"line {os.environ.get('RANK')} {i} {time.time():.6f}", flush=True)
        i += 1
        time.sleep(0.02)
'''
HAND = '''\
#!/bin/bash
#SBATCH --job-name=hand
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --account=testlab
#SBATCH --output={out}
master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$(( 20000 + SLURM_JOB_ID % 20000 ))
srun --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c '{python} -m torch.distributed.run --nnodes 2 \\
  --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint '$master':'$port' --rdzv_id $SLURM_JOB_ID \\
  --local_addr $(hostname) {probe}'
'''
_STARTED = re.compile(rb"rank-started (\d+\.\d+)")


def setup() -> tuple[object, Path, Path]:
    if os.geteuid() != 0:
        raise _bed.BenchError("needs root (the test bed)")
    if subprocess.run([str(REPO / "scripts" / "slurm-testbed.sh"), "status"], capture_output=True).returncode:
        raise _bed.BenchError("the Slurm test bed is not up: make slurm-testbed")
    subprocess.run(["sacctmgr", "-i", "add", "user", f"hfnode{LOGIN}", "account=testlab"], capture_output=True)
    tb = _bed.load_testbed()
    sdir = tb.state_dir()
    host = tb.make_host(LOGIN, sdir)
    tb.ensure_user(host, (sdir / "client" / "id_ed25519.pub").read_text().strip())
    tb.start_host(host)
    venv = sdir / "runs-invoker-venv"
    if not (venv / ".ready").exists():
        raise _bed.BenchError(f"no test-bed venv at {venv}: run tests/slurm once (it builds it)")
    pw = pwd.getpwnam(host.user)
    work = Path(pw.pw_dir) / f"hf-slurm-bench-{uuid.uuid4().hex[:6]}"
    (work / "code" / "src").mkdir(parents=True)
    (work / "code" / "src" / "benchprobe.py").write_text(EXPERIMENT)
    (work / "hand").mkdir()
    (work / "hand" / "probe.py").write_text(PROBE)
    (work / "venv").symlink_to(venv)
    for p in [work, *work.rglob("*")]:
        os.lchown(p, pw.pw_uid, pw.pw_gid)
    known = work.parent / f".bench-known-{work.name}"
    known.write_text(tb.known_hosts_line(host) + "\n")
    return host, work, known


def engine(host: object, work: Path, known: Path) -> object:
    from higgsfield.control.backends.slurm import SlurmCluster
    from higgsfield.control.config.slurm import SlurmConfig
    from higgsfield.control.remote.hostkeys import PinnedHosts
    from higgsfield.control.remote.ssh import SSHTransport

    tb = _bed.load_testbed()
    settings = SlurmConfig.model_validate({
        "login": {"host": host.address, "user": host.user, "port": host.port},  # type: ignore[attr-defined]
        "workdir": str(work), "account": "testlab", "nodes": 2, "time": "5"})
    t = SSHTransport("login", host.address, user=host.user, port=host.port,  # type: ignore[attr-defined]
                     identity_file=str(tb.state_dir() / "client" / "id_ed25519"), pins=PinnedHosts(known))
    return SlurmCluster(t, settings)


def rank_starts(paths: list[Path], want: int, timeout: float = 120) -> list[float]:
    deadline = time.monotonic() + timeout
    while True:
        found = [float(m) for p in paths if p.exists() for m in _STARTED.findall(p.read_bytes())]
        if len(found) >= want:
            return found
        if time.monotonic() > deadline:
            raise _bed.BenchError(f"only {len(found)} of {want} ranks started in {timeout} s ({paths[0].parent})")
        time.sleep(0.05)


def wait_idle(timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.strip() or \
            "idle" != subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            raise _bed.BenchError("the cluster did not become idle")
        time.sleep(0.2)


async def ours(host: object, work: Path, known: Path, run: str) -> float:
    from higgsfield.control.backends.slurm import template_spec

    eng = engine(host, work, known)
    spec = template_spec(project="bench", experiment="launch_probe", run=run, module="benchprobe",
                         code_dir=str(work / "code"), params={}, nproc=2)
    t0 = time.time()
    job = await eng.submit(spec)  # type: ignore[attr-defined]
    await eng.transport.close()  # type: ignore[attr-defined]
    logs = [Path(job.paths.logs) / f"rank{r}.log" for r in range(4)]
    return max(await asyncio.to_thread(rank_starts, logs, 4)) - t0


def by_hand(host: object, work: Path, known: Path, i: int) -> float:
    tb = _bed.load_testbed()
    out = work / "hand" / f"out{i}"
    script = work / "hand" / f"hand{i}.sh"
    script.write_text(HAND.format(out=out, python=work / "venv" / "bin" / "python", probe=work / "hand" / "probe.py"))
    pw = pwd.getpwnam(host.user)  # type: ignore[attr-defined]
    os.chown(script, pw.pw_uid, pw.pw_gid)
    argv = [tb.exe("ssh"), "-F", "/dev/null", "-i", str(tb.state_dir() / "client" / "id_ed25519"),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
            "-o", "StrictHostKeyChecking=yes", "-p", str(host.port), f"{host.user}@{host.address}",  # type: ignore[attr-defined]
            "sbatch", "--parsable", str(script)]
    t0 = time.time()
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return max(rank_starts([out], 4)) - t0


async def log_delays(host: object, work: Path, known: Path) -> list[float]:
    from higgsfield.control.backends.slurm import template_spec

    eng = engine(host, work, known)
    spec = template_spec(project="bench", experiment="chatty", run=f"chatty-{uuid.uuid4().hex[:6]}",
                         module="benchprobe", code_dir=str(work / "code"), params={"seconds": 4.0}, nproc=2)
    await eng.submit(spec)  # type: ignore[attr-defined]
    delays = []
    async for _rank, text in eng.logs(spec.project, spec.run, follow=True, poll=0.1):  # type: ignore[attr-defined]
        now = time.time()
        parts = text.split()
        if len(parts) == 4 and parts[0] == "line":
            delays.append(now - float(parts[3]))
    await eng.transport.close()  # type: ignore[attr-defined]
    return delays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    host, work, known = setup()
    try:
        ours_s, hand_s = [], []
        for i in range(rounds):
            wait_idle()
            ours_s.append(asyncio.run(ours(host, work, known, f"launch-{i}-{uuid.uuid4().hex[:6]}")))
            wait_idle()
            hand_s.append(by_hand(host, work, known, i))
            _bed.say(f"round {i + 1}: higgsfield {ours_s[-1]:.2f} s, by hand {hand_s[-1]:.2f} s")
        wait_idle()
        delays = asyncio.run(log_delays(host, work, known))
        ratio = _bed.median(ours_s) / _bed.median(hand_s)
        print(_bed.table(["submit -> all 4 ranks started (2 nodes x 2)", "median s", "min s", "max s"], [
            ["higgsfield (SlurmCluster.submit)", f"{_bed.median(ours_s):.2f}", f"{min(ours_s):.2f}",
             f"{max(ours_s):.2f}"],
            ["hand-written sbatch", f"{_bed.median(hand_s):.2f}", f"{min(hand_s):.2f}", f"{max(hand_s):.2f}"],
        ]))
        print(f"\nratio {ratio:.2f} (target <= {TARGET_RATIO}), {rounds} round(s), load {_bed.load_average()}")
        print(f"logs -f delay over {len(delays)} lines of 4 ranks: p50 {_bed.percentile(delays, 0.5) * 1000:.0f} ms, "
              f"p99 {_bed.percentile(delays, 0.99) * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms")
        return 0 if ratio <= TARGET_RATIO else 1
    finally:
        subprocess.run(["scancel", "-u", f"hfnode{LOGIN}"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        known.unlink(missing_ok=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except _bed.BenchError as e:
        print(f"slurm_launch: {e}", file=sys.stderr)
        sys.exit(2)
