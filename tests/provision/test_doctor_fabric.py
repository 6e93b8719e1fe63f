"""``doctor --fabric`` on three real test-bed nodes (hfnode24..26, 127.0.0.26-28), the process runtime.

The project is ``fabric_cluster`` (conftest.py), deployed once for this module and test_drift_bed.py;
each test here leaves it as it found it (the link unthrottled, the process runtime deployed).

One benchmark run through the CLI, as a user starts it, checked for several things at once
(the bed's time is scarce): the all-reduce table from 8 B to 64 MiB with time, algbw, busbw
and latency each positive and busbw = algbw x 2(n-1)/n; each node's own figures (its best
link, its checkpoint directory's write throughput, "n/a" for GPUs on these CPU nodes); every
pair measured; no node named slow on an even fabric; the JSON's figures are the table's
(the same result rendered as the table prints it); the benchmark is a run like any other
(``status`` lists it, succeeded, experiment ``higgsfield_fabric``).

Then one node's link is slowed for real (:func:`_slowed`: everything hfnode25's processes send
goes through a ``tbf`` on the loopback device), and ``run --nodes 2 --preflight`` on the three
nodes tests the fabric first, names hfnode25 slow with its figures, passes it over and runs on
the two healthy ones (hfnode24 and hfnode26). Why not a network namespace behind a veth pair:
this machine's hostname resolves to 127.0.0.1, which gloo binds for its data connections on every node, so a node in
its own namespace would listen on its own private 127.0.0.1 that the others cannot reach.
The outlier rule itself is unit-tested in tests/provision/test_doctor_fabric_rule.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runs"))  # runs_helpers (tests/ has no packages)

from runs_helpers import Cluster, exe  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.quiet]   # it measures the machine's links

INDICES = (24, 25, 26)   # the hosts of ``fabric_cluster`` (conftest.py)


def _git(d: Path, *args: str) -> None:
    subprocess.run([exe("git"), *args], cwd=d, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def _table_numbers(result: Any) -> str:
    from rich.console import Console

    from higgsfield.control.cli._fabric_table import render

    buf = io.StringIO()
    render(Console(file=buf, width=200, color_system=None), result)
    return buf.getvalue()


@pytest.mark.timeout(600)   # the first test pays for the cluster's deploy (about 2 min on a fresh bed)
def test_fabric_reports_sizes_bandwidths_latency_nodes_and_pairs(fabric_cluster: Cluster) -> None:
    from higgsfield.contract.codec import decode
    from higgsfield.contract.fabric import FabricResult, sizes

    c = fabric_cluster
    t0 = time.monotonic()
    r = c.hf("doctor", "--fabric", "--json", timeout=240)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    d = json.loads(r.stdout)
    print(f"\ndoctor --fabric (3 nodes, process runtime): {took:.1f}s; "
          f"latency {d['latency_us']:.0f} us, peak busbw {d['peak_busbw_gbps']:.3f} GB/s")

    # the sweep: 8 B .. 64 MiB, every figure positive, busbw from algbw as nccl-tests has it
    assert d["backend"] == "gloo" and d["world_size"] == 3
    assert d["nodes"] == [f"hfnode{i}" for i in INDICES]
    assert [row["bytes"] for row in d["allreduce"]] == sizes(8, 64 << 20)
    for row in d["allreduce"]:
        assert row["time_us"] > 0 and row["algbw_gbps"] > 0 and row["busbw_gbps"] > 0, row
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 2 / 3)
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
    assert d["latency_us"] == d["allreduce"][0]["time_us"] > 0

    # each node's own figures; every pair once; an even fabric names nobody
    assert [n["node"] for n in d["per_node"]] == d["nodes"]
    for n in d["per_node"]:
        assert n["link_busbw_gbps"] > 0 and n["ckpt_write_mbps"] > 0, n
        assert n["gpus"] is None and n["intra_busbw_gbps"] is None  # CPU nodes, one rank each: "n/a"
    assert sorted((p["a"], p["b"]) for p in d["pairs"]) == [("hfnode24", "hfnode25"), ("hfnode24", "hfnode26"),
                                                              ("hfnode25", "hfnode26")]
    assert all(p["busbw_gbps"] > 0 and p["time_us"] > 0 for p in d["pairs"])
    assert d["outliers"] == []

    # the JSON is the table: the same decoded result, printed as the table, shows each JSON figure
    result = decode(FabricResult, d)
    table = _table_numbers(result)
    for row in d["allreduce"]:
        assert f"{row['time_us']:.1f}" in table and f"{row['busbw_gbps']:.3f}" in table
        assert f"{row['algbw_gbps']:.3f}" in table
    for p in d["pairs"]:
        assert f"{p['a']} - {p['b']}" in table and f"{p['busbw_gbps']:.3f}" in table
    assert f"latency {d['latency_us']:.1f} us" in table

    # the benchmark went through the run path: a run like any other, succeeded
    st = {x["run"]: x for x in json.loads(c.hf("status", "--json", timeout=120).stdout)["runs"]}
    assert st[d["run"]]["experiment"] == "higgsfield_fabric" and st[d["run"]]["state"] == "succeeded"


SLOW_RATE = "500mbit"   # the healthy loopback pairs here measure 0.5-1 GB/s; this one is capped at 0.0625


def _tc(*args: str, check: bool = True) -> None:
    subprocess.run([exe("tc"), *args], check=check, capture_output=True)


@contextlib.contextmanager
def _slowed(user: str) -> Iterator[None]:
    """Everything ``user``'s processes send over loopback leaves through a tbf at :data:`SLOW_RATE`.

    htb on ``lo``: everyone else's traffic goes to a 100 Gbit class (no limit in practice), and
    iptables' CLASSIFY (matched on the owner's uid) puts the user's packets in the throttled
    class. This kernel has tbf and htb but neither netem nor the fw/u32 classifiers. All undone in ``finally``.
    """
    uid = str(pwd.getpwnam(user).pw_uid)
    rule = ["OUTPUT", "-m", "owner", "--uid-owner", uid, "-j", "CLASSIFY", "--set-class", "1:20"]
    try:
        _tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10", "r2q", "1000")
        _tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit", "burst", "10mb")
        _tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", SLOW_RATE,
            "burst", "256kb")
        _tc("qdisc", "add", "dev", "lo", "parent", "1:20", "handle", "20:", "tbf", "rate", SLOW_RATE,
            "burst", "256kb", "latency", "400ms")
        subprocess.run([exe("iptables"), "-t", "mangle", "-A", *rule], check=True, capture_output=True)
        yield
    finally:
        subprocess.run([exe("iptables"), "-t", "mangle", "-D", *rule], check=False, capture_output=True)
        _tc("qdisc", "del", "dev", "lo", "root", check=False)


@pytest.mark.timeout(300)
def test_run_preflight_names_the_slowed_node_passes_it_over_and_runs_on_the_healthy_two(
        fabric_cluster: Cluster) -> None:
    c = fabric_cluster
    run = f"pre-{os.urandom(3).hex()}"
    with _slowed("hfnode25"):
        t0 = time.monotonic()
        r = c.hf("run", "probe", "--nodes", "2", "--preflight", "--run-name", run, timeout=240)
        took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    line = next((x for x in out.splitlines() if x.startswith("passed over hfnode25: slow in the fabric preflight")),
                None)
    assert line is not None, out[-4000:]
    assert "hfnode25 is slow: its best link" in line and "GB/s busbw against the median node's" in line
    print(f"\nrun --nodes 2 --preflight, hfnode25 at {SLOW_RATE}: {took:.1f}s; {line}")
    st = {x["run"]: x for x in json.loads(c.hf("status", "--json", timeout=120).stdout)["runs"]}
    assert st[run]["state"] == "succeeded" and sorted(st[run]["nodes"]) == ["hfnode24", "hfnode26"], st[run]
    # the same preflight's result, kept on hfnode24: the dashboard's Nodes view marks hfnode25 (tests/ui/fabric_page.py)
    sys.path.insert(0, str(HERE.parent / "ui"))
    from fabric_page import check_fabric_marks
    print(f"dashboard: hfnode25 marked slow {check_fabric_marks(c.dir, [f'hfnode{i}' for i in INDICES], 'hfnode25'):.1f}s"
          " after the page opened")


@pytest.mark.timeout(300)
def test_fabric_in_docker_reports_the_same_figures(fabric_cluster: Cluster) -> None:
    """The Docker runtime: the benchmark runs in each node's container (host network), figures as above.

    The cluster is shared (conftest.py): ``finally`` switches it back to the process runtime and deploys
    that again (the venvs are still there: seconds), so the tests after this one find it as it was."""
    from higgsfield.contract.fabric import sizes

    c = fabric_cluster
    yml = c.dir / "higgsfield.yml"
    yml.write_text(yml.read_text().replace("runtime: process\n", "runtime: docker\n"))
    _git(c.dir, "commit", "-qam", "runtime docker")
    try:
        t0 = time.monotonic()
        c.hf("deploy", check=True, timeout=600)
        deployed = time.monotonic() - t0
        r = c.hf("doctor", "--fabric", "--json", "--max-bytes", str(1 << 20), timeout=240)
        assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
        d = json.loads(r.stdout)
        print(f"\ndocker: deploy {deployed:.1f}s, doctor --fabric (1 MiB max) {time.monotonic() - t0 - deployed:.1f}s")
        assert d["nodes"] == [f"hfnode{i}" for i in INDICES] and d["backend"] == "gloo"
        assert [row["bytes"] for row in d["allreduce"]] == sizes(8, 1 << 20)
        assert all(row["busbw_gbps"] > 0 and row["time_us"] > 0 for row in d["allreduce"])
        assert len(d["pairs"]) == 3 and all(n["ckpt_write_mbps"] > 0 for n in d["per_node"])
        assert d["outliers"] == []
    finally:
        yml.write_text(yml.read_text().replace("runtime: docker\n", "runtime: process\n"))
        _git(c.dir, "commit", "-qam", "runtime process")
        c.hf("deploy", check=True, timeout=600)
