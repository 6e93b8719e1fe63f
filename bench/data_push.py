"""``higgsfield data push`` against ``rsync -a`` to every node in parallel, the laptop's uplink at 100 Mbit/s.

4 nodes (hfnode30..33 of the test bed), one entry of 500 MB (250 files of 2 MB, random). The
laptop is a user of its own (``hfbenchlap``), and everything that user sends over loopback leaves
through an htb class and a tbf at 100 Mbit/s (iptables' owner match puts its packets there, as
tests/provision/test_doctor_fabric.py throttles a node); the nodes' links are not throttled. Then:

1. ``rsync -a`` of the tree from the laptop to each of the 4 nodes at once (what SkyPilot's
   ``file_mounts`` does): 4 x 500 MB over the uplink;
2. ``higgsfield data push``: 500 MB over the uplink to node 0, the nodes copy the rest;
3. a re-push of an unchanged entry of 10,000 small files (1 KiB), unthrottled (its time is the
   CLI's start, the stat of every file, one status call per node).

    .venv/bin/python bench/data_push.py                 # the issue's sizes
    .venv/bin/python bench/data_push.py --mb 100        # smaller, for a quick look

Needs root and the test bed; refuses to run when ``lo`` already has a root qdisc (another test's
throttle). Everything it adds (the qdisc, the iptables rule) is removed in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import _bed

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runs"))
sys.path.insert(0, str(REPO / "tests"))
INDICES = (30, 31, 32, 33)
LAPTOP = "hfbenchlap"
RATE = "100mbit"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)  # noqa: S603


@contextlib.contextmanager
def throttled(uid: int) -> Iterator[None]:
    """Loopback traffic of ``uid`` through a 100 Mbit/s class; everyone else's unlimited."""
    if "htb" in _run("tc", "qdisc", "show", "dev", "lo").stdout:
        raise _bed.BenchError("lo already has an htb root qdisc (another throttling test runs): try later")
    rule = ["OUTPUT", "-m", "owner", "--uid-owner", str(uid), "-j", "CLASSIFY", "--set-class", "1:20"]
    try:
        _run("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10", "r2q", "1000")
        _run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit",
             "burst", "10mb")
        _run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", RATE,
             "burst", "256kb")
        _run("tc", "qdisc", "add", "dev", "lo", "parent", "1:20", "handle", "20:", "tbf", "rate", RATE,
             "burst", "256kb", "latency", "400ms")
        _run("iptables", "-t", "mangle", "-A", *rule)
        yield
    finally:
        _run("iptables", "-t", "mangle", "-D", *rule, check=False)
        _run("tc", "qdisc", "del", "dev", "lo", "root", check=False)


def laptop_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(LAPTOP)
    except KeyError:
        _run("useradd", "--create-home", "--shell", "/bin/bash", LAPTOP)
        return pwd.getpwnam(LAPTOP)


