"""Fast tests of the node-side parts: the queue, container names, image tags, deploy unpacking, archives."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from runs_helpers import exe

from higgsfield.errors import RunError
from higgsfield.invoker import queue
from higgsfield.invoker.containers import container_name, image_tag
from higgsfield.invoker.deploy import deployed, unpack
from higgsfield.orchestrator.deployment import make_archive


def _entry(run: str, want: int, order: float, exclusive: bool = False) -> queue.Entry:
    return queue.Entry(project="p", run=run, want=want, exclusive=exclusive, order=order, pid=os.getpid())


def test_queue_fifo_same_slots_wait_disjoint_slots_share(tmp_path: Path) -> None:
    cap = queue.Capacity(4, True)
    a, b, c = _entry("a", 2, 1.0), _entry("b", 2, 2.0), _entry("c", 4, 3.0)
    assert queue.try_acquire(tmp_path, a, cap) == [0, 1]
    assert queue.try_acquire(tmp_path, b, cap) == [2, 3]          # disjoint GPUs: side by side
    assert queue.try_acquire(tmp_path, c, cap) is None            # wants them all: waits
    d = _entry("d", 1, 4.0)
    queue.release(tmp_path, "p", "a")
    assert queue.try_acquire(tmp_path, d, cap) is None            # FIFO: c is first, d does not overtake
    assert queue.try_acquire(tmp_path, c, cap) is None            # b still holds 2 of 4
    queue.release(tmp_path, "p", "b")
    assert queue.try_acquire(tmp_path, c, cap) == [0, 1, 2, 3]
    queue.release(tmp_path, "p", "c")
    assert queue.try_acquire(tmp_path, d, cap) == [0]


def test_queue_orders_by_submit_time_not_arrival(tmp_path: Path) -> None:
    cap = queue.Capacity(1, False)
    holder = _entry("h", 1, 0.0)
    assert queue.try_acquire(tmp_path, holder, cap) == [0]
    late, early = _entry("late", 1, 5.0), _entry("early", 1, 2.0)
    assert queue.try_acquire(tmp_path, late, cap) is None
    assert queue.try_acquire(tmp_path, early, cap) is None
    queue.release(tmp_path, "p", "h")
    assert queue.try_acquire(tmp_path, late, cap) is None         # early was submitted first
    assert queue.try_acquire(tmp_path, early, cap) == [0]


def test_queue_exclusive_and_dead_holders(tmp_path: Path) -> None:
    cap = queue.capacity(0)
    assert not cap.gpus and cap.slots == (os.cpu_count() or 1)
    assert queue.wanted(8, False, queue.Capacity(2, False)) == 2    # CPU: at most the node
    assert queue.wanted(1, True, queue.Capacity(2, False)) == 2     # exclusive: the whole node
    ghost = queue.Entry(project="p", run="ghost", want=2, exclusive=True, order=0.0, pid=2 ** 22 + 12345,
                        slots=[0, 1])
    queue._save(tmp_path, [ghost])
    me = _entry("me", 2, 1.0, exclusive=True)
    assert queue.try_acquire(tmp_path, me, queue.Capacity(2, False)) == [0, 1]  # a dead supervisor's slots free


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


def _tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    buf.seek(0)
    return buf


def test_unpack_swaps_atomically_and_verifies(tmp_path: Path) -> None:
    info = unpack(tmp_path, "p", "a" * 40, _tar({"src/x.py": b"1"}))
    assert info["commit"] == "a" * 40 and Path(info["code_dir"], "src", "x.py").read_bytes() == b"1"
    info2 = unpack(tmp_path, "p", "b" * 40, _tar({"src/x.py": b"2"}))
    assert deployed(tmp_path, "p")["commit"] == "b" * 40
    assert (tmp_path / "projects/p/code/src/x.py").read_bytes() == b"2"
    assert Path(info["code_dir"]).is_dir() and info2["code_dir"] != info["code_dir"]  # old release kept
    for i in range(5):
        unpack(tmp_path, "p", f"{i}" * 40, _tar({"f": b""}))
    assert len(list((tmp_path / "projects/p/releases").iterdir())) == 3  # pruned


@pytest.mark.parametrize("files,links", [({"../evil": b"x"}, None), ({"/abs": b"x"}, None),
                                         ({}, {"out": "../../../etc/passwd"})])
def test_unpack_refuses_paths_out_of_the_tree(tmp_path: Path, files: dict[str, bytes],
                                              links: dict[str, str] | None) -> None:
    with pytest.raises(RunError, match="refusing"):
        unpack(tmp_path, "p", "c" * 40, _tar(files, links))
    assert deployed(tmp_path, "p") is None
    assert not (tmp_path / "evil").exists()


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
