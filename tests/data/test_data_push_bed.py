"""``higgsfield data push`` on three real sshd nodes (hfnode27..29), end to end.

One project, one tree (smaller than the issue's 200 MB / 1,000 files, for the suite's time budget;
bench/data_push.py uses the issue's sizes): the push lands the same bytes on every node; a re-push
sends 0 bytes; a changed file is the only one sent; a laptop SIGKILLed mid-push leaves the old
version whole and current, and the next push completes; a run reads its entry through
``params.data`` and ``HIGGSFIELD_DATA_CORPUS``, in Docker (mounted read-only) and in the process runtime
(its node path, read-only by its modes); a node with a stale copy
is refused by ``run`` (exit 2); an ``s3://`` entry comes from moto's server, fetched on node 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from runs_helpers import Cluster, wait_for

INDICES = (27, 28, 29)   # the hosts of ``data_cluster`` (conftest.py)

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

FILES = 200
SIZE = 40_000           # 8 MB in all
STATE = ".hfrt"

READER = '''\
import hashlib
import os
from pathlib import Path

from higgsfield.experiment import experiment


@experiment("readdata")
def readdata(params):
    root = Path(params.data["corpus"])
    assert os.environ["HIGGSFIELD_DATA_CORPUS"] == str(root)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    try:
        (root / "f0000.bin").write_bytes(b"x")
        writable = "yes"
    except OSError:
        writable = "no"
    print(f"rank={params.rank} data={h.hexdigest()} writable={writable} path={root}", flush=True)
'''


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def _node_entry(i: int, name: str = "corpus") -> Path:
    return Path(f"/home/hfnode{i}") / STATE / "data" / "hfdata" / "entries" / name / "current"


def _push(c: Cluster, *args: str, timeout: float = 120) -> dict:  # type: ignore[type-arg]
    r = c.hf("data", "push", "--json", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def project(data_cluster: Cluster) -> Cluster:
    c = data_cluster
    for i in INDICES:   # the nodes keep data between sessions: each session starts from none
        shutil.rmtree(Path(f"/home/hfnode{i}") / STATE / "data" / "hfdata", ignore_errors=True)
    corpus = c.dir / "corpus"
    for i in range(FILES):
        sub = corpus / f"d{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub if i % 2 else corpus).joinpath(f"f{i:04d}.bin").write_bytes(os.urandom(SIZE))
    (c.dir / "src" / "readdata.py").write_text(READER)
    with open(c.dir / "higgsfield.yml", "a") as f:
        f.write("data:\n  corpus: ./corpus\n")
    (c.dir / ".gitignore").write_text("env\n.higgsfield/\ncorpus/\n")
    subprocess.run(["git", "add", "-A"], cwd=c.dir, check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "data"], cwd=c.dir,
                   check=True, capture_output=True)
    return c


@pytest.mark.timeout(240)
def test_push_repush_change_and_a_killed_push(project: Cluster) -> None:
    c = project
    corpus = c.dir / "corpus"
    first = _push(c)
    assert first["uplink_bytes"] == FILES * SIZE            # each byte over the uplink once...
    vias = {n["node"]: n["via"] for n in first["nodes"]}
    assert vias == {"hfnode27": "laptop", "hfnode28": "hfnode27", "hfnode29": "hfnode28"}  # ...the nodes copy
    want = _tree_digest(corpus)
    for i in INDICES:
        assert _tree_digest(_node_entry(i)) == want

    again = _push(c)
    assert again["uplink_bytes"] == 0 and {n["state"] for n in again["nodes"]} == {"up to date"}

    new = os.urandom(700)   # bytes no node holds (objects are content-addressed)
    (corpus / "f0000.bin").write_bytes(new)
    changed = _push(c)
    assert changed["uplink_bytes"] == 700
    assert all(n["bytes"] == 700 for n in changed["nodes"])
    for i in INDICES:
        assert (_node_entry(i) / "f0000.bin").read_bytes() == new

    # a push cut by SIGKILL: the old version stays whole and current; the next push completes
    before = {i: os.readlink(_node_entry(i)) for i in INDICES}
    big = corpus / "big"
    big.mkdir()
    for k in range(12):
        (big / f"b{k}.bin").write_bytes(os.urandom(4 << 20))
    objects = Path("/home/hfnode27") / STATE / "data" / "hfdata" / "objects"
    count0 = sum(1 for _ in objects.glob("??/*"))
    proc = c.popen("data", "push")
    wait_for(lambda: sum(1 for _ in objects.glob("??/*")) > count0 or proc.poll() is not None, 90,
             "the first objects of the push on hfnode27")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    for i in INDICES:
        assert os.readlink(_node_entry(i)) == before[i]          # still the old version, whole
        assert not (_node_entry(i) / "big").exists()
    resumed = _push(c, timeout=180)
    assert 0 < resumed["uplink_bytes"] < 12 * (4 << 20)        # only what the cut push had not stored
    want = _tree_digest(corpus)
    for i in INDICES:
        assert _tree_digest(_node_entry(i)) == want


@pytest.mark.timeout(300)
def test_a_run_reads_its_entry_and_a_stale_copy_is_refused(project: Cluster) -> None:
    c = project
    _push(c)
    c.hf("deploy", check=True, timeout=240)
    r = c.hf("run", "readdata", timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    want = _tree_digest(c.dir / "corpus")
    lines = [ln for ln in r.stdout.splitlines() if "data=" in ln]
    assert len(lines) == 3 and all(f"data={want}" in ln and "writable=no" in ln for ln in lines), r.stdout[-2000:]

    # The process runtime (the bed's node interpreter: no project venv to build): the same bytes at the node's own
    # path, read-only there too (files 0444, directories 0555), not only through Docker's read-only mount.
    yml = c.dir / "higgsfield.yml"
    old = yml.read_text()
    yml.write_text(old.replace("runtime: docker", "runtime: process"))
    try:
        r = c.hf("run", "readdata", timeout=180)
    finally:
        yml.write_text(old)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if "data=" in ln]
    assert len(lines) == 3 and all(f"data={want}" in ln and "writable=no" in ln for ln in lines), r.stdout[-2000:]
    for i in INDICES:
        entry = _node_entry(i).resolve()
        assert any(f"path={entry}" in ln and f"hfnode{i}" in ln for ln in lines), (entry, lines)

    (c.dir / "corpus" / "f0002.bin").write_bytes(b"new")      # changed here, not pushed
    r = c.hf("run", "readdata", timeout=120)
    assert r.returncode == 2, (r.stdout + r.stderr)[-2000:]
    assert "stale" in r.stderr and "hfnode27" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _push(c)["uplink_bytes"] == 3    # pushed, the run is admitted again
