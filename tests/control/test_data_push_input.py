"""Bad input to ``data:`` and ``data push``: one line, exit 2, nothing sent (no node is even reached); and on a
``localhost`` node (the invoker is this Python, the state a temporary directory): a ``dest:`` link, a user's
file at a dest left alone, and a file that changes during the push (nothing made current)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from higgsfield.contract.data import DataError, DataFile
from higgsfield.control.backends.nodes.data.manifest import read_checked, scan
from higgsfield.control.backends.nodes.data.push import push
from higgsfield.control.config import load_config

pytestmark = pytest.mark.timeout(60)

NODE = "nodes:\n  - host: 10.255.255.1\n    user: nobody\nssh: {connect_timeout: 1, retries: 0}\n"


def _hf(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=d, capture_output=True, text=True,
                          timeout=50)


@pytest.mark.parametrize(("data", "says"), [
    ("  corpus: ./nowhere\n", "does not exist"),
    ("  corpus: ftp2://host/x\n", "unknown scheme"),
    ("  corpus: ./a\n  Corpus: ./b\n", "again"),
    ("  corpus: ./a\n  corpus: ./b\n", "appears twice"),
    ("  corpus: {source: ./a, revision: main}\n", "revision is for hf://"),
    ("  9lives: ./a\n", "not a data entry name"),
    ("  corpus: {source: ./a, dest: /etc/corpus}\n", "outside the node's state directory"),
    ("  corpus: {source: ./a, dest: ../../corpus}\n", "outside the node's state directory"),
    ("  corpus: {source: ./a, dest: ~/corpus}\n", "outside the node's state directory"),
    ("  corpus: {source: ./a, dest: runs/corpus}\n", "higgsfield's own 'runs'"),
    ("  corpus: {source: ./a, dest: w}\n  other: {source: ./a, dest: w/x}\n", "its own dest"),
])
def test_bad_data_is_one_line_exit_2(tmp_path: Path, data: str, says: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "higgsfield.yml").write_text(f"name: t\n{NODE}data:\n{data}")
    r = _hf(tmp_path, "data", "push")
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unknown_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "higgsfield.yml").write_text(f"name: t\n{NODE}data:\n  corpus: ./a\n")
    r = _hf(tmp_path, "data", "push", "weights")
    assert r.returncode == 2 and "no data entry named 'weights'" in r.stderr


def test_the_manifest_cache_and_a_file_that_changes(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"one")
    (root / "sub" / "b.txt").write_bytes(b"two")
    cache = tmp_path / "cache.json"
    m = scan(root, cache=cache)
    assert [f.path for f in m.files] == ["a.txt", "sub/b.txt"] and cache.exists()
    assert scan(root, cache=cache).version() == m.version()
    (root / "a.txt").write_bytes(b"ONE")       # same size: the stat (mtime) still tells
    assert scan(root, cache=cache).version() != m.version()
    with pytest.raises(DataError, match="changed during the push"):
        read_checked(root, m.files[0])
    assert read_checked(root, DataFile(path="sub/b.txt", size=3, sha256=m.files[1].sha256)) == b"two"


def _local(tmp_path: Path, data: str) -> Path:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("one")
    (tmp_path / "higgsfield.yml").write_text(f"name: t\nnodes:\n  - host: localhost\nstate_dir: {tmp_path}/state\n"
                                             f"data:\n{data}")
    return tmp_path / "state"


def test_dest_links_the_current_version_and_never_replaces_a_users_file(tmp_path: Path) -> None:
    state = _local(tmp_path, "  corpus: {source: ./a, dest: weights/base}\n")
    r = _hf(tmp_path, "data", "push")
    assert r.returncode == 0, r.stderr
    link = state / "weights" / "base"
    assert (link / "x.txt").read_text() == "one" and link.resolve().parent.name == "versions"
    (tmp_path / "a" / "x.txt").write_text("two")
    assert _hf(tmp_path, "data", "push").returncode == 0
    assert (link / "x.txt").read_text() == "two"          # the link follows the new version
    link.unlink()
    link.mkdir()                                           # a directory of the user's where the link was
    r = _hf(tmp_path, "data", "push", "--json")
    assert r.returncode == 2 and "is not this entry's link" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and link.is_dir() and not link.is_symlink()


def test_a_file_that_changes_during_the_push_makes_nothing_current(tmp_path: Path) -> None:
    state = _local(tmp_path, "  corpus: ./a\n")
    cfg = load_config(tmp_path / "higgsfield.yml")
    changed = []

    def change_it(nodes: object) -> None:   # after the manifest, before the bytes are read to be sent
        if not changed:
            (tmp_path / "a" / "x.txt").write_text("ONE")
            changed.append(1)

    with pytest.raises(DataError, match="changed during the push"):
        push(cfg, on_progress=change_it)
    assert not (state / "data" / "t" / "entries" / "corpus" / "current").exists()
    assert not list((state / "data" / "t" / "objects").glob("??/*"))    # nothing half-written either
    r = _hf(tmp_path, "data", "push")                     # pushed again once written: the new bytes
    assert r.returncode == 0, r.stderr
    assert (state / "data" / "t" / "entries" / "corpus" / "current" / "x.txt").read_text() == "ONE"
