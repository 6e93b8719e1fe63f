"""``higgsfield pull`` throughput against plain SFTP gets of the same files, on 2 test-bed nodes.

    .venv/bin/python bench/pull_throughput.py                      # 2 nodes x 2 ranks x 96 MiB, 3 rounds
    .venv/bin/python bench/pull_throughput.py --mib 128 --rounds 5

(it takes ``.testbed/bench.lock`` itself, as every bench on the bench hosts does).

What is pulled is a real checkpoint: a real ``higgsfield run`` (Docker runtime, 2 nodes x 2
ranks, no shared disk) trains an FSDP2-sharded ``torch.nn.Linear(W, W)`` with AdamW for
one step and saves it in node-local mode, so each node holds ``__<rank>_0.distcp`` of
about ``--mib`` MiB for each of its 2 ranks (weight, exp_avg and exp_avg_sq shards:
3·W² bytes a rank) plus ``.metadata``, ``trainer.pt`` and its ``COMPLETE``. The bytes a
pull copies are the merge: every ``.distcp`` and node 0's other files.

Measured per round, each copy into a fresh local directory (the node files sit in the
page cache after the first round, for every method alike), the order rotating between
rounds so drift hits all alike:

- ``sftp get (asyncssh), 1 file at a time``: one asyncssh connection per node, both
  nodes at once, ``SFTPClient.get`` of each file in turn (asyncssh's own pipelining of
  read requests within a file): the plain-tool baseline, and the ratio's denominator;
- ``sftp get (asyncssh), 4 at once``: the same with 4 files in flight over both nodes,
  the parallelism pull uses (``PARALLEL`` in higgsfield/control/backends/nodes/pull.py);
- ``sftp -b (OpenSSH)``: the ``sftp`` client in batch mode, one process per node (if installed);
- ``Transport.get_file, 4 at once``: higgsfield's own SFTP copy (a connection per node
  opened, as in the rows above; no listing, no hashing): the copy pull does, alone;
- ``read_parallel from an offset, 4 at once``: a diagnostic, the bare loop of
  ``get_file`` (an SFTP channel per file, asyncssh's ``SFTPClientFile.read_parallel``
  from an offset, so it can resume), without its progress and gapless-prefix
  bookkeeping. It found the old ``get_file`` loop (one 1 MiB ``read`` awaited at a
  time) at 1.8x the baseline's CPU, which is why ``get_file`` now reads this way;
- ``higgsfield pull, cold``: the CLI into an empty DEST (start-up, connect, find the
  run, the nodes list the step with a sha256 of every file, copy, a local sha256 of
  every copied file, the merged ``COMPLETE``);
- ``higgsfield pull, warm``: the same again onto the complete DEST: nothing copied,
  only the listing with the nodes' hashing and the local hashing (what pull's checks cost).

Printed: the median seconds and MiB/s of each (bytes: what a cold pull copies), the ratio
of each to the baseline, the median CPU seconds this process and its children used for
each (user + system: the CLI's and ``sftp``'s processes, asyncssh's ciphers, the local
hashing; not the nodes' sshd, which run as other users), and a breakdown of one cold and
one warm pull run in this process with timers around pull's phases (the nodes' listing, the copies, the local
hashes). No time is asserted: the figures are ratios against baselines measured in the
same script, on the same machine, at the same moment. The CPU column is there because this
machine's 2 cores are shared with other jobs: under load the wall times follow the CPU each
method needs, and the CPU seconds move far less between runs than the wall times do.

Needs root and the test bed (``make testbed``): uses bench hosts hfnode30 and hfnode31
(stopped at the end) and the test bed's base image; about 2·2·``--mib`` MiB on each
node's disk and twice that under /tmp while it runs (all removed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _bed

PROJECT = "bench_pull"
EXPERIMENT = "pull_bench"
NODES = 2
NPROC = 2
PARALLEL = 4  # as higgsfield/control/backends/nodes/pull.py
BASELINE = "sftp get (asyncssh), 1 file at a time"
TRAIN = '''\
"""One step of an FSDP2-sharded linear layer with AdamW, saved once: a checkpoint of a chosen size per rank."""
from higgsfield.experiment import experiment, param


@experiment("pull_bench", seed=0)
@param("width", default=1024)
def pull_bench(params):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import init_distributed

    init_distributed()
    model = torch.nn.Linear(params.width, params.width, bias=False)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, params.width)).pow(2).mean().backward()
    opt.step()
    ckpt = Checkpoint(model, opt, every=1, keep_last=1)
    ckpt.save(0)
    ckpt.wait()
    print(f"saved step 0 of a {params.width}x{params.width} linear layer", flush=True)
    dist.destroy_process_group()
'''


@dataclass(frozen=True)
class NodeFile:
    """One file a pull copies: the node it is taken from, its path there, its name under DEST."""

    host: Any
    path: str
    rel: str
    size: int


def width_for(mib: float) -> int:
    """The width W whose checkpoint holds about ``mib`` MiB a rank: with 4 ranks each holds W/4 rows of the
    weight, exp_avg and exp_avg_sq (fp32), 3·W² bytes; a multiple of 4 so the shards are even."""
    return max(4, int(round(math.sqrt(mib * 2**20 / 3) / 4)) * 4)


def step_files(project: _bed.Project, run: str) -> tuple[str, list[NodeFile]]:
    """The newest complete step on every node and the files a pull of it copies (node 0's for a shared name)."""
    roots = [Path(project.hosts[0].home) / ".cache" / "higgsfield" / PROJECT / "experiments" / EXPERIMENT / run]
    roots += [Path(h.home) / ".cache" / "higgsfield" / PROJECT / "experiments" / EXPERIMENT / run
              for h in project.hosts[1:]]
    steps = [{p.name for p in r.glob("step_*") if (p / "COMPLETE").is_file()} for r in roots]
    common = set.intersection(*steps)
    if not common:
        raise _bed.BenchError(f"no step complete on every node under {', '.join(map(str, roots))}")
    step = max(common)
    taken: dict[str, NodeFile] = {}
    for host, root in zip(project.hosts, roots, strict=True):
        for p in sorted((root / step).iterdir()):
            if p.is_file() and p.name != "COMPLETE":
                taken.setdefault(p.name, NodeFile(host, str(p), f"{step}/{p.name}", p.stat().st_size))
    return step, sorted(taken.values(), key=lambda f: f.rel)


@contextlib.contextmanager
def fresh_dir(base: Path, name: str) -> Iterator[Path]:
    d = base / f"{name}-{secrets.token_hex(3)}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_copied(dest: Path, files: Sequence[NodeFile]) -> None:
    """Every file arrived whole (sizes: the methods are compared on the same bytes, not trusted to copy them)."""
    for f in files:
        got = (dest / f.rel).stat().st_size if (dest / f.rel).is_file() else -1
        if got != f.size:
            raise _bed.BenchError(f"{f.rel} from {f.host.name}: {got} bytes here, {f.size} on the node")


async def _connections(project: _bed.Project) -> dict[str, Any]:
    """One plain asyncssh connection per node: the bed's client key, the host keys setup pinned for the project."""
    import asyncssh

    key = str(_bed.load_testbed().state_dir() / "client" / "id_ed25519")
    known = str(project.dir / ".higgsfield" / "known_hosts")
    conns = await asyncio.gather(*(asyncssh.connect(h.address, h.port, username=h.user, client_keys=[key],
                                                    known_hosts=known, config=None)
                                   for h in project.hosts))
    return {h.name: c for h, c in zip(project.hosts, conns, strict=True)}


async def asyncssh_get(project: _bed.Project, files: Sequence[NodeFile], dest: Path, parallel: int | None) -> None:
    """``SFTPClient.get`` of each file: ``parallel`` None: one file at a time per node (nodes at once),
    else that many files in flight over all nodes."""
    conns = await _connections(project)
    try:
        clients = {n: await c.start_sftp_client() for n, c in conns.items()}
        for f in files:
            (dest / f.rel).parent.mkdir(parents=True, exist_ok=True)
        if parallel is None:
            async def node(name: str) -> None:
                for f in files:
                    if f.host.name == name:
                        await clients[name].get(f.path, str(dest / f.rel))

            await asyncio.gather(*(node(n) for n in clients))
        else:
            limit = asyncio.Semaphore(parallel)

            async def one(f: NodeFile) -> None:
                async with limit:
                    await clients[f.host.name].get(f.path, str(dest / f.rel))

            await asyncio.gather(*(one(f) for f in files))
    finally:
        for c in conns.values():
            c.close()
        await asyncio.gather(*(c.wait_closed() for c in conns.values()))


async def read_parallel_get(project: _bed.Project, files: Sequence[NodeFile], dest: Path) -> None:
    """Each file as ``SSHTransport.get_file`` copies it (its own SFTP channel, a read from an offset, written
    at its offset), ``PARALLEL`` at once, but through ``read_parallel``: the read window asyncssh's ``get`` has."""
    conns = await _connections(project)
    try:
        for f in files:
            (dest / f.rel).parent.mkdir(parents=True, exist_ok=True)
        limit = asyncio.Semaphore(PARALLEL)

        async def one(f: NodeFile) -> None:
            async with limit, conns[f.host.name].start_sftp_client() as sftp, sftp.open(f.path, "rb") as src:
                with open(dest / f.rel, "wb") as out:
                    async for pos, chunk in await src.read_parallel(f.size, 0):
                        out.seek(pos)
                        out.write(chunk)

        await asyncio.gather(*(one(f) for f in files))
    finally:
        for c in conns.values():
            c.close()
        await asyncio.gather(*(c.wait_closed() for c in conns.values()))


def openssh_get(project: _bed.Project, files: Sequence[NodeFile], dest: Path) -> None:
    """``sftp -b`` per node, both at once: the OpenSSH client's own pipelining (its defaults)."""
    key = _bed.load_testbed().state_dir() / "client" / "id_ed25519"
    known = project.dir / ".higgsfield" / "known_hosts"
    procs = []
    for h in project.hosts:
        mine = [f for f in files if f.host.name == h.name]
        if not mine:
            continue
        (dest / mine[0].rel).parent.mkdir(parents=True, exist_ok=True)
        batch = "".join(f'get "{f.path}" "{dest / f.rel}"\n' for f in mine)
        argv = [shutil.which("sftp") or "sftp", "-q", "-b", "-", "-i", str(key), "-P", str(h.port),
                "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-F", "/dev/null", f"{h.user}@{h.address}"]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: S603
                             text=True)
        procs.append((h, p, batch))
    for h, p, batch in procs:
        out, err = p.communicate(batch, timeout=600)
        if p.returncode:
            raise _bed.BenchError(f"sftp -b on {h.name} exited {p.returncode}: {(out + err).strip()[-500:]}")


