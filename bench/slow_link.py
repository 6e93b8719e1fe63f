"""Full FSDP, hybrid and hybrid + DiLoCo (H=50, int8) over a throttled link between 2 nodes x 2 ranks.

A ~20M-parameter LLaMA (hidden 576, 6 layers) on tiny_llama's sums, the same token budget, data,
seed, AdamW and learning rate in every mode (``bench/_slow_link_worker.py``). Each node is a torchrun
agent in its own UTS + mount namespace whose hostname resolves to its own loopback address (the bench
hosts' 127.0.0.32 and .33), so gloo listens there, and a small LD_PRELOAD shim (``bench/_bind_src.c``)
makes the node's outgoing connections leave from there too (the kernel would pick 127.0.0.1): traffic
within a node stays on its address, traffic between the nodes goes from one address to the other, and
only that is throttled. The link: an htb
class and a tbf per direction at RATE on ``lo`` (the fabric test's and bench/data_push.py's recipe;
iptables' CLASSIFY picks the packets by source and destination; this kernel has no netem), and the
same iptables rules count the bytes that crossed (TCP/IP headers included).

What runs, for each mode:

1. at 1 Gbit/s, the whole budget (STEPS steps): tokens/s, cross-node bytes, the held-out loss at the end;
2. at 100 Mbit/s, a window: 4 steps of full and hybrid (the first dropped as warm-up), and one whole
   outer period of DiLoCo (50 steps, its outer step included): tokens/s and bytes per step. A whole
   budget of full FSDP at 100 Mbit/s would take about half an hour here; the arithmetic, and so the
   loss and the bytes, do not depend on the link, only the time does.

Ratios are against full FSDP in the same script. Needs root (namespaces, tc, iptables) and the bench
lock (``.testbed/bench.lock``, bench/_bed.py); refuses to run when ``lo`` already has a root qdisc.

    .venv/bin/python bench/slow_link.py                # about 15 minutes on 2 cores
    .venv/bin/python bench/slow_link.py --steps 50     # a shorter budget (one outer step of DiLoCo)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import _bed

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "bench" / "_slow_link_worker.py"
SHIM = REPO / "bench" / "_bind_src.c"
NODES = ((30, "127.0.0.32"), (31, "127.0.0.33"))   # bench hosts 30 and 31's addresses (bench/_bed.py)
MODES = ("full", "hybrid", "diloco")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)  # noqa: S603


def _rules() -> list[list[str]]:
    (_, a), (_, b) = NODES
    return [["OUTPUT", "-s", a, "-d", b, "-j", "CLASSIFY", "--set-class", "1:20"],
            ["OUTPUT", "-s", b, "-d", a, "-j", "CLASSIFY", "--set-class", "1:30"]]


@contextlib.contextmanager
def link(rate: str) -> Iterator[None]:
    """Node 0 -> node 1 and node 1 -> node 0 each through their own class at ``rate``; the rest unlimited."""
    if "htb" in _run("tc", "qdisc", "show", "dev", "lo").stdout:
        raise _bed.BenchError("lo already has an htb root qdisc (another throttling test runs): try later")
    try:
        _run("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10", "r2q", "1000")
        _run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit",
             "burst", "10mb")
        burst = "1mb" if rate.endswith("gbit") else "256kb"   # a tbf passes at most a burst per timer tick
        for cls in ("20", "30"):
            _run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", f"1:{cls}", "htb", "rate", rate,
                 "burst", burst)
            _run("tc", "qdisc", "add", "dev", "lo", "parent", f"1:{cls}", "handle", f"{cls}:", "tbf", "rate", rate,
                 "burst", burst, "latency", "400ms")
        for rule in _rules():
            _run("iptables", "-t", "mangle", "-A", *rule)
        yield
    finally:
        for rule in _rules():
            _run("iptables", "-t", "mangle", "-D", *rule, check=False)
        _run("tc", "qdisc", "del", "dev", "lo", "root", check=False)


def crossed() -> int:
    """Bytes the two rules have counted (both directions) since they were made (``pkts bytes target ... src dst``)."""
    out = _run("iptables", "-t", "mangle", "-L", "OUTPUT", "-v", "-x", "-n").stdout
    pair = {addr for _, addr in NODES}
    return sum(int(f[1]) for f in (line.split() for line in out.splitlines())
               if len(f) > 8 and f[2] == "CLASSIFY" and {f[7], f[8]} == pair)


def build_shim(work: Path) -> Path:
    """bench/_bind_src.c built into ``work`` (a node's connections leave from its own address; why: there)."""
    lib = work / "bind_src.so"
    _run("gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(SHIM), "-ldl")
    return lib


def launch(mode: str, steps: int, work: Path, evaluate: bool) -> dict:
    """The worker on 2 namespaced nodes x 2 ranks; rank 0's result, plus the bytes that crossed."""
    shim = work / "bind_src.so" if (work / "bind_src.so").is_file() else build_shim(work)
    hosts = work / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{addr} hfb-n{i}\n" for i, addr in NODES))
    with socket.socket() as s:
        s.bind((NODES[0][1], 0))
        port = s.getsockname()[1]
    out = work / f"{mode}-{steps}-{time.monotonic_ns()}.json"
    before = crossed()
    procs = []
    for rank, (i, addr) in enumerate(NODES):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "LD_PRELOAD": str(shim), "HF_BIND_SRC": addr}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
                    "--nproc_per_node", "2", "--master_addr", NODES[0][1], "--master_port", str(port),
                    str(WORKER), mode, str(steps), str(out), *([] if evaluate else ["--no-eval"])]
        argv = ["unshare", "--uts", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"', "sh", f"hfb-n{i}",
                str(hosts), *torchrun]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,  # noqa: S603
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs) or not out.is_file():
        raise _bed.BenchError(f"{mode} x {steps} failed:\n" + "\n".join(x[-3000:] for x in logs))
    result = json.loads(out.read_text())
    result["crossed"] = crossed() - before
    return result