def as_laptop(pw: pwd.struct_passwd, argv: list[str], cwd: Path, timeout: float = 1800) -> tuple[float, str]:
    t0 = time.monotonic()
    r = subprocess.run(["runuser", "-u", pw.pw_name, "--", "env", f"HOME={pw.pw_dir}", "PYTHONUNBUFFERED=1",  # noqa: S603
                        *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise _bed.BenchError(f"{' '.join(argv[:4])} exited {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    return took, r.stdout


def _try_lock(f: object) -> bool:
    import fcntl

    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[arg-type]
        return True
    except BlockingIOError:
        return False


def make_tree(root: Path, files: int, size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        sub = root / f"part{i % 16:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"shard{i:05d}.bin").write_bytes(os.urandom(size))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=500, help="size of the pushed entry in MB (default 500)")
    ap.add_argument("--small-files", type=int, default=10_000)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise _bed.BenchError("run as root (users, tc, iptables)")
    import fcntl

    from runs_helpers import bed_for, runs_conftest

    tb = bed_for(INDICES)
    lock = open(tb.state_dir() / "bench.lock", "w")   # one bench at a time (bench/_bed.py): they share hosts
    _bed.say("waiting for .testbed/bench.lock") if not _try_lock(lock) else None
    fcntl.flock(lock, fcntl.LOCK_EX)
    pw = laptop_user()
    home = Path(pw.pw_dir)
    work = home / "bench-data"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    c = runs_conftest().make_cluster(tb, work / "hfbdata", INDICES)
    key = work / "id_ed25519"
    shutil.copy(tb.state_dir() / "client" / "id_ed25519", key)
    text = (c.dir / "higgsfield.yml").read_text()
    text = "\n".join(f"  identity_file: {key}" if ln.startswith("  identity_file:") else ln for ln in text.splitlines())
    (c.dir / "higgsfield.yml").write_text(text + "\ndata:\n  corpus: ./corpus\n  small: ./small\n")
    _bed.say(f"generating {args.mb} MB and {args.small_files} small files")
    make_tree(c.dir / "corpus", args.mb // 2, 2_000_000)
    make_tree(c.dir / "small", args.small_files, 1024)
    _run("chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(work))
    known = c.dir / ".higgsfield" / "known_hosts"
    # the bed's shared venv (editable higgsfield, /usr/bin/python3): the laptop user cannot read root's pyenv
    py = str(tb.state_dir() / "runs-invoker-venv" / "bin" / "python")
    hf = [py, "-m", "higgsfield"]
    for i in INDICES:   # a clean slate on the nodes: nothing of an earlier round counts
        shutil.rmtree(Path(f"/home/hfnode{i}") / ".hfrt" / "data" / "hfbdata", ignore_errors=True)
        shutil.rmtree(Path(f"/home/hfnode{i}") / "rsync-corpus", ignore_errors=True)
    as_laptop(pw, [*hf, "data", "push", "small"], c.dir)      # the small entry's first push: not measured

    rsync_ssh = (f"ssh -i {key} -p 2222 -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes "
                 "-o BatchMode=yes")
    with throttled(pw.pw_uid):
        _bed.say(f"rsync -a to {len(INDICES)} nodes in parallel, uplink {RATE}")
        t0 = time.monotonic()
        procs = [subprocess.Popen(["runuser", "-u", pw.pw_name, "--", "rsync", "-a", "-e", rsync_ssh,  # noqa: S603
                                   f"{c.dir / 'corpus'}/", f"hfnode{i}@127.0.0.{i + 2}:rsync-corpus/"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in INDICES]
        for p in procs:
            _, err = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise _bed.BenchError(f"rsync exited {p.returncode}: {err.decode()[-500:]}")
        rsync_s = time.monotonic() - t0
        _bed.say(f"rsync: {rsync_s:.1f}s")
        push_s, out = as_laptop(pw, [*hf, "data", "push", "corpus", "--json"], c.dir)
        result = json.loads(out.strip().splitlines()[-1])
        _bed.say(f"data push: {push_s:.1f}s, {result['uplink_bytes'] / 1e6:.0f} MB over the uplink, "
                 + ", ".join(f"{n['node']} via {n['via']}" for n in result["nodes"]))
    repush = []
    for _ in range(3):
        s, out = as_laptop(pw, [*hf, "data", "push", "small", "--json"], c.dir)
        assert json.loads(out.strip().splitlines()[-1])["uplink_bytes"] == 0
        repush.append(s)
    _bed.say(f"re-push of the unchanged {args.small_files}-file entry: "
             + ", ".join(f"{s:.2f}s" for s in repush))
    print(json.dumps({"mb": args.mb, "nodes": len(INDICES), "rate": RATE, "rsync_s": round(rsync_s, 1),
                      "push_s": round(push_s, 1), "speedup": round(rsync_s / push_s, 2),
                      "repush_small_s": [round(s, 2) for s in repush]}))
    for i in INDICES:
        shutil.rmtree(Path(f"/home/hfnode{i}") / "rsync-corpus", ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except _bed.BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
