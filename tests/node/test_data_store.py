"""The node's data store: objects verified as they arrive, versions made current atomically, peer copies
authenticated by the gang wire's handshake (a wrong token gets nothing), prune keeps the current version."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from higgsfield.contract.codec import encode
from higgsfield.contract.data import CommitRequest, DataError, DataFile, FetchRequest, Manifest, ServeRequest
from higgsfield.node.data.peer import fetch, serve
from higgsfield.node.data.store import Store, data_variables
from higgsfield.node.state.home import NodeState

pytestmark = pytest.mark.timeout(60)


def _stream(blobs: list[bytes], *, lie: bool = False) -> io.BytesIO:
    out = b""
    for b in blobs:
        sha = hashlib.sha256(b"other" if lie else b).hexdigest()
        out += json.dumps({"sha256": sha, "size": len(b)}).encode() + b"\n" + b
    return io.BytesIO(out)


def _manifest(files: dict[str, bytes]) -> Manifest:
    return Manifest(files=[DataFile(path=p, size=len(b), sha256=hashlib.sha256(b).hexdigest())
                           for p, b in sorted(files.items())])


def test_receive_commit_and_run_paths(tmp_path: Path) -> None:
    home = NodeState(tmp_path)
    store = Store(home, "demo")
    files = {"a.txt": b"hello", "sub/b.bin": os.urandom(3000)}
    got = store.receive(_stream(list(files.values())))
    assert got.stored == 2
    m = _manifest(files)
    done = store.commit(CommitRequest(name="corpus", manifest=m))
    assert done.built and done.current == m.version()
    root = Path(done.path)
    assert (root / "sub" / "b.bin").read_bytes() == files["sub/b.bin"]
    assert not (root / "a.txt").stat().st_mode & 0o222 and not (root / "sub").stat().st_mode & 0o222  # read-only
    env = data_variables(home, "demo")
    assert env["HIGGSFIELD_DATA_CORPUS"] == str(root)
    assert json.loads(env["HIGGSFIELD_DATA"]) == {"corpus": str(root)}
    # a new version: the link swaps, the old one stays until prune
    files2 = {**files, "a.txt": b"hello again"}
    store.receive(_stream([files2["a.txt"]]))
    done2 = store.commit(CommitRequest(name="corpus", manifest=_manifest(files2)))
    assert store.current("corpus") == done2.current != done.current
    pruned = store.prune()
    assert pruned.removed == [f"corpus/{done.current}"] and pruned.objects == 1
    assert (Path(done2.path) / "sub" / "b.bin").exists()


def test_a_lying_or_cut_stream_stores_nothing_and_commit_refuses(tmp_path: Path) -> None:
    store = Store(NodeState(tmp_path), "demo")
    with pytest.raises(DataError, match="other bytes"):
        store.receive(_stream([b"abc"], lie=True))
    cut = _stream([b"x" * 1000]).getvalue()[:-10]
    with pytest.raises(DataError, match="ended inside"):
        store.receive(io.BytesIO(cut))
    assert not list(store.objects.glob("??/*")) and not list((store.objects / ".incoming").iterdir())
    with pytest.raises(DataError, match="missing on this node"):
        store.commit(CommitRequest(name="corpus", manifest=_manifest({"a": b"abc"})))
    assert store.current("corpus") is None


def _serve_in_thread(store: Store, token: str, clients: int = 1) -> tuple[threading.Thread, list[int]]:
    ports: list[int] = []
    ready = threading.Event()

    def run() -> None:
        def say(r: object) -> None:
            ports.append(encode(r)["port"])
            ready.set()
        serve(store, ServeRequest(token=token, clients=clients), ready=say)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    return t, ports


def test_peer_copy_with_the_token_and_refused_without(tmp_path: Path) -> None:
    src = Store(NodeState(tmp_path / "a"), "demo")
    dst = Store(NodeState(tmp_path / "b"), "demo")
    blobs = [os.urandom(200_000), b"small"]
    src.receive(_stream(blobs))
    shas = [hashlib.sha256(b).hexdigest() for b in blobs]
    t, ports = _serve_in_thread(src, "t" * 64, clients=1)
    with pytest.raises(DataError, match="closed the connection"):   # the server drops it unanswered
        fetch(dst, FetchRequest(host="127.0.0.1", port=ports[0], token="wrong" * 8, shas=shas))
    got = fetch(dst, FetchRequest(host="127.0.0.1", port=ports[0], token="t" * 64, shas=shas))
    t.join(10)
    assert got.stored == 2 and dst.missing(shas) == []
    assert dst.object_path(shas[0]).read_bytes() == blobs[0]


def test_a_waiting_server_sends_objects_as_they_arrive_and_stops_when_told(tmp_path: Path) -> None:
    src = Store(NodeState(tmp_path / "a"), "demo")
    dst = Store(NodeState(tmp_path / "b"), "demo")
    blobs = [os.urandom(100_000), b"later", b"last"]
    shas = [hashlib.sha256(b).hexdigest() for b in blobs]
    src.receive(_stream(blobs[:1]))           # the rest is still "on its way" when the fetcher asks
    ports: list[int] = []
    ready = threading.Event()
    sent: list[int] = []

    def run() -> None:
        def say(r: object) -> None:
            ports.append(encode(r)["port"])
            ready.set()
        sent.append(serve(src, ServeRequest(token="t" * 64, wait=True), ready=say))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    got: list[object] = []
    f = threading.Thread(target=lambda: got.append(fetch(dst, FetchRequest(host="127.0.0.1", port=ports[0],
                                                                             token="t" * 64, shas=shas))))
    f.start()
    for sha in shas[:1]:   # the first object crosses while the others have not arrived at the server
        for _ in range(200):
            if dst.has(sha):
                break
            threading.Event().wait(0.02)
        assert dst.has(sha)
    assert not dst.has(shas[1])
    src.receive(_stream(blobs[1:]))
    f.join(10)
    t.join(10)
    assert dst.missing(shas) == [] and sent == [3]

    # a server waiting for an object that never comes ends when its push is gone (stdin closed)
    stop = threading.Event()
    errors: list[BaseException] = []
    ports.clear()
    ready.clear()

    def run2() -> None:
        def say(r: object) -> None:
            ports.append(encode(r)["port"])
            ready.set()
        try:
            serve(src, ServeRequest(token="u" * 64, wait=True), ready=say, stopped=lambda s: stop.wait(s))
        except DataError as e:
            errors.append(e)

    t2 = threading.Thread(target=run2, daemon=True)
    t2.start()
    assert ready.wait(10)
    other = Store(NodeState(tmp_path / "c"), "demo")
    never = hashlib.sha256(b"never").hexdigest()
    f2 = threading.Thread(target=lambda: errors.append(pytest.raises(DataError, fetch, other, FetchRequest(
        host="127.0.0.1", port=ports[0], token="u" * 64, shas=[never])).value))
    f2.start()
    threading.Event().wait(0.3)
    stop.set()
    t2.join(10)
    f2.join(10)
    assert any("stopped" in str(e) for e in errors) and other.missing([never]) == [never]


INVOKER_PROBE = """\
import sys
from higgsfield.control.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print("DATA", "higgsfield.contract.data" in sys.modules)
"""


@pytest.mark.parametrize(("verb", "loaded"), [(["version"], False), (["data", "--help"], True)])
def test_the_invokers_data_verbs_are_loaded_only_when_named(tmp_path: Path, verb: list[str], loaded: bool) -> None:
    """Every SSH command starts an invoker: the data verbs' import is paid by the data verbs alone."""
    argv = ["invoker", "--state-dir", str(tmp_path), *verb]
    proc = subprocess.run([sys.executable, "-c", INVOKER_PROBE.format(argv=argv)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    *out, last = proc.stdout.strip().splitlines()
    assert last == f"DATA {loaded}", proc.stdout
    assert loaded == any("Data entries on this node" in line for line in out), proc.stdout
