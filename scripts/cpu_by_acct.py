"""The CPU of every process a span ran, by kind: the kernel's process accounting joined with command lines.

scripts/cpu_by_process.py samples once a second and leaves what lived under a second (an SSH session's
sshd, an invoker command, git) as one remainder. The kernel's BSD process accounting (``accton``,
Debian's ``acct``) writes a record for every process that ends, however short, with its CPU time, pid,
parent and start time, but only 15 characters of its name: every Python process is ``python``. So this
does both. ``watch`` lists the processes (psutil) every 0.2 s and writes the command line of each process it sees (a
few % of a core); ``report`` joins each accounting record with the line seen for its pid near its start
and sums the CPU by kind (:func:`cpu_by_process.kind`). A process no sample saw counts under its name.
What still runs at the end (dockerd, sshd's listeners, the Slurm daemons) has no record yet.

    apt-get install acct && touch /tmp/pacct && accton /tmp/pacct
    .venv/bin/python scripts/cpu_by_acct.py watch /tmp/cmdlines.tsv & w=$!
    CI=true bash .ci/run; kill $w; accton off
    .venv/bin/python scripts/cpu_by_acct.py report /tmp/pacct /tmp/cmdlines.tsv [FROM TO]

FROM and TO (epoch seconds) keep the processes that started between them. docs/benchmarks.md ("The
developer loop") has a CI run's figures.
"""

from __future__ import annotations

import struct
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import psutil
from cpu_by_process import kind  # scripts/ is this script's sys.path[0]

#: ``struct acct_v3`` (linux/acct.h): flag, version, tty, exit code, uid, gid, pid, ppid, start (s), elapsed
#: (float), then eight ``comp_t`` (user, system, mem, io, rw, minflt, majflt, swaps) and the name.
_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_HZ = 100  # AHZ: comp_t counts are in 1/100 s


@dataclass(frozen=True)
class Record:
    pid: int
    start: int
    cpu_s: float
    name: str


def comp_t(v: int) -> int:
    """A ``comp_t``: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (v & 0x1FFF) << (3 * (v >> 13))


def records(data: bytes) -> list[Record]:
    out = []
    for off in range(0, len(data) - _V3.size + 1, _V3.size):
        f = _V3.unpack_from(data, off)
        if f[1] != 3:
            raise ValueError(f"an accounting record of version {f[1]} at byte {off}: only version 3 is read")
        out.append(Record(pid=f[6], start=f[8], cpu_s=(comp_t(f[10]) + comp_t(f[11])) / _HZ,
                          name=f[18].split(b"\0")[0].decode(errors="replace")))
    return out


def watch(out: Path, every: float = 0.2) -> None:
    """Append ``time pid cmdline`` (tab-separated) for each process the first time a sample sees it."""
    seen: set[tuple[int, float]] = set()
    with out.open("a", buffering=1) as f:
        while True:
            for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
                key = (p.info["pid"], p.info["create_time"])
                line = " ".join(" ".join(p.info["cmdline"] or []).split())   # newlines in a -c script too
                if line and key not in seen:
                    seen.add(key)
                    f.write(f"{time.time():.2f}\t{key[0]}\t{line[:300]}\n")
            time.sleep(every)


def by_kind(recs: list[Record], lines: dict[int, list[tuple[float, str]]]) -> dict[str, tuple[float, int]]:
    """Kind -> (CPU seconds, processes). A record takes the line seen for its pid within 3 s of its start
    (pids are reused, and a start time has whole seconds)."""
    total: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in recs:
        line = next((c for t, c in reversed(lines.get(r.pid, [])) if r.start - 3 <= t <= r.start + 3), None)
        k = kind(line.split() if line else [], r.name)
        total[k][0] += r.cpu_s
        total[k][1] += 1
    return {k: (v[0], int(v[1])) for k, v in sorted(total.items(), key=lambda kv: -kv[1][0])}


def report(pacct: Path, cmdlines: Path, since: float = 0, until: float = float("inf")) -> str:
    lines: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for row in cmdlines.read_text(errors="replace").splitlines():
        fields = row.split("\t", 2)
        if len(fields) == 3 and fields[1].isdigit():   # a line cut short when the watch was stopped: skipped
            lines[int(fields[1])].append((float(fields[0]), fields[2]))
    recs = [r for r in records(pacct.read_bytes()) if since <= r.start <= until]
    kinds = by_kind(recs, lines)
    out = [f"{sum(r.cpu_s for r in recs):,.0f} CPU-s in {len(recs):,} processes that ended", "",
           "| kind | CPU-s | processes | each |", "|---|---|---|---|"]
    out += [f"| {k} | {cpu:,.0f} | {n:,} | {cpu / n:.2f} |" for k, (cpu, n) in kinds.items() if cpu >= 1]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"] and len(sys.argv) == 3:
        watch(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["report"] and len(sys.argv) in (4, 6):
        print(report(Path(sys.argv[2]), Path(sys.argv[3]), *map(float, sys.argv[4:])))
    else:
        sys.exit("usage: cpu_by_acct.py watch CMDLINES.tsv | report PACCT CMDLINES.tsv [FROM TO]")
