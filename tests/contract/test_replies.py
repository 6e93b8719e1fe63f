"""The invoker's replies (higgsfield.contract.replies, .replies_disk): typed, versioned, encoded and decoded by the
codec (higgsfield.contract.codec), once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.replies import (
    BuildReply,
    Deployment,
    EnvLine,
    EnvReply,
    KillReply,
    KillTargetReply,
    NameInUseReply,
    Reply,
    StartReply,
    VersionReply,
)
from higgsfield.contract.replies_disk import (
    FileEntry,
    FilesReply,
    FreeSpace,
    Kept,
    PrunedCheckpoint,
    PrunedImage,
    PrunedRun,
    PruneReply,
    UsageReply,
)

SHA = "ab" * 32
RECORD = {"project": "p", "experiment": "train", "run": "train-1", "node": "n0", "node_rank": 0, "nnodes": 1,
          "nproc": 1, "state": "killed", "created_at": 1.0, "pids": {"torchrun": 12}, "coord_port": 29500}

# One reply of each verb, as the node builds it.
REPLIES: list[Reply] = [
    VersionReply(version="0.2.0", python="/usr/bin/python3"),
    Deployment(commit="c" * 40, dirty=False, release="r1", deployed_at=5.0, code_dir="/x/code", image=None),
    BuildReply(tag="hf-p:abc", built=True, seconds=1.5),
    BuildReply(skipped="runtime: process"),
    EnvReply(state="present", project="p", wanted="k1", key="k1", python="/env/bin/python", torch="2.4.0"),
    EnvLine(progress="Collecting torch"),
    EnvLine(result=EnvReply(key="k1", built=True, pruned=["k0"], seconds=2.0)),
    decode(StartReply, {**RECORD, "state": "starting", "coord_port": 29500}),
    NameInUseReply(name_in_use=True, run="train-1", state="running", node="n1"),
    KillReply(run="train-1", state="killed", extra={"node": "n0"}),
    KillReply(run="train-1", missing=True),
    KillTargetReply(matched=2, killed=[decode(NodeRunView, RECORD)]),
    FilesReply(root="/ckpt", steps=["step_00000001"]),
    FilesReply(root="/ckpt", steps=["step_00000001"], files=[FileEntry("step_00000001/a.bin", 3, SHA)],
               marker={"step": 1}),
    FilesReply(root="/runs/p/train-1", files=[FileEntry("run.json", 10, SHA)]),
    PruneReply(runs=[PrunedRun("old", "train", "succeeded", 3.0, "/runs/old", 100)], freed_bytes=150,
               checkpoints=[PrunedCheckpoint("old", "/ckpt/old", 50)], images=[PrunedImage("hf-p:1", "sha256:1", 0)],
               kept=[Kept("running", run="live"), Kept("a container uses it", image="hf-p:2")],
               skipped=["runs/p/x/run.json: not JSON"], missing=["nope"], notes=["docker: not reachable"]),
    UsageReply(state_dir="/home/u/.higgsfield", state_bytes=10, checkpoint_bytes=20, checkpoint_dirs=["/c"],
               free=[FreeSpace(free_bytes=5, path="/home", total_bytes=100, what="state")]),
]


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_each_reply_round_trips_through_json_with_its_version(reply: Reply) -> None:
    wire = json.loads(json.dumps(encode(reply), sort_keys=True))
    assert wire[type(reply).VERSION_KEY] == 1
    back = decode(type(reply), wire)
    assert back == reply and encode(back) == encode(reply)


def test_the_wire_is_what_the_verbs_printed_before_plus_version() -> None:
    assert encode(KillReply(run="held", missing=True)) == {"missing": True, "run": "held", "version": 1}
    assert encode(BuildReply(skipped="runtime: process")) == {"skipped": "runtime: process", "version": 1}
    assert encode(VersionReply(version="0.2.0", python="/p")) == {"version": "0.2.0", "python": "/p",
                                                                  "reply_version": 1}
    assert encode(EnvLine(progress="x")) == {"progress": "x", "version": 1}
    assert encode(FilesReply(root="/c", steps=[])) == {"root": "/c", "steps": [], "version": 1}
    # a record's keys the type does not name travel through
    rec = {**RECORD, "state": "running"}
    assert encode(decode(KillReply, rec)) == {**rec, "version": 1}
    deployed = {"commit": "c", "dirty": True, "release": "r", "deployed_at": 1.0, "code_dir": "/x", "image": None}
    assert encode(decode(Deployment, deployed)) == {**deployed, "version": 1}


def test_a_start_reply_is_the_nodes_record_decoded_once_into_a_view() -> None:
    """The node's record as it was (no ``params``: ``invoker status`` adds them), and a NodeRunView at once."""
    full = {**RECORD, "state": "starting", "nnodes": 1, "runtime": "process", "slots": [], "exclusive": False,
            "exit_code": None, "reason": None, "started_at": None, "ended_at": None, "failed_node": None,
            "failed_rank": None, "failed_at": None, "error_tail": [], "stall": None, "stalled_at": None,
            "stragglers": [], "attempts": [], "lost": [], "spare": False, "attempt": "ab12"}
    start = decode(StartReply, full)
    assert isinstance(start, NodeRunView) and start.coord_port == 29500 and start.extra["pids"] == {"torchrun": 12}
    assert encode(start) == {**full, "version": 1}