def tokens_per_s(r: dict, skip: int) -> float:
    times = r["step_s"][skip:]
    return r["tokens"] * len(times) / r["steps"] / sum(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="the token budget in steps (default 100: 2 outer steps)")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise _bed.BenchError("run as root (namespaces, tc, iptables)")
    sdir = _bed.load_testbed().state_dir()
    sdir.mkdir(parents=True, exist_ok=True)
    with open(sdir / "bench.lock", "w") as lock:   # one bench at a time: they share lo's qdisc and the cores
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _bed.say("another bench holds .testbed/bench.lock; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        work = Path(tempfile.mkdtemp(prefix="hf-slowlink-"))
        figures: dict[str, dict] = {}
        with link("1gbit"):
            for mode in MODES:
                t0 = time.monotonic()
                r = launch(mode, args.steps, work, evaluate=True)
                figures[f"1gbit/{mode}"] = r
                _bed.say(f"1 Gbit/s {mode}: {tokens_per_s(r, 1):,.0f} tok/s, {r['crossed'] / 1e6:,.1f} MB crossed, "
                         f"held-out loss {r['held_out_loss']:.4f} ({time.monotonic() - t0:.0f} s)")
        with link("100mbit"):
            for mode in MODES:
                t0 = time.monotonic()
                r = launch(mode, 50 if mode == "diloco" else 4, work, evaluate=False)
                figures[f"100mbit/{mode}"] = r
                _bed.say(f"100 Mbit/s {mode}: {tokens_per_s(r, 1):,.0f} tok/s, "
                         f"{r['crossed'] / r['steps'] / 1e6:,.2f} MB crossed a step ({time.monotonic() - t0:.0f} s)")
    rows = []
    full_bytes = figures["1gbit/full"]["crossed"]
    if full_bytes < 1e6:
        raise _bed.BenchError(f"only {full_bytes} bytes crossed between the nodes' addresses under full FSDP: gloo did "
                              "not bind them (the namespaces' hostnames), so the link was not the nodes' link")
    full_loss = figures["1gbit/full"]["held_out_loss"]
    for rate in ("100mbit", "1gbit"):
        base = tokens_per_s(figures[f"{rate}/full"], 1)
        for mode in MODES:
            r, budget = figures[f"{rate}/{mode}"], figures[f"1gbit/{mode}"]
            tps = tokens_per_s(r, 1)
            rows.append([rate.replace("mbit", " Mbit/s").replace("gbit", " Gbit/s"), mode, f"{tps:,.0f}",
                         f"{tps / base:.2f}x", f"{budget['crossed'] / 1e6:,.1f}",
                         f"{full_bytes / max(budget['crossed'], 1):,.0f}x fewer",
                         f"{budget['held_out_loss']:.4f}", f"{100 * (budget['held_out_loss'] / full_loss - 1):+.2f}%"])
    params = figures["1gbit/full"]["params"]
    tokens = figures["1gbit/full"]["tokens"]
    print(f"\n{params / 1e6:.1f}M parameters, {args.steps} steps = {tokens:,} tokens per mode, 2 nodes x 2 ranks, "
          f"load {_bed.load_average()}\n")
    print(_bed.table(["link", "mode", "tokens/s", "vs full", "cross-node MB (budget)", "vs full",
                      "held-out loss", "vs full"], rows))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except _bed.BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
