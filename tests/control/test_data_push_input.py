"""Bad input to ``data:`` and ``data push``: one line, exit 2, nothing sent (no node is even reached)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from higgsfield.contract.data import DataError, DataFile
from higgsfield.control.backends.nodes.data.manifest import read_checked, scan

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