@pytest.mark.parametrize("cls,data,needle", [
    (BuildReply, {"tag": 3}, "'tag' must be a string, not a number"),
    (Deployment, {"dirty": True}, "'commit' is missing"),
    (StartReply, {**RECORD, "state": None}, "'state' is missing"),
    (StartReply, {**RECORD, "state": "sleeping"}, "'state' 'sleeping' is not a run state"),
    (StartReply, {**RECORD, "run": "../x"}, "is not a run name"),
    (StartReply, {**RECORD, "coord_port": 70000}, "'coord_port' 70000 is not a TCP port"),
    (KillReply, {"run": "x", "missing": "yes"}, "'missing' must be true or false"),
    (KillTargetReply, {"matched": "2", "killed": []}, "'matched' must be an integer"),
    (NameInUseReply, {"name_in_use": False, "run": "x", "state": "running", "node": "n"}, "is not true"),
    (EnvReply, {"state": "half"}, "'state' 'half' is not one of present, stale, missing"),
    (EnvLine, {"result": {"version": 9}}, "the env reply is of version 9"),
    (FilesReply, {"root": "/c", "files": [{"path": "a", "size": -1, "sha256": SHA}]},
     "'files[0].size' must not be negative"),
    (FilesReply, {"root": "/c", "files": [{"path": "a", "size": 1, "sha256": "x"}]}, "is not a sha256"),
    (FilesReply, {"root": "/c", "steps": "step_1"}, "'steps' must be a list of strings"),
    (FilesReply, {"root": "x" * 10_000}, "'root' is too long"),
    (PruneReply, {"runs": [{"run": "a", "bytes": "1"}], "freed_bytes": 0}, "'runs[0].bytes' must be an integer"),
    (PruneReply, {"runs": [], "freed_bytes": 0, "kept": [{"why": "x"}]}, "kept[0]: a kept entry names"),
    (PruneReply, {"runs": "x", "freed_bytes": 0}, "'runs' must be a list of objects, not a string"),
    (UsageReply, {"state_bytes": 1.5, "free": []}, "'state_bytes' must be an integer"),
    (UsageReply, [], "the usage reply is a list, not an object"),
])
def test_a_damaged_or_wrong_typed_field_is_refused_in_one_line(cls: type[Reply], data: Any, needle: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode(cls, data)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_an_unknown_version_is_refused_in_one_line(reply: Reply) -> None:
    wire = {**encode(reply), type(reply).VERSION_KEY: 2}
    with pytest.raises(DecodeError) as e:
        decode(type(reply), wire)
    assert "of version 2 (this higgsfield reads 1)" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_an_older_nodes_reply_without_a_version_reads_as_version_1(reply: Reply) -> None:
    wire = encode(reply)
    del wire[type(reply).VERSION_KEY]
    assert decode(type(reply), wire) == reply


def test_a_kill_reply_leaves_out_a_record_that_does_not_decode() -> None:
    got = decode(KillTargetReply, {"matched": 2, "killed": [RECORD, {**RECORD, "run": "../etc"}]})
    assert [v.run for v in got.killed] == ["train-1"]


def test_the_seam_turns_a_bad_reply_into_one_line_naming_the_node() -> None:
    from higgsfield.contract.errors import CommandError
    from higgsfield.control.backends.nodes.output import decode_reply

    with pytest.raises(CommandError) as e:
        decode_reply("gpu-1", json.dumps({"tag": "t", "version": 7}), BuildReply)
    assert "gpu-1" in str(e.value) and "version 7" in str(e.value) and "higgsfield setup" in str(e.value)
    assert "\n" not in str(e.value)
    assert decode_reply("gpu-1", json.dumps({"tag": "t"}), BuildReply) == BuildReply(tag="t")
