"""A path mirror under either runtime: checked writable when a run starts on a node, and mounted into its container.

Before, ``checkpoint.mirror: /nfs/ckpt`` with ``runtime: docker`` wrote every upload into the
container's own filesystem, lost with it, and nothing said so. The end-to-end case (2 bed nodes in
Docker, a part deleted, the resume from the mirror) is tests/faults/test_checkpoint_node_local_bed.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from higgsfield.contract import layout
from higgsfield.contract.errors import RunError
from higgsfield.contract.runspec import RunSpec
from higgsfield.node.runs.start import check_mirror
from higgsfield.node.runtime.containers import mounts
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import NodeRun, Placement
from higgsfield.node.state.records import RunDir

pytestmark = pytest.mark.timeout(30)


def _run(mirror: str, tmp: Path) -> NodeRun:
    spec = RunSpec(project="p", experiment="e", run="r", module="m", code_dir=str(tmp / "code"), params={},
                   node="n1", node_rank=0, nodes=("n1",), master_addr="n1", submitted_at=time.time(), nproc=1,
                   runtime="docker", checkpoint_mirror=mirror)
    return NodeRun(spec, Placement(gpus=0, cache_dir=str(tmp / "cache"), checkpoint_dir=str(tmp / "cache" / "c"),
                                   container="c"))


@pytest.mark.parametrize(("url", "path"), [("/nfs/ckpt", "/nfs/ckpt"), ("file:///nfs/ckpt", "/nfs/ckpt"),
                                           ("s3://bucket/ckpt", None), ("sftp://host/ckpt", None),
                                           ("", None)])
def test_a_path_mirror_is_told_from_a_remote_one(url: str, path: str | None) -> None:
    assert layout.mirror_path(url) == path


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_the_container_gets_the_path_mirror_read_write_at_its_own_path(tmp_path: Path, scheme: str) -> None:
    mirror = tmp_path / "nfs" / "ckpt"
    got = mounts(_run(f"{scheme}{mirror}", tmp_path), RunDir(NodeState(tmp_path / "state"), "p", "r"))
    assert got[str(mirror)] == {"bind": str(mirror), "mode": "rw"}
    remote = mounts(_run("s3://bucket/ckpt", tmp_path), RunDir(NodeState(tmp_path / "state"), "p", "r"))
    assert set(got) - set(remote) == {str(mirror)}   # an object store needs no mount


def test_a_missing_mirror_directory_is_made_and_a_remote_url_is_left_alone(tmp_path: Path) -> None:
    check_mirror(str(tmp_path / "new" / "ckpt"))
    assert (tmp_path / "new" / "ckpt").is_dir() and not list((tmp_path / "new" / "ckpt").iterdir())
    check_mirror("s3://bucket/ckpt")   # checked from the training library, where its credentials are


def test_a_mirror_the_node_cannot_write_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("not a directory")
    with pytest.raises(RunError) as e:
        check_mirror(f"file://{tmp_path}/plain-file/ckpt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"checkpoint.mirror {tmp_path}/plain-file/ckpt cannot be written "), msg
    assert "on this node" in msg and "change checkpoint.mirror in higgsfield.yml" in msg, msg
