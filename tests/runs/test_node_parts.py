"""Fast tests of the node-side parts: the queue, container names, image tags, deploy unpacking, archives,
the container launcher, pid identity, kill/start races, log reads, the rendezvous port.
(The coordinator, the failure report and the process environment: test_coordination.py.)"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from runs_helpers import exe

from higgsfield.contract.codec import encode
from higgsfield.contract.errors import RunError
from higgsfield.contract.gang import Killed
from higgsfield.contract.ports import PORTS_VAR, RENDEZVOUS_PORTS, free_port, rendezvous_ports
from higgsfield.contract.runspec import Coordinator, RunSpec, StartRequest
from higgsfield.control.backends.nodes.deploy import make_archive
from higgsfield.node.code.deploy import deployed, unpack
from higgsfield.node.gang import listener, queue
from higgsfield.node.observe import logs
from higgsfield.node.runs import start, stop, supervisor
from higgsfield.node.runtime import torchrun
from higgsfield.node.runtime.containers import container_name, image_tag
from higgsfield.node.state import pids
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import NodeRun, Placement
from higgsfield.node.state.records import RunDir, RunRecord, finish, write_json


def _entry(run: str, want: int, order: float, exclusive: bool = False) -> queue.Entry:
    return queue.Entry(project="p", run=run, want=want, exclusive=exclusive, order=order, pid=os.getpid())


def test_queue_fifo_same_slots_wait_disjoint_slots_share(tmp_path: Path) -> None:
    cap = queue.Capacity(4, True)
    a, b, c = _entry("a", 2, 1.0), _entry("b", 2, 2.0), _entry("c", 4, 3.0)
    assert queue.try_acquire(NodeState(tmp_path), a, cap) == [0, 1]
    assert queue.try_acquire(NodeState(tmp_path), b, cap) == [2, 3]          # disjoint GPUs: side by side
    assert queue.try_acquire(NodeState(tmp_path), c, cap) is None            # wants them all: waits
    d = _entry("d", 1, 4.0)
    queue.release(NodeState(tmp_path), "p", "a")
    assert queue.try_acquire(NodeState(tmp_path), d, cap) is None            # FIFO: c is first, d does not overtake
    assert queue.try_acquire(NodeState(tmp_path), c, cap) is None            # b still holds 2 of 4
    queue.release(NodeState(tmp_path), "p", "b")
    assert queue.try_acquire(NodeState(tmp_path), c, cap) == [0, 1, 2, 3]
    queue.release(NodeState(tmp_path), "p", "c")
    assert queue.try_acquire(NodeState(tmp_path), d, cap) == [0]


def test_queue_orders_by_submit_time_not_arrival(tmp_path: Path) -> None:
    cap = queue.Capacity(1, False)
    holder = _entry("h", 1, 0.0)
    assert queue.try_acquire(NodeState(tmp_path), holder, cap) == [0]
    late, early = _entry("late", 1, 5.0), _entry("early", 1, 2.0)
    assert queue.try_acquire(NodeState(tmp_path), late, cap) is None
    assert queue.try_acquire(NodeState(tmp_path), early, cap) is None
    queue.release(NodeState(tmp_path), "p", "h")
    assert queue.try_acquire(NodeState(tmp_path), late, cap) is None         # early was submitted first
    assert queue.try_acquire(NodeState(tmp_path), early, cap) == [0]


def test_queue_exclusive_and_dead_holders(tmp_path: Path) -> None:
    cap = queue.capacity(0)
    assert not cap.gpus and cap.slots == (os.cpu_count() or 1)
    assert queue.wanted(8, False, queue.Capacity(2, False)) == 2    # CPU: at most the node
    assert queue.wanted(1, True, queue.Capacity(2, False)) == 2     # exclusive: the whole node
    ghost = queue.Entry(project="p", run="ghost", want=2, exclusive=True, order=0.0, pid=2 ** 22 + 12345,
                        slots=[0, 1])
    queue._save(NodeState(tmp_path), [ghost])
    me = _entry("me", 2, 1.0, exclusive=True)
    assert queue.try_acquire(NodeState(tmp_path), me, queue.Capacity(2, False)) == [0, 1]  # a dead supervisor's slots free


def test_queue_an_older_run_takes_back_slots_not_yet_committed_never_committed_ones(tmp_path: Path) -> None:
    # Two runs reach two nodes in opposite orders: on this node the younger came first. Neither may keep
    # half of what the other needs, so the older takes back what the younger holds but has not committed.
    cap = queue.Capacity(2, False)
    young = _entry("young", 2, 5.0, exclusive=True)
    assert queue.try_acquire(NodeState(tmp_path), young, cap) == [0, 1]
    old = _entry("old", 2, 1.0, exclusive=True)
    assert queue.try_acquire(NodeState(tmp_path), old, cap) == [0, 1]
    assert queue.holds(NodeState(tmp_path), young, cap) is None and not queue.commit(NodeState(tmp_path), young.key)
    assert queue.commit(NodeState(tmp_path), old.key)
    older = _entry("older", 2, 0.5, exclusive=True)     # committed slots are never taken back
    assert queue.try_acquire(NodeState(tmp_path), older, cap) is None and queue.holds(NodeState(tmp_path), old, cap) == [0, 1]
    queue.uncommit(NodeState(tmp_path), old.key)                   # another node of "old" lost its slots: start over
    assert queue.holds(NodeState(tmp_path), old, cap) is None and queue.try_acquire(NodeState(tmp_path), older, cap) == [0, 1]
    queue.release(NodeState(tmp_path), "p", "older")
    assert queue.try_acquire(NodeState(tmp_path), old, cap) == [0, 1] and queue.holds(NodeState(tmp_path), young, cap) is None
    assert [e.run for e in queue.snapshot(NodeState(tmp_path))] == ["old", "young"]


def _node_run(tmp_path: Path, *, placement: dict[str, object] | None = None, **spec: object) -> NodeRun:
    """Run p/r of experiment e on node n (node 0 of 1, process runtime), as ``start`` pins and places it."""
    fields: dict[str, object] = {
        "project": "p", "experiment": "e", "run": "r", "module": "m", "code_dir": str(tmp_path), "params": {},
        "node": "n", "node_rank": 0, "nodes": ("n",), "master_addr": "127.0.0.1", "submitted_at": time.time(),
        "nproc": 1, "runtime": "process", "coordinator": Coordinator("127.0.0.1", 9, "n"), **spec}
    where: dict[str, object] = {"gpus": 0, "cache_dir": str(tmp_path / "cache"),
                                "checkpoint_dir": str(tmp_path / "cache" / "ckpt"), "container": "hf-p-e-r-n",
                                **(placement or {})}
    return NodeRun(RunSpec(**fields), Placement(**where))  # type: ignore[arg-type]


def test_the_process_runtime_gives_torchrun_a_minimal_environment(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "p", "r")
    spec = _node_run(tmp_path)
    base = {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": "u",
            "SSH_AUTH_SOCK": "/tmp/agent", "AWS_SECRET_ACCESS_KEY": "leak", "PYTHONPATH": "/elsewhere",
            "HIGGSFIELD_DEBUG": "1"}
    env = torchrun.process_env(spec, rd, {"HF_TOKEN": "s3"}, [1, 2], base=base)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": "u",
                   "HF_TOKEN": "s3", "CUDA_VISIBLE_DEVICES": "1,2", **torchrun.run_vars(spec, rd)}


def test_container_names_carry_node_and_are_valid() -> None:
    n = container_name("my_llama", "alpaca", "alpaca-20250101-x", "gpu-1.example.com:2201")
    assert n == "hf-my_llama-alpaca-alpaca-20250101-x-gpu-1.example.com_2201"
    assert container_name("p", "e", "r", "127.0.0.2") != container_name("p", "e", "r", "127.0.0.3")
    long = container_name("p", "e", "r" * 300, "n")
    assert len(long) <= 200


def test_image_tag_hashes_dockerfile_requirements_and_base(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    t1 = image_tag("My_Proj", tmp_path)
    assert t1.startswith("hf-my_proj:") and len(t1.split(":")[1]) == 12
    (tmp_path / "src.py").write_text("code changes never change the tag\n")
    assert image_tag("My_Proj", tmp_path) == t1
    (tmp_path / "requirements.txt").write_text("numpy\n")
    t2 = image_tag("My_Proj", tmp_path)
    assert t2 != t1
    assert image_tag("My_Proj", tmp_path, base_image="other") != t2


def _tar(files: dict[str, bytes], links: dict[str, str] | None = None,
         then: dict[str, bytes] | None = None) -> io.BytesIO:
    """A tar of ``files``, then the symlinks ``links``, then the files ``then`` (in that order)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(entries: dict[str, bytes]) -> None:
            for name, data in entries.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        add(files)
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        add(then or {})
    buf.seek(0)
    return buf


