"""``checkpoint.mirror``: validated in higgsfield.yml, carried by the RunSpec, set in the run's environment,
and the mirror's markers (upload, COMPLETE only when every part is up, keep-last-k) on a real path mirror."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers_project import assert_one_line_error, run_cli, write

from higgsfield._lib.ckpt_mirror import Mirror, Part, Uploader, mirror_root
from higgsfield.contract.codec import encode
from higgsfield.contract.errors import ConfigError
from higgsfield.contract.runspec import RunSpec, SpecError, read_spec
from higgsfield.control.config import parse_config
from higgsfield.node.runtime import torchrun
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import NodeRun, Placement
from higgsfield.node.state.records import RunDir

NODES = "name: a\nnodes:\n  - host: h1\nssh:\n  user: u\n"


@pytest.mark.timeout(60)
def test_a_bad_mirror_url_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cfg = write(tmp_path / "higgsfield.yml", NODES + "checkpoint:\n  mirror: http://bucket/x\n").resolve()
    proc = run_cli(tmp_path, "config", "check")
    assert_one_line_error(proc, f"{cfg}:7: checkpoint.mirror: 'http://bucket/x' is not a mirror URL: use "
                                "s3://bucket/prefix, gs://bucket/prefix, sftp://host/path, file:///path or an "
                                "absolute path")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("url", ["s3://", "relative/dir", "gs:///", "/", "s3://b/x y", "/a/../b", "ftp://h/x"])
def test_mirror_urls_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="checkpoint.mirror: .* is not a mirror URL"):
        parse_config(NODES + f"checkpoint:\n  mirror: {json.dumps(url)}\n", Path("higgsfield.yml"))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/prefix/", "gs://b/p", "sftp://host/srv/ckpt",
                                 "file:///srv/ckpt", "/srv/ckpt"])
def test_mirror_urls_accepted(url: str) -> None:
    assert parse_config(NODES + f"checkpoint:\n  mirror: {url}\n", Path("h.yml")).checkpoint.mirror == url
    assert parse_config(NODES, Path("h.yml")).checkpoint.mirror is None


def _node_run(tmp_path: Path, **spec: object) -> NodeRun:
    fields: dict[str, object] = {
        "project": "p", "experiment": "e", "run": "r", "module": "m", "code_dir": str(tmp_path), "params": {},
        "node": "n", "node_rank": 0, "nodes": ("n",), "master_addr": "127.0.0.1", "submitted_at": time.time(),
        "nproc": 1, "runtime": "process", **spec}
    return NodeRun(RunSpec(**fields),  # type: ignore[arg-type]
                   Placement(gpus=0, cache_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "c"), container="x"))


@pytest.mark.timeout(10)
def test_the_spec_carries_the_mirror_only_when_set_and_the_run_gets_it_as_env(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "p", "r")
    plain = _node_run(tmp_path)
    assert "checkpoint_mirror" not in encode(plain.spec)  # a node that predates the field reads it
    assert "HIGGSFIELD_CHECKPOINT_MIRROR" not in torchrun.run_vars(plain, rd)
    run = _node_run(tmp_path, checkpoint_mirror="s3://bucket/ckpt")
    back = read_spec(json.loads(json.dumps(encode(run.spec))))
    assert back == run.spec
    for env in (torchrun.process_env(run, rd, {"AWS_ACCESS_KEY_ID": "k"}, base={}), torchrun.container_env(run, rd)):
        assert env["HIGGSFIELD_CHECKPOINT_MIRROR"] == "s3://bucket/ckpt"
    with pytest.raises(SpecError, match="'checkpoint_mirror' must be a URL of one line"):
        read_spec({**encode(run.spec), "checkpoint_mirror": "s3://b\nx"})


def _part(tmp: Path, step: int, node: int, token: str, ranks: list[int], keep: int | None = 2) -> Part:
    d = tmp / f"node{node}" / f"step_{step:08d}"
    d.mkdir(parents=True)
    for r in ranks:
        (d / f"__{r}_0.distcp").write_bytes(bytes([r]) * 1000)
    (d / ".metadata").write_bytes(b"meta")
    (d / "COMPLETE").write_text(json.dumps({"step": step, "mode": "node-local", "world_size": 4, "ranks": ranks,
                                            "node": node, "nodes": 2, "engine": "fsdp"}))
    return Part(step=step, local=d, index=node, nparts=2, token=token, keep_last=keep)


@pytest.mark.timeout(30)
def test_a_step_is_complete_on_the_mirror_only_with_every_part_and_keep_last_prunes(tmp_path: Path) -> None:
    m = Mirror(mirror_root(str(tmp_path / "mirror"), "p", "e", "r"))
    assert m.newest() is None and m.steps() == []
    assert m.upload(_part(tmp_path, 4, 0, "t4", [0, 1])) is False
    assert m.steps() == [4] and m.complete_steps() == []  # one part up: not a checkpoint yet
    assert m.upload(_part(tmp_path, 4, 1, "t4", [2, 3])) is True
    assert m.complete_steps() == [4]
    step, marker = m.newest() or (0, {})
    assert step == 4 and marker["parts"] == [[0, 1], [2, 3]] and marker["token"] == "t4"
    # A killed save of step 8 left part 0 under another token: the new save's parts never count with it.
    m.upload(_part(tmp_path / "old", 8, 0, "dead", [0, 1]))
    m.upload(_part(tmp_path, 8, 1, "t8", [2, 3]))
    assert m.complete_steps() == [4]
    m.upload(_part(tmp_path, 8, 0, "t8", [0, 1]))
    assert m.complete_steps() == [4, 8]
    assert not (tmp_path / "mirror" / "p" / "e" / "r" / "step_00000008" / "dead").exists()  # its leftovers went
    for s in (12, 16):
        for n, ranks in ((0, [0, 1]), (1, [2, 3])):
            m.upload(_part(tmp_path, s, n, f"t{s}", ranks))
    assert m.complete_steps() == [12, 16] and m.steps() == [12, 16]  # keep-last-2 on the mirror too
    # A download of node 1's part brings its own files and marker; of every part, all shards in one place.
    step, marker = m.newest() or (0, {})
    m.download(step, marker, [1], tmp_path / "dl1")
    assert sorted(p.name for p in (tmp_path / "dl1").iterdir()) == [".metadata", "COMPLETE", "__2_0.distcp",
                                                                     "__3_0.distcp"]
    assert json.loads((tmp_path / "dl1" / "COMPLETE").read_text())["ranks"] == [2, 3]
    m.download(step, marker, [0, 1], tmp_path / "all")
    assert {p.name for p in (tmp_path / "all").iterdir()} >= {f"__{r}_0.distcp" for r in range(4)}
    assert json.loads((tmp_path / "all" / "COMPLETE").read_text())["mode"] == "mirror"


@pytest.mark.timeout(30)
def test_an_upload_failure_is_one_warning_line_and_the_step_stays_incomplete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # the mirror's root is under a plain file: every write fails
    up = Uploader(Mirror(str(blocker / "m")), "node fake1")
    up.submit(_part(tmp_path, 4, 1, "t", [2, 3]))
    up.join(20)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("higgsfield: checkpoint mirror: upload of node fake1's part of "
                                               "step_00000004 to "), err
    assert err[0].endswith("training goes on, the mirror has no COMPLETE for that step")
    assert up.steps() == set()
