"""A Slurm run's request.json, job.json and pinned spec.json, typed (higgsfield.contract.slurmjob): the previous
release's shapes still read, the JSON on disk keeps its shape, another version and a damaged field are one line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from higgsfield.contract.codec import encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.layout import REQUEST_VERSION
from higgsfield.contract.runspec import read_spec
from higgsfield.contract.slurmjob import (
    JOB_VERSION,
    PinnedSlurmRun,
    SlurmJob,
    WrongVersion,
    decode_job,
    decode_pinned,
    decode_request,
    pinned_json,
)

# request.json and job.json as the previous release (0.2.x) wrote them, key for key
OLD_SPEC: dict[str, Any] = {
    "project": "proj", "experiment": "probe", "run": "probe-20250101-101010-ab12", "module": "probe",
    "code_dir": "/shared/hf/projects/proj/code", "params": {"lr": 0.001, "steps": 8}, "node": "pending",
    "node_rank": 0, "nodes": ["pending"], "master_addr": "pending", "submitted_at": 1735725010.25, "nproc": None,
    "coordinator": None, "max_restarts": 1, "runtime": "process", "exclusive": False, "src_dir": "src",
    "version": 1}
OLD_REQUEST: dict[str, Any] = {
    "version": 1, "spec": OLD_SPEC, "secret_names": ["AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY"], "max_restarts": 1,
    "gpus_per_node": 8, "checkpoint_dir": "/shared/hf/checkpoints/proj/probe-20250101-101010-ab12",
    "cache_dir": "/shared/hf/cache/proj", "submitted_at": 1735725010.25}
OLD_JOB: dict[str, Any] = {
    "job_id": "4711", "submitted_at": 1735725010.25, "login": "login.cluster.example",
    "sbatch": ["--job-name=probe-20250101-101010-ab12", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8",
               "--output=/shared/hf/runs/proj/probe-20250101-101010-ab12/logs/launcher.log", "--requeue",
               "--open-mode=append"],
    "project": "proj", "experiment": "probe", "run": "probe-20250101-101010-ab12", "params": {"lr": 0.001, "steps": 8}}


def test_the_previous_releases_request_reads_and_is_written_back_the_same() -> None:
    req = decode_request(json.loads(json.dumps(OLD_REQUEST)))
    assert req.spec == read_spec(OLD_SPEC) and req.spec.node == "pending"
    assert (req.secret_names, req.max_restarts, req.gpus_per_node) == (["AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY"], 1, 8)
    assert req.checkpoint_dir.endswith("/checkpoints/proj/probe-20250101-101010-ab12")
    assert req.submitted_at == 1735725010.25 and req.version == REQUEST_VERSION
    # the JSON on disk keeps its shape: the same keys, the same values (sort_keys, as the client writes it)
    assert json.dumps(encode(req), sort_keys=True) == json.dumps(OLD_REQUEST, sort_keys=True)


def test_the_previous_releases_job_record_reads_without_a_version() -> None:
    job = decode_job(json.loads(json.dumps(OLD_JOB)))
    assert (job.job_id, job.login, job.project, job.run, job.version) == (
        "4711", "login.cluster.example", "proj", "probe-20250101-101010-ab12", JOB_VERSION)
    assert job.sbatch[1] == "--nodes=2" and job.params == {"lr": 0.001, "steps": 8}
    assert encode(job) == {**OLD_JOB, "version": JOB_VERSION}     # the same keys, and its version
    assert decode_job(encode(job)) == job
    assert decode_job({"job_id": "9"}) == SlurmJob("9")     # only the job id is required


@pytest.mark.parametrize("data", [{**OLD_REQUEST, "version": 2}, {**OLD_REQUEST, "version": None},
                                  {k: v for k, v in OLD_REQUEST.items() if k != "version"}, [OLD_REQUEST], "x"])
def test_a_request_of_another_version_is_refused_in_one_line(data: object) -> None:
    with pytest.raises(WrongVersion) as e:
        decode_request(data, where="/w/runs/p/r/request.json")
    assert str(e.value) == (f"/w/runs/p/r/request.json is not a version-{REQUEST_VERSION} request: the login "
                            "node's higgsfield and the job's differ; run 'higgsfield setup'")


def test_a_job_record_of_another_version_is_refused_in_one_line() -> None:
    with pytest.raises(WrongVersion, match=r"job.json is of version 2 \(this higgsfield reads 1\): upgrade"):
        decode_job({**OLD_JOB, "version": 2})


@pytest.mark.parametrize(("change", "words"), [
    ({"spec": None}, "'spec' is missing"),
    ({"spec": {**OLD_SPEC, "version": 2}}, "run spec version 2"),
    ({"spec": {**OLD_SPEC, "project": "../etc"}}, "'project' '../etc' is not a name"),
    ({"spec": "x"}, "not a JSON object"),
    ({"secret_names": "A"}, "'secret_names' must be a list of strings"),
    ({"secret_names": ["A", "B=1"]}, "'secret_names' holds 'B=1'"),
    ({"max_restarts": "1"}, "'max_restarts' must be an integer, not a string"),
    ({"max_restarts": -1}, "must not be negative"),
    ({"gpus_per_node": 1.5}, "'gpus_per_node' must be an integer"),
    ({"checkpoint_dir": "/w/c\nx"}, "'checkpoint_dir'"),
    ({"cache_dir": "/c" * 3000}, "too long"),
    ({"submitted_at": float("nan")}, "'submitted_at' must be a number"),
])
def test_a_damaged_request_names_its_field_in_one_line(change: dict[str, Any], words: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_request({**OLD_REQUEST, **change})
    assert not isinstance(e.value, WrongVersion)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(("data", "words"), [
    ({**OLD_JOB, "job_id": None}, "'job_id' is missing"),
    ({**OLD_JOB, "job_id": 4711}, "'job_id' must be a string, not a number"),
    ({**OLD_JOB, "job_id": "4711; rm -rf ~"}, "not a Slurm job id"),
    ({**OLD_JOB, "project": "a/b"}, "'project' 'a/b' is not a project name"),
    ({**OLD_JOB, "run": ".."}, "'run' '..' is not a run name"),
    ({**OLD_JOB, "experiment": "e\x1b[2J"}, "'experiment'"),
    ({**OLD_JOB, "sbatch": ["--a", 3]}, "'sbatch[1]' must be a string, not a number"),
    ({**OLD_JOB, "sbatch": ["--x"] * 1001}, "at most 1000"),
    ({**OLD_JOB, "params": []}, "'params' must be an object"),
    ({**OLD_JOB, "submitted_at": -1}, "must not be negative"),
    (["4711"], "job.json is a list, not an object"),
])
def test_a_damaged_job_record_names_its_field_in_one_line(data: object, words: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_job(data)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


# -- spec.json: the spec the job pinned to its allocation -------------------------------------------

PINNED_SPEC: dict[str, Any] = {**OLD_SPEC, "node": "n1", "nodes": ["n1", "n2"], "master_addr": "n1", "nproc": 8}
# spec.json as the batch step wrote it before the type: the spec's keys, then the placement's, in this order
OLD_PINNED: dict[str, Any] = {**PINNED_SPEC, "gpus": 8, "checkpoint_dir": "/shared/hf/checkpoints/proj/r",
                              "cache_dir": "/shared/hf/cache/proj", "container": "", "python": "/venv/bin/python",
                              "allow_drift": False}


def test_the_pinned_spec_reads_and_is_written_back_key_for_key() -> None:
    pinned = decode_pinned(json.loads(json.dumps(OLD_PINNED)), where="/w/runs/p/r/spec.json")
    assert pinned.spec == read_spec(PINNED_SPEC) and pinned.spec.nodes == ("n1", "n2")
    assert (pinned.gpus, pinned.python, pinned.allow_drift) == (8, "/venv/bin/python", False)
    assert pinned_json(pinned) == OLD_PINNED      # the same keys, the same values (written with sorted keys)
    assert decode_pinned(pinned_json(pinned)) == pinned
    drifting = decode_pinned({**OLD_PINNED, "allow_drift": True})
    assert drifting.allow_drift and pinned_json(drifting)["allow_drift"] is True
    assert decode_pinned(PINNED_SPEC) == PinnedSlurmRun(pinned.spec)   # placement keys default


@pytest.mark.parametrize(("data", "words"), [
    ([OLD_PINNED], "spec.json is a list, not an object"),
    ({**OLD_PINNED, "version": 2}, "run spec version 2"),
    ({**OLD_PINNED, "node": "n2"}, "node 'n2' is not number 0 of its nodes"),
    ({**OLD_PINNED, "nodes": ["n1", "n 2"]}, "node name 'n 2' is not valid"),
    ({**OLD_PINNED, "gpus": "8"}, "'gpus' must be an integer, not a string"),
    ({**OLD_PINNED, "gpus": -1}, "'gpus' must not be negative"),
    ({**OLD_PINNED, "allow_drift": "yes"}, "'allow_drift' must be true or false"),
    ({**OLD_PINNED, "checkpoint_dir": "/w/c\nx"}, "'checkpoint_dir'"),
    ({**OLD_PINNED, "python": 3}, "'python' must be a string"),
])
def test_a_damaged_pinned_spec_names_the_file_and_its_field_in_one_line(data: object, words: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_pinned(data, where="/w/runs/p/r/spec.json")
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert str(e.value).startswith("/w/runs/p/r/spec.json")