def test_unpack_swaps_atomically_and_verifies(tmp_path: Path) -> None:
    info = unpack(NodeState(tmp_path), "p", "a" * 40, _tar({"src/x.py": b"1"}))
    assert info.commit == "a" * 40 and Path(str(info.code_dir), "src", "x.py").read_bytes() == b"1"
    info2 = unpack(NodeState(tmp_path), "p", "b" * 40, _tar({"src/x.py": b"2"}))
    assert (deployed(NodeState(tmp_path), "p") or info).commit == "b" * 40
    assert (tmp_path / "projects/p/code/src/x.py").read_bytes() == b"2"
    assert Path(str(info.code_dir)).is_dir() and info2.code_dir != info.code_dir  # old release kept
    for i in range(5):
        unpack(NodeState(tmp_path), "p", f"{i}" * 40, _tar({"f": b""}))
    assert len(list((tmp_path / "projects/p/releases").iterdir())) == 3  # pruned


@pytest.mark.parametrize("files,links,then", [
    ({"../evil": b"x"}, None, None), ({"/abs": b"x"}, None, None),
    ({}, {"out": "../../../etc/passwd"}, None),
    # a chain of links, each "inside" on paper: deep/e/a is deep itself, so deep/e/a/l points out of the tree
    ({"deep/e/keep": b""}, {"deep/e/a": "..", "deep/e/a/l": "../../../releases"}, {"deep/e/a/l/pwned": b"x"}),
])
def test_unpack_refuses_paths_out_of_the_tree(tmp_path: Path, files: dict[str, bytes],
                                              links: dict[str, str] | None, then: dict[str, bytes] | None) -> None:
    with pytest.raises(RunError, match="refusing"):
        unpack(NodeState(tmp_path), "p", "c" * 40, _tar(files, links, then))
    assert deployed(NodeState(tmp_path), "p") is None
    assert not (tmp_path / "evil").exists()
    assert [p for p in tmp_path.rglob("pwned")] == []


