"""scripts/cpu_by_acct.py reads the kernel's accounting records and names each process by its command line.

The records are packed here as ``struct acct_v3`` is laid out (linux/acct.h), since writing real ones needs
root and ``accton``; the figures in docs/benchmarks.md came from real ones.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import cpu_by_acct  # noqa: E402


def _record(pid: int, start: int, user_ticks: int, sys_ticks: int, name: bytes, version: int = 3) -> bytes:
    return struct.pack("<BBHIIIIIIf8H16s", 0, version, 0, 0, 0, 0, pid, 1, start, 1.0,
                       user_ticks, sys_ticks, 0, 0, 0, 0, 0, 0, name)


def test_comp_t_scales_its_mantissa_by_its_base_8_exponent() -> None:
    assert cpu_by_acct.comp_t(700) == 700
    assert cpu_by_acct.comp_t((2 << 13) | 100) == 100 * 64


def test_records_are_joined_with_the_line_seen_near_their_start_and_summed_by_kind(tmp_path: Path) -> None:
    pacct, lines = tmp_path / "pacct", tmp_path / "cmdlines.tsv"
    pacct.write_bytes(
        _record(10, 1000, 700, 50, b"python")            # a rank: 7.5 s
        + _record(10, 2000, 150, 30, b"python")          # pid 10 again, later: a torchrun agent, 1.8 s
        + _record(11, 1001, 20, 4, b"python")            # an invoker, 0.24 s
        + _record(12, 1002, 3, 0, b"sshd"))              # never sampled: its name's kind
    lines.write_text(
        "1000.5\t10\tpython -m higgsfield.node.entrypoint /home/hfnode0/.hfrt/runs/p/r\n"
        "2001.0\t10\tpython -m torch.distributed.run --nnodes 2 -m higgsfield.node.entrypoint /x\n"
        "1001.2\t11\tpython -m higgsfield invoker --state-dir /tmp/pytest-of-root/p0/state status\n"
        "1003.0\t1")                                     # cut short as the watch stopped
    recs = cpu_by_acct.records(pacct.read_bytes())
    assert [(r.pid, r.start, r.cpu_s, r.name) for r in recs] == [
        (10, 1000, 7.5, "python"), (10, 2000, 1.8, "python"), (11, 1001, 0.24, "python"), (12, 1002, 0.03, "sshd")]
    table = cpu_by_acct.report(pacct, lines)
    assert table.splitlines()[0] == "10 CPU-s in 4 processes that ended"
    assert "| rank (higgsfield.node.entrypoint) | 8 | 1 | 7.50 |" in table
    assert "| torchrun agent | 2 | 1 | 1.80 |" in table
    assert "| sshd |" not in table   # under a second in all: not a row
    kinds = cpu_by_acct.by_kind(recs, {11: [(1001.2, "python -m higgsfield invoker --state-dir "
                                                      "/tmp/pytest-of-root/p0/state status")]})
    assert kinds["invoker (on a node)"] == (0.24, 1)   # not "pytest", whose directory its state is in
    only_late = cpu_by_acct.report(pacct, lines, since=1500)
    assert "torchrun agent" in only_late and "rank" not in only_late


def test_another_accounting_version_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="version 2 at byte 0: only version 3 is read"):
        cpu_by_acct.records(_record(1, 1, 1, 1, b"x", version=2))