def _config(project: _bed.Project) -> Any:
    from higgsfield.control.config.loader import load_config

    os.environ.update({k: v for k, v in project.env().items() if k.startswith("HIGGSFIELD_")})
    return load_config(project.dir / "higgsfield.yml")


async def transport_get(project: _bed.Project, files: Sequence[NodeFile], dest: Path) -> None:
    """higgsfield's ``Transport.get_file`` of each file, ``PARALLEL`` at once, as pull does (connections opened
    first; no listing, no hash)."""
    from higgsfield.control.remote import open_group

    async with open_group(_config(project)) as group:
        by_name = {m.name: m.transport for m in group.members}
        for f in files:
            (dest / f.rel).parent.mkdir(parents=True, exist_ok=True)
        limit = asyncio.Semaphore(PARALLEL)

        async def one(f: NodeFile) -> None:
            async with limit:
                await by_name[f.host.name].get_file(f.path, str(dest / f.rel), end=f.size)

        await asyncio.gather(*(one(f) for f in files))


def cpu_seconds() -> float:
    """User + system CPU of this process (its threads included) and of its children that have exited."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cli_pull(project: _bed.Project, run: str, step: str, dest: Path) -> str:
    r = project.hf("pull", run, str(dest), "--step", step, timeout=900)
    return r.out.strip()


@dataclass
class Phases:
    """Wall-clock spans of one pull's phases, taken from timers around pull.py's own functions."""

    listing: float = 0.0         # the `invoker files` calls (the nodes' sha256 of every file with --step)
    first_fetch: float = math.inf
    last_fetch: float = 0.0
    get_file: float = 0.0        # summed over the files (they overlap, PARALLEL at once)
    local_sha: float = 0.0       # summed
    total: float = 0.0
    cpu: float = 0.0             # this process's CPU over the pull (the local hashing's threads included)

    def copy_span(self) -> float:
        return max(0.0, self.last_fetch - self.first_fetch)


async def profiled_pull(project: _bed.Project, run: str, step: str, dest: Path) -> Phases:
    """One pull in this process with timers wrapped around pull.py's ``_list``, ``fetch``, ``_sha256`` and the
    transport's ``get_file``: where its time goes."""
    from higgsfield.control.backends.nodes import pull as pull_mod
    from higgsfield.control.remote.ssh import SSHTransport

    ph = Phases()
    saved = (pull_mod._list, pull_mod.fetch, pull_mod._sha256, SSHTransport.get_file)

    def timed(fn: Callable[..., Awaitable[Any]], add: Callable[[float, float], None]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                add(t0, time.perf_counter())
        return wrapper

    def on_list(t0: float, t1: float) -> None:
        spans.append((t0, t1))

    def on_fetch(t0: float, t1: float) -> None:
        ph.first_fetch, ph.last_fetch = min(ph.first_fetch, t0), max(ph.last_fetch, t1)

    def add_get(t0: float, t1: float) -> None:
        ph.get_file += t1 - t0

    def add_sha(t0: float, t1: float) -> None:
        ph.local_sha += t1 - t0

    spans: list[tuple[float, float]] = []
    pull_mod._list = timed(saved[0], on_list)  # type: ignore[assignment]
    pull_mod.fetch = timed(saved[1], on_fetch)  # type: ignore[assignment]
    pull_mod._sha256 = timed(saved[2], add_sha)  # type: ignore[assignment]
    SSHTransport.get_file = timed(saved[3], add_get)  # type: ignore[method-assign]
    start, cpu0 = time.perf_counter(), cpu_seconds()
    try:
        await pull_mod.pull(_config(project), run, dest, step=step)
    finally:
        pull_mod._list, pull_mod.fetch, pull_mod._sha256, SSHTransport.get_file = saved  # type: ignore[method-assign]
    ph.total, ph.cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    ph.listing = _union(spans)
    if ph.first_fetch is math.inf:
        ph.first_fetch = 0.0
    return ph


def _union(spans: Sequence[tuple[float, float]]) -> float:
    """The wall time covered by possibly overlapping spans (the nodes list at once)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def node_hash_seconds(files: Sequence[NodeFile]) -> float:
    """sha256 of every file of one node read here (as root, from the page cache): what the node's listing hashes."""
    import hashlib

    t0 = time.perf_counter()
    for f in files:
        h = hashlib.sha256()
        with open(f.path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=96, help="MiB of each rank's .distcp (2 per node, 2 nodes)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every method; the medians are printed")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the local copies go (a fresh dir each)")
    args = ap.parse_args()
    if args.rounds < 1 or args.mib <= 0:
        print("pull_throughput: --rounds must be >= 1 and --mib > 0", file=sys.stderr)
        return 2
    width = width_for(args.mib)
    need = 2 * NODES * NPROC * 3 * width * width
    if shutil.disk_usage(args.tmp).free < need + (2 << 30):
        print(f"pull_throughput: {args.tmp} has under {(need >> 20) + 2048} MiB free: pass --tmp or a smaller --mib",
              file=sys.stderr)
        return 2
    run = f"pullbench-{secrets.token_hex(3)}"
    with _bed.bench_hosts(NODES) as hosts:
        project = _bed.Project(PROJECT, hosts, nproc=NPROC, sources={"pull_bench.py": TRAIN})
        base = Path(tempfile.mkdtemp(prefix="hf-pull-bench-", dir=args.tmp))
        try:
            _bed.first_setup(project)
            _bed.say(f"deploy: {project.hf('deploy', timeout=1200).seconds:.1f}s")
            r = project.hf("run", EXPERIMENT, "--run-name", run, "-p", f"width={width}", timeout=900)
            _bed.say(f"run {run} (width {width}): {r.seconds:.1f}s")
            step, files = step_files(project, run)
            total = sum(f.size for f in files)
            _bed.say(f"{step}: {len(files)} files, {total / 2**20:.1f} MiB a pull copies: "
                     + ", ".join(f"{f.host.name}:{Path(f.rel).name} {f.size / 2**20:.1f}" for f in files))
            report(project, run, step, files, total, width, base, args.rounds)
        finally:
            shutil.rmtree(base, ignore_errors=True)
            project.hf("kill", run, check=False, timeout=120)
            for h in hosts:  # the checkpoint is the bulk of the bench's disk use: not left behind
                shutil.rmtree(Path(h.home) / ".cache" / "higgsfield" / PROJECT / "experiments" / EXPERIMENT / run,
                              ignore_errors=True)
            project.remove()
    return 0


def report(project: _bed.Project, run: str, step: str, files: list[NodeFile], total: int, width: int, base: Path,
           rounds: int) -> None:
    warm_dest = base / "warm"
    cli_pull(project, run, step, warm_dest)  # the warm pull's DEST, complete; also a warm-up of every cache
    check_copied(warm_dest, files)

    def pull_cold(dest: Path) -> None:
        print(f"  {cli_pull(project, run, step, dest / 'pulled')}", file=sys.stderr)
        check_copied(dest / "pulled", files)

    methods: dict[str, Callable[[Path], None]] = {
        BASELINE: lambda d: asyncio.run(asyncssh_get(project, files, d, None)),
        f"sftp get (asyncssh), {PARALLEL} at once": lambda d: asyncio.run(asyncssh_get(project, files, d, PARALLEL)),
        f"Transport.get_file, {PARALLEL} at once": lambda d: asyncio.run(transport_get(project, files, d)),
        f"read_parallel from an offset, {PARALLEL} at once": lambda d: asyncio.run(read_parallel_get(project, files, d)),
        "higgsfield pull, cold": pull_cold,
        "higgsfield pull, warm (all here)": lambda d: None,
    }
    if shutil.which("sftp"):
        methods["sftp -b (OpenSSH), a process per node"] = lambda d: openssh_get(project, files, d)
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpus: dict[str, list[float]] = {m: [] for m in methods}
    names = list(methods)
    for k in range(rounds):
        order = names[k % len(names):] + names[:k % len(names)]
        for m in order:
            with fresh_dir(base, "copy") as d:
                t0, c0 = time.perf_counter(), cpu_seconds()
                if m.startswith("higgsfield pull, warm"):
                    out = cli_pull(project, run, step, warm_dest)
                    if " 0 file(s) copied" not in out:
                        raise _bed.BenchError(f"the warm pull copied something: {out}")
                else:
                    methods[m](d)
                dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
                if not m.startswith("higgsfield pull"):
                    check_copied(d, files)
            times[m].append(dt)
            cpus[m].append(dc)
            _bed.say(f"round {k + 1}/{rounds} {m}: {dt:.2f}s, CPU {dc:.2f}s")

    with fresh_dir(base, "profile") as d:
        cold = asyncio.run(profiled_pull(project, run, step, d))
        warm = asyncio.run(profiled_pull(project, run, step, d))
    per_node = {h.name: [f for f in files if f.host.name == h.name] for h in project.hosts}
    node0_all = [NodeFile(project.hosts[0], str(p), p.name, p.stat().st_size)
                 for p in sorted(Path(files[0].path).parent.iterdir()) if p.is_file() and p.name != "COMPLETE"]
    hash_here = node_hash_seconds(node0_all)

    mib = total / 2**20
    base_s, base_cpu = _bed.median(times[BASELINE]), _bed.median(cpus[BASELINE])
    print(f"\npull throughput: {NODES} nodes x {NPROC} ranks, Linear({width}, {width}) + AdamW, {step}: "
          f"{len(files)} files, {mib:.1f} MiB a pull copies ("
          + ", ".join(f"{n}: {sum(f.size for f in fs) / 2**20:.1f} MiB" for n, fs in per_node.items())
          + f"); {rounds} round(s); load average {_bed.load_average()}")
    rows = []
    for m, ts in times.items():
        med = _bed.median(ts)
        rate = "-" if m.startswith("higgsfield pull, warm") else f"{mib / med:.0f}"
        cpu = _bed.median(cpus[m])
        rows.append([m, f"{med:.2f}", f"{min(ts):.2f}-{max(ts):.2f}", rate, f"{med / base_s:.2f}", f"{cpu:.2f}",
                     f"{cpu / base_cpu:.2f}"])
    print(_bed.table(["method", "median s", "range s", "MiB/s", "x baseline", "CPU s here", "CPU x baseline"],
                     rows))
    print("\nwhere one pull's time goes (in this process, timers around pull.py's functions; "
          "get_file and local sha256 summed over files that overlap):")
    print(_bed.table(["pull", "total s", "listing (node sha256) s", "copy span s", "get_file sum s",
                      "local sha256 sum s", "CPU s here"],
                     [[n, f"{p.total:.2f}", f"{p.listing:.2f}", f"{p.copy_span():.2f}", f"{p.get_file:.2f}",
                       f"{p.local_sha:.2f}", f"{p.cpu:.2f}"] for n, p in (("cold", cold), ("warm", warm))]))
    print(f"\nsha256 of node 0's part ({sum(f.size for f in node0_all) / 2**20:.1f} MiB) read here, one thread: "
          f"{hash_here:.2f}s ({sum(f.size for f in node0_all) / 2**20 / hash_here:.0f} MiB/s)")
    cold_s = _bed.median(times["higgsfield pull, cold"])
    print(f"ratio cold pull / baseline: {cold_s / base_s:.2f}; "
          f"cold - warm (the copy's share): {cold_s - _bed.median(times['higgsfield pull, warm (all here)']):.2f}s")


if __name__ == "__main__":
    sys.exit(main())