def test_archive_head_or_dirty_tree(tmp_path: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*a: str) -> str:
        return subprocess.run([exe("git"), *a], cwd=tmp_path, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("committed\n")
    (tmp_path / ".gitignore").write_text("env\n")
    git("add", "-A")
    git("commit", "-qm", "x")
    (tmp_path / "a.py").write_text("changed\n")
    (tmp_path / "new.py").write_text("untracked\n")
    (tmp_path / "env").write_text("SECRET=1\n")
    data, commit = make_archive(tmp_path)
    assert commit == git("rev-parse", "HEAD")
    names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert "a.py" in names and "new.py" not in names and "env" not in names
    data, label = make_archive(tmp_path, dirty=True)
    assert label.startswith(commit + "-dirty-")
    tar = tarfile.open(fileobj=io.BytesIO(data))
    assert sorted(tar.getnames()) == [".gitignore", "a.py", "new.py"]           # never the ignored env
    assert tar.extractfile("a.py").read() == b"changed\n"
    assert make_archive(tmp_path, dirty=True)[1] == label                      # same tree, same label


def test_container_launcher_takes_secrets_from_stdin_into_the_environment(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    code = "import os, sys; print(len(os.environ['HF_S']), os.environ['KEEP'], sys.stdin.read() == '')"
    r = subprocess.run([sys.executable, "-m", "higgsfield.node.runtime.launch", str(log), "--", sys.executable, "-c", code],
                       input=json.dumps({"HF_S": "s3cr3t", "KEEP": "secret-loses"}) + "\n" + "not for the run\n",
                       env={**os.environ, "KEEP": "run-var-wins"}, text=True, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr + log.read_text()
    assert log.read_text() == "6 run-var-wins True\n"      # stdin is /dev/null for the run itself
    assert "s3cr3t" not in r.stdout + r.stderr + log.read_text()


def test_queue_and_records_do_not_trust_a_reused_pid(tmp_path: Path) -> None:
    me = pids.start_time(os.getpid())
    assert me is not None and pids.alive(os.getpid(), me)
    assert not pids.alive(os.getpid(), me + 1) and pids.find(os.getpid(), me + 1) is None
    assert pids.find(os.getpid(), me) is not None and pids.start_time(2 ** 22 + 12345) is None
    # a queue holder whose pid now names another process (this one) holds nothing
    stale = queue.Entry(project="p", run="old", want=1, exclusive=False, order=0.0, pid=os.getpid(),
                        pid_start=me - 1, slots=[0])
    queue._save(NodeState(tmp_path), [stale])
    assert queue.try_acquire(NodeState(tmp_path), _entry("new", 1, 1.0), queue.Capacity(1, False)) == [0]


def test_refresh_and_kill_never_signal_a_reused_supervisor_pid(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        rd = RunDir(NodeState(tmp_path), "p", "r")
        rd.logs.mkdir(parents=True)
        start = pids.start_time(bystander.pid)
        assert start is not None
        rec = RunRecord(project="p", experiment="e", run="r", node="n", node_rank=0, nnodes=1, nproc=1,
                        state="running", pids={"supervisor": bystander.pid, "launcher": bystander.pid},
                        pid_starts={"supervisor": start - 5, "launcher": start - 5}, created_at=time.time() - 60)
        rd.write(rec)
        write_json(rd.spec_path, {"project": "p", "run": "r"})
        assert stop.refresh(rd).state == "failed"          # its supervisor is gone: the pid is someone else's
        rd.write(rec)
        assert stop.kill(NodeState(tmp_path), "p", "r", grace=0.3).state == "killed"
        assert bystander.poll() is None, "kill signalled an unrelated process that reused the pid"
    finally:
        bystander.kill()
        bystander.wait()


def test_ending_a_process_ends_what_it_started_even_in_another_session_and_even_ignoring_sigterm(
        tmp_path: Path) -> None:
    # torchrun's workers run in sessions of their own, and a rank may ignore SIGTERM (it saves a checkpoint)
    child = ("import os, signal, time; os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(60)")
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    parent = subprocess.Popen([sys.executable, "-c", spawn], env={**os.environ, "PIDFILE": str(tmp_path / "child")},
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        kid = int((tmp_path / "child").read_text())
        proc = pids.find(parent.pid, pids.start_time(parent.pid))
        assert proc is not None
        t0 = time.monotonic()
        assert pids.end([proc], grace=0.5) == []
        assert time.monotonic() - t0 < 5 and parent.wait(5) is not None and not pids.alive(kid)
    finally:
        parent.kill()
        parent.wait()


def _supervisor(tmp_path: Path, *, placement: dict[str, object] | None = None,
                **spec: object) -> tuple[supervisor.Supervisor, RunDir]:
    """A supervisor of run p/r on node n (not connected to any coordinator: nothing listens on port 9)."""
    rd = RunDir(NodeState(tmp_path), "p", "r")
    rd.make()
    rd.write(RunRecord(project="p", experiment="e", run="r", node="n", node_rank=0, nnodes=1, nproc=1,
                       state="starting"))
    run = _node_run(tmp_path, placement=placement, **spec)
    run.write(rd.spec_path)
    assert NodeRun.read(rd.spec_path) == run      # spec.json reads back as it was written
    return supervisor.Supervisor(rd, run, {}, "t" * 64), rd


def test_a_kill_landing_just_after_torchrun_starts_still_stops_it(tmp_path: Path) -> None:
    sup, rd = _supervisor(tmp_path, placement={"stop_grace": 1.0})
    handle = torchrun.ProcessRun([sys.executable, "-c", "import time; time.sleep(30)"], rd, cwd=None,
                                 env=dict(os.environ))
    rd.kill_marker.touch()       # the kill arrived while torchrun started, before its pid was recorded
    t0 = time.monotonic()
    rc, cause = sup._watch(handle)
    assert time.monotonic() - t0 < 10 and rc != 0 and cause == Killed()
    assert handle.poll() is not None


def test_a_supervisor_without_its_coordinator_fails_the_run_naming_node_0(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "JOIN_S", 1.0)   # nothing listens on port 9
    sup, rd = _supervisor(tmp_path, nodes=("n0", "n"), node_rank=1)
    queue_state = NodeState(tmp_path)
    assert sup.run() == 0
    rec = rd.read()
    assert rec.state == "failed" and rec.failed_node == "n0" and "cannot reach the run's coordinator" in rec.reason
    assert queue.snapshot(queue_state) == []          # it never held slots it could leak


def test_two_starts_of_one_run_name_at_once_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeSupervisor:
        pid = os.getpid()
        stdin = io.BytesIO()

    def slow_gpus() -> int:
        time.sleep(0.5)  # widens the window between the "already active?" check and the record
        return 0

    monkeypatch.setattr(start, "detect_gpus", slow_gpus)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: FakeSupervisor())
    spec = RunSpec(project="p", experiment="e", run="same", module="m", code_dir=str(tmp_path), params={},
                   node="n", node_rank=0, nodes=("n",), master_addr="127.0.0.1", submitted_at=time.time(),
                   nproc=1, runtime="process")
    barrier = threading.Barrier(2)

    def start_one() -> str:
        barrier.wait()
        try:
            start.start_run(NodeState(tmp_path / "state"), StartRequest(spec))
            return "started"
        except RunError as e:
            return str(e)

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(lambda _: start_one(), range(2)))
    assert outcomes[1] == "started" and "already starting" in outcomes[0], outcomes


@pytest.mark.parametrize("payload,words", [
    ("spec-99", "run spec version 99 is not the version this node's higgsfield reads (1): the nodes are older "
                "than this higgsfield; upgrade them with 'higgsfield setup'"),
    ("{not json", "the run request on stdin is not JSON"),
])
def test_a_start_the_node_cannot_read_is_refused_in_one_line_and_writes_nothing(tmp_path: Path, payload: str,
                                                                                 words: str) -> None:
    if payload == "spec-99":
        spec = {**encode(_node_run(tmp_path).spec), "version": 99}
        payload = json.dumps({"spec": spec, "secrets": {"HF_S": "s3cr3t"}, "token": "t" * 64})
    state = tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(state), "start"],
                       input=payload, capture_output=True, text=True, timeout=60)
    # what the control side shows as the node's error: the last line of stderr (remote.base.Result.check)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {words}\n")
    assert not (state / "runs").exists()


def test_logs_are_read_in_bounded_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rd = RunDir(NodeState(tmp_path), "p", "r")
    rd.logs.mkdir(parents=True)
    lines = [f"line {i} " + "x" * 100 for i in range(30000)]   # ~3.2 MB
    rd.rank_log(0).write_text("\n".join(lines) + "\n")
    sizes: list[int] = []
    real_open = open

    class Spy:
        def __init__(self, f: io.BufferedReader) -> None:
            self.f = f

        def __enter__(self) -> Spy:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def seek(self, n: int) -> int:
            return self.f.seek(n)

        def read(self, n: int = -1) -> bytes:
            sizes.append(n)
            return self.f.read(n)

    monkeypatch.setattr(logs, "open", lambda p, mode="r": Spy(real_open(p, mode)), raising=False)
    got = [text for _, text in logs.read_lines(rd)]
    assert got == lines
    assert sizes and all(0 < n <= logs.READ_CHUNK for n in sizes), sizes[:5]


def test_a_node_names_its_own_rendezvous_range_and_a_bad_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's firewall may open another range than 29500-29599 (the test bed gives each host its own)."""
    assert rendezvous_ports({}) == RENDEZVOUS_PORTS
    assert rendezvous_ports({PORTS_VAR: " 30010-30019 "}) == (30010, 30019)
    for bad in ("30010", "a-b", "30019-30010", "80-90", "30000-70000", "-"):
        with pytest.raises(RunError, match=rf"^{PORTS_VAR}='.*' on this node is no port range: give it as LOW-HIGH"):
            rendezvous_ports({PORTS_VAR: bad})
    monkeypatch.setenv(PORTS_VAR, "30010-30019")
    assert {free_port() for _ in range(20)} <= set(range(30010, 30020))   # torchrun's port
    sock = listener.listen()                                                # the coordinator's
    try:
        assert 30010 <= sock.getsockname()[1] <= 30019
    finally:
        sock.close()


def test_free_port_is_in_the_rendezvous_range_and_skips_reserved_and_bound(tmp_path: Path) -> None:
    lo, hi = RENDEZVOUS_PORTS
    with socket.socket() as s:
        s.bind(("", 0))
        busy = s.getsockname()[1]
        assert free_port(ports=(busy, busy + 1)) != busy          # a bound port is skipped
    first = free_port()
    assert lo <= first <= hi
    assert free_port(reserved={first}) != first
    # two runs of node 0 reserve distinct rendezvous ports (kept in the queue until they end)
    cap = queue.Capacity(2, False)
    for run in ("a", "b"):
        assert queue.try_acquire(NodeState(tmp_path), _entry(run, 1, 1.0), cap) is not None
    pa, pb = queue.reserve_port(NodeState(tmp_path), ("p", "a")), queue.reserve_port(NodeState(tmp_path), ("p", "b"))
    assert pa != pb and queue.reserved_ports(NodeState(tmp_path)) == {pa, pb}
    assert queue.reserve_port(NodeState(tmp_path), ("p", "a")) != pb       # re-reserving never takes another run's
    queue.release(NodeState(tmp_path), "p", "b")
    again = queue.reserve_port(NodeState(tmp_path), ("p", "a"))
    assert queue.reserved_ports(NodeState(tmp_path)) == {again}
    # the coordinator's port: in the range, bound (so no one else gets it), never a reserved one
    with listener.listen(reserved=set(range(lo, hi - 1))) as sock:
        port = sock.getsockname()[1]
        assert port in (hi - 1, hi) or not lo <= port <= hi
        assert port not in {free_port(ports=(port, port))}
    with socket.socket() as a:   # a whole range busy: an ephemeral port instead
        a.bind(("", 0))
        p = a.getsockname()[1]
        assert free_port(ports=(p, p)) != p


def test_a_docker_engine_going_away_mid_run_fails_the_run_with_the_reason(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import docker
    import requests

    from higgsfield.node.runtime import containers

    sent: list[bytes] = []

    class Sock:
        def sendall(self, data: bytes) -> None:
            sent.append(data)

        def close(self) -> None:
            pass

    class Container:
        id = "c1"

        def start(self) -> None:
            pass

        def wait(self, timeout: float | None = None) -> dict[str, int]:
            raise requests.exceptions.ConnectionError("Connection aborted: the daemon restarted")

        def remove(self, force: bool = False) -> None:
            raise requests.exceptions.ConnectionError("still down")

    class Client:
        closed = False

        class containers:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def get(name: str) -> None:
                raise docker.errors.NotFound("no stale one")

            @staticmethod
            def create(*a: object, **kw: object) -> Container:
                assert "environment" in kw and "HF_S" not in kw["environment"]  # type: ignore[operator]
                return Container()

        class api:  # noqa: N801
            @staticmethod
            def attach_socket(cid: str, params: dict[str, int]) -> Sock:
                return Sock()

        def close(self) -> None:
            Client.closed = True

    monkeypatch.setattr(containers, "client", lambda timeout=None: Client())
    sup, rd = _supervisor(tmp_path, runtime="docker", placement={"image": "img"})
    handle = containers.ContainerRun(sup.node_run, rd, ["python", "-m", "torch.distributed.run"],
                                     torchrun.container_env(sup.node_run, rd), secrets={"HF_S": "s3cr3t"})
    assert sent == [b'{"HF_S": "s3cr3t"}\n']
    rc, cause = sup._watch(handle)
    assert isinstance(rc, str) and "lost the Docker engine" in rc and cause is None and Client.closed
    final = finish(rd, "failed", None, sup._own_failure(rc))
    assert final.state == "failed" and "lost the Docker engine" in (final.reason or "") and final.failed_node == "n"
