"""The Slurm engine's pure parts: the batch script, the state mapping, Slurm's answers, the settings.

The quoting test runs the rendered script for real in bash, with ``scontrol`` and the
interpreter replaced by stubs that print their argv: whatever the run name, project or
workdir (anything the settings and names accept), the script runs exactly the argv meant.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from higgsfield.contract.codec import encode
from higgsfield.contract.errors import ConfigError
from higgsfield.contract.names import MAX_RUN_NAME
from higgsfield.contract.slurm_syntax import check_time, seconds
from higgsfield.contract.slurmjob import (
    PinnedSlurmRun,
    SlurmJob,
    SlurmRequest,
    decode_job,
    decode_pinned,
    decode_request,
    pinned_json,
)
from higgsfield.control.backends.slurm import layout
from higgsfield.control.backends.slurm.client import template_spec
from higgsfield.control.backends.slurm.layout import RunPaths
from higgsfield.control.backends.slurm.parse import (
    exit_code,
    expand_nodelist,
    parse_sacct,
    parse_squeue,
    sbatch_error,
)
from higgsfield.control.backends.slurm.runstatus import merge
from higgsfield.control.backends.slurm.script import BatchJob, render
from higgsfield.control.backends.slurm.states import map_state
from higgsfield.control.config import load_config
from higgsfield.control.config.slurm import SlurmConfig
from higgsfield.node import slurm_run, slurm_task

pytestmark = pytest.mark.timeout(120)


def job(**kw: object) -> BatchJob:
    base: dict[str, object] = {"paths": RunPaths("/shared/me/hf", "proj", "exp-20250101-000000-ab12"),
                               "python": "/shared/me/hf/venv/bin/python", "nodes": 2}
    base.update(kw)
    return BatchJob(**base)  # type: ignore[arg-type]


def sbatch_lines(script: str) -> list[str]:
    return [ln.removeprefix("#SBATCH ") for ln in script.splitlines() if ln.startswith("#SBATCH ")]


# -- rendering --------------------------------------------------------------------------------

def test_sbatch_lines_ask_for_one_task_per_node_and_leave_out_what_is_unset() -> None:
    lines = sbatch_lines(render(job()))
    assert lines == ["--job-name=exp-20250101-000000-ab12", "--nodes=2", "--ntasks-per-node=1", "--exclusive",
                     "--output=/shared/me/hf/runs/proj/exp-20250101-000000-ab12/logs/launcher.log", "--no-requeue"]
    full = sbatch_lines(render(job(gpus_per_node=8, cpus_per_task=12, partition="gpu", account="lab",
                                   time="1-00:00:00", max_restarts=2, exclusive=False, extra=("--qos=high",))))
    assert "--gpus-per-node=8" in full and "--cpus-per-task=12" in full and "--partition=gpu" in full
    assert "--account=lab" in full and "--time=1-00:00:00" in full and "--qos=high" in full
    assert "--requeue" in full and "--open-mode=append" in full and "--no-requeue" not in full
    assert "--exclusive" not in full


def test_the_body_runs_srun_with_the_first_node_as_the_rendezvous() -> None:
    text = render(job())
    assert text.startswith("#!/bin/bash\n")
    assert 'master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1" in text
    assert "-m higgsfield.node.slurm_task batch" in text and "-m higgsfield.node.slurm_task node" in text


def test_a_value_sbatch_would_misread_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="misread"):
        render(job(paths=RunPaths("/shared/my dir", "proj", "r")))
    with pytest.raises(ValueError, match="misread"):
        render(job(partition="gpu%j"))


_RUN = st.from_regex(rf"\A[a-zA-Z0-9][a-zA-Z0-9_.-]{{0,{MAX_RUN_NAME - 1}}}\Z", fullmatch=True)
_WORD = st.from_regex(r"\A[a-zA-Z_][a-zA-Z0-9_]{0,20}\Z", fullmatch=True)
_DIR = st.lists(st.from_regex(r"\A[A-Za-z0-9_.+@:,=-]{1,12}\Z", fullmatch=True).filter(lambda p: p not in (".", "..")),
                min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
STUB = '#!/bin/sh\nexec python3 -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@"\n'


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=_RUN, project=_WORD, workdir=_DIR)
def test_no_run_name_project_or_workdir_breaks_the_script(tmp_path: Path, run: str, project: str,
                                                          workdir: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho n7\necho n8\n")
    (bin_dir / "python").write_text(STUB)
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    j = job(paths=RunPaths(workdir, project, run), python=str(bin_dir / "python"))
    text = render(j)
    assert sbatch_lines(text)[0] == f"--job-name={run}"
    assert all(len(shlex.split(ln)) == 1 for ln in sbatch_lines(text))   # one word each, as sbatch reads it
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[7-8]"}
    out = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    run_dir = f"{workdir}/runs/{project}/{run}"
    assert json.loads(out.stdout) == [
        "-m", "higgsfield.node.slurm_task", "batch", run_dir, "--master", "n7", "--",
        "srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        str(bin_dir / "python"), "-m", "higgsfield.node.slurm_task", "node", run_dir, "--master", "n7"]


def test_the_node_side_reads_the_file_names_the_control_side_writes() -> None:
    from higgsfield.contract import layout as contract
    from higgsfield.contract import slurmjob

    names = (contract.REQUEST, contract.SECRETS, contract.REQUEST_VERSION)
    assert (layout.REQUEST, layout.SECRETS, slurmjob.REQUEST_VERSION) == names
    spec = template_spec(project="p", experiment="e", run="r", module="e", code_dir="/w/code", params={})
    assert (slurm_run.REQUEST, slurm_run.SECRETS, SlurmRequest(spec=spec).version) == names


def test_the_task_parses_its_command_line_with_the_srun_line_after_the_dashes(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    seen = {}
    monkeypatch.setattr(slurm_task, "batch", lambda rd, master, cmd: seen.update(rd=rd.path, m=master, c=cmd) or 0)
    rd = tmp_path / "runs" / "proj" / "r1"
    assert slurm_task.main(["batch", str(rd), "--master", "n1", "--", "srun", "--master", "x"]) == 0
    assert seen == {"rd": rd, "m": "n1", "c": ["srun", "--master", "x"]}


def test_the_job_reads_its_request_once_typed_and_refuses_another_version(tmp_path: Path) -> None:
    rd = slurm_task.run_dir(str(tmp_path / "runs" / "p" / "r"))
    rd.path.mkdir(parents=True)
    spec = template_spec(project="p", experiment="e", run="r", module="e", code_dir="/w/code", params={"lr": 1})
    path = rd.path / "request.json"
    path.write_text(json.dumps(encode(SlurmRequest(spec=spec, secret_names=["A_KEY"], gpus_per_node=2))))
    req = slurm_task.read_request(rd)
    assert (req.spec, req.secret_names, req.gpus_per_node) == (spec, ["A_KEY"], 2)
    path.write_text(json.dumps({**encode(req), "version": 2}))
    with pytest.raises(slurm_task.TaskError) as e:
        slurm_task.read_request(rd)
    assert not isinstance(e.value, slurm_task.BadRequest)
    assert str(e.value) == (f"{path} is not a version-1 request: the login node's higgsfield and the job's "
                            "differ; run 'higgsfield setup'")
    path.write_text(json.dumps({**encode(req), "max_restarts": "2"}))
    with pytest.raises(slurm_task.BadRequest, match=r"^the run's request: 'max_restarts' must be an integer"):
        slurm_task.read_request(rd)


def test_a_request_with_a_bad_field_is_the_runs_start_failure_its_secrets_gone(tmp_path: Path) -> None:
    rd = slurm_task.run_dir(str(tmp_path / "runs" / "p" / "r"))
    rd.path.mkdir(parents=True)
    spec = template_spec(project="p", experiment="e", run="r", module="e", code_dir="/w/code", params={})
    bad = {**encode(SlurmRequest(spec=spec, secret_names=["A_KEY"])), "spec": {**encode(spec), "version": 9}}
    (rd.path / "request.json").write_text(json.dumps(bad))
    (rd.path / "secrets.json").write_text('{"A_KEY": "v"}')
    assert slurm_task.batch(rd, "n1", ["srun", "true"]) == 2
    assert not (rd.path / "secrets.json").exists()
    record = rd.read()
    assert record.state == "failed" and record.exit_code == 2 and record.project == "p"
    assert record.reason and record.reason.startswith("the run's request: run spec version 9")


def test_the_listing_decodes_each_job_record_and_skips_one_that_does_not(tmp_path: Path) -> None:
    from higgsfield.control.backends.slurm.listing import _LIST_RUNS, listed_runs

    root = tmp_path / "runs" / "p"
    for name, job in (("a", {"job_id": "7", "project": "p", "run": "a"}), ("b", {"job_id": "x"}),
                      ("c", {"job_id": "8", "version": 3})):
        (root / name).mkdir(parents=True)
        (root / name / "job.json").write_text(json.dumps(job))
    (root / "a" / "run.json").write_text('{"state": "running"}')
    (root / "c" / "run.json").write_text('[1]')
    out = subprocess.run([sys.executable, "-c", _LIST_RUNS, str(root)], capture_output=True, text=True, check=True)
    items, skipped = listed_runs(out.stdout, "p")
    assert [(i.run, i.job.job_id, i.record) for i in items] == [("a", "7", {"state": "running"})]
    assert skipped == ["runs/p/b/job.json: 'job_id' 'x' is not a Slurm job id",
                       "runs/p/c/job.json: job.json is of version 3 (this higgsfield reads 1): upgrade higgsfield "
                       "here, the run was submitted by a newer one"]


def test_the_secrets_file_is_deleted_as_it_is_read(tmp_path: Path) -> None:
    rd = slurm_task.run_dir(str(tmp_path / "runs" / "p" / "r"))
    rd.path.mkdir(parents=True)
    (rd.path / "secrets.json").write_text('{"A_KEY": "v"}')
    assert slurm_task.take_secrets(rd, ["A_KEY"]) == {"A_KEY": "v"}
    assert not (rd.path / "secrets.json").exists()
    with pytest.raises(slurm_task.TaskError, match="secrets file is gone"):
        slurm_task.take_secrets(rd, ["A_KEY"])
    assert slurm_task.take_secrets(rd, []) == {}
    slurm_task.put_secrets_back(rd, {"A_KEY": "v"})
    assert (rd.path / "secrets.json").stat().st_mode & 0o777 == 0o600


def test_the_node_environment_is_minimal_with_the_named_secrets() -> None:
    spec = template_spec(project="p", experiment="e", run="r", module="e", code_dir="/w/code", params={})
    pinned = PinnedSlurmRun(slurm_task.pin_spec(SlurmRequest(spec=spec), ["n1", "n2"], "n1"),
                            checkpoint_dir="/w/checkpoints/p/r")
    base = {"PATH": "/usr/bin", "A_KEY": "v", "OTHER": "x", "SLURM_JOB_ID": "3",
            slurm_task.SECRET_NAMES_VAR: "A_KEY", "SSH_AUTH_SOCK": "/tmp/s"}
    rd = slurm_task.run_dir("/w/runs/p/r")
    env = slurm_task.node_env(pinned, rd, "n2", base)
    assert env["A_KEY"] == "v" and env["HIGGSFIELD_NODE"] == "n2" and env["HIGGSFIELD_RUN_DIR"] == "/w/runs/p/r"
    assert env["HIGGSFIELD_CHECKPOINT_DIR"] == "/w/checkpoints/p/r"
    assert "OTHER" not in env and "SSH_AUTH_SOCK" not in env and "SLURM_JOB_ID" not in env


@pytest.mark.parametrize("mirror", ["s3://bucket/ckpt", ""])
def test_the_checkpoint_mirror_reaches_the_ranks_as_on_ssh_nodes(mirror: str) -> None:
    """higgsfield.yml's checkpoint.mirror goes the Slurm way (template spec -> request.json -> the job's pinned
    spec.json -> a node's env) and arrives as HIGGSFIELD_CHECKPOINT_MIRROR; its credentials only as secrets."""
    spec = template_spec(project="p", experiment="e", run="r", module="src.e", code_dir="/w/code", params={},
                         checkpoint_mirror=mirror)
    req = json.loads(json.dumps(encode(SlurmRequest(spec=spec))))  # as request.json carries it
    pinned = slurm_task.pin_spec(decode_request(req), ["n1", "n2"], "n1")
    written = json.loads(json.dumps(pinned_json(PinnedSlurmRun(pinned, checkpoint_dir="/w/checkpoints/p/r"))))  # spec.json
    base = {"PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "s3cr3t-7f2e", slurm_task.SECRET_NAMES_VAR: "AWS_SECRET_ACCESS_KEY"}
    env = slurm_task.node_env(decode_pinned(written), slurm_task.run_dir("/w/runs/p/r"), "n2", base)
    assert env.get("HIGGSFIELD_CHECKPOINT_MIRROR") == (mirror or None), env
    assert env["AWS_SECRET_ACCESS_KEY"] == "s3cr3t-7f2e" and "s3cr3t-7f2e" not in json.dumps(written)


# -- states -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "reason", "state", "words"), [
    ("PENDING", "Resources", "queued", "Resources"),
    ("PENDING", "Priority", "queued", "Priority"),
    ("PENDING", "None", "queued", None),
    ("REQUEUED", None, "queued", "requeued"),
    ("REQUEUE_HOLD", "JobHeldUser", "queued", "requeued (JobHeldUser)"),
    ("RUNNING", "None", "running", None),
    ("CONFIGURING", None, "running", None),
    ("COMPLETING", None, "running", None),
    ("COMPLETED", None, "succeeded", None),
    ("CANCELLED by 1021", None, "killed", "cancelled"),
    ("FAILED", "NonZeroExitCode", "failed", "NonZeroExitCode"),
    ("TIMEOUT", None, "failed", "time limit"),
    ("NODE_FAIL", None, "failed", "node"),
    ("OUT_OF_MEMORY", None, "failed", "memory"),
    ("BOOT_FAIL", None, "failed", "boot"),
    ("DEADLINE", None, "failed", "deadline"),
    ("SOMETHING_NEW", None, "running", "SOMETHING_NEW"),
])
def test_slurm_states_map_to_run_states(raw: str, reason: str | None, state: str, words: str | None) -> None:
    m = map_state(raw, reason)
    assert m.state == state
    if words is None:
        assert m.reason is None
    else:
        assert m.reason is not None and words in m.reason


def test_squeue_and_sacct_lines_parse() -> None:
    q = parse_squeue("12|PENDING|(null)|2025-01-01T10:00:00|N/A|N/A|(Resources)\n"
                     "13|RUNNING|n[1-2]|2025-01-01T10:00:00|2025-01-01T10:00:05|2025-01-01T10:05:05|None\n")
    assert q["12"].state == "PENDING" and q["12"].reason == "Resources" and q["12"].nodes == ()
    assert q["13"].nodes == ("n1", "n2") and q["13"].started_at is not None
    a = parse_sacct("14|CANCELLED by 0|0:15|n3|2025-01-01T10:00:00|2025-01-01T10:00:01|2025-01-01T10:00:09|None\n"
                    "15|FAILED|3:0|n[1-2]|2025-01-01T10:00:00|2025-01-01T10:00:01|2025-01-01T10:00:09|"
                    "NonZeroExitCode\n")
    assert a["14"].state == "CANCELLED" and a["14"].exit_code == 128 + 15
    assert a["15"].exit_code == 3 and a["15"].reason == "NonZeroExitCode"
    assert exit_code("0:0") == 0 and exit_code("x") is None
    assert expand_nodelist("gpu[01-03,7],login") == ("gpu01", "gpu02", "gpu03", "gpu7", "login")
    assert sbatch_error("sbatch: error: invalid partition specified: nope\n"
                        "sbatch: error: Batch job submission failed: Invalid partition name specified") == \
        "Invalid partition name specified"


def test_merge_takes_the_rank_and_node_from_the_record_and_the_state_from_slurm() -> None:
    from higgsfield.control.backends.slurm.parse import Job
    from higgsfield.node.state.records import RunRecord

    record = RunRecord(project="p", experiment="e", run="r", node="n1", node_rank=0, nnodes=2, nproc=1,
                       state="failed", reason="rank 3: RuntimeError: boom on node n2", failed_node="n2",
                       failed_rank=3, error_tail=["boom"], started_at=5.0, ended_at=9.0)
    record = encode(record)
    st = merge(decode_job({"job_id": "4", "project": "p", "run": "r", "submitted_at": 1.0}),
               Job("4", "FAILED", "NonZeroExitCode", 1, ("n1", "n2")), record)
    assert (st.state, st.failed_node, st.failed_rank, st.exit_code) == ("failed", "n2", 3, 1)
    assert st.reason == record["reason"] and list(st.nodes) == ["n1", "n2"]
    timeout = merge(SlurmJob("4"), Job("4", "TIMEOUT"), record)
    assert timeout.reason and timeout.reason.startswith("TIMEOUT") and "boom" in timeout.reason
    gone = merge(SlurmJob("4"), None, {**record, "state": "succeeded"})   # no accounting, job purged
    assert gone.state == "succeeded"
    assert merge(SlurmJob("4"), None, None).state == "queued"


# -- settings ---------------------------------------------------------------------------------

GOOD = {"login": {"host": "login.cluster.example", "user": "me"}, "workdir": "/shared/me/hf",
        "partition": "gpu", "account": "my-lab", "nodes": 8, "gpus_per_node": 8, "time": "24:00:00"}


def test_settings_read_the_issue_example() -> None:
    s = SlurmConfig.model_validate(GOOD)
    assert (s.login.host, s.login.user, s.login.port, s.nodes, s.gpus_per_node) == \
        ("login.cluster.example", "me", 22, 8, 8)
    assert s.interpreter == "/shared/me/hf/venv/bin/python"
    o = s.override(nodes=2, time="30", partition="debug")
    assert (o.nodes, o.time, o.partition, s.nodes) == (2, "30", "debug", 8)


@pytest.mark.parametrize(("change", "words"), [
    ({"workdir": "relative/dir"}, "slurm.workdir: 'relative/dir' must be an absolute path"),
    ({"workdir": "/shared/my dir"}, "slurm.workdir: '/shared/my dir' has a blank"),
    ({"partition": "gpu;rm"}, "slurm.partition: 'gpu;rm' is not a partition name"),
    ({"account": "a b"}, "slurm.account: 'a b' is not an account name"),
    ({"time": "24h"}, "slurm.time: '24h' is not a Slurm time limit"),
    ({"time": "0"}, "slurm.time: '0' is a time limit of zero"),
    ({"nodes": 0}, "slurm.nodes: input should be greater than or equal to 1 (got 0)"),
    ({"gpus_per_node": True}, "slurm.gpus_per_node: expected a number, not true"),
    ({"login": {"host": "-oProxyCommand=x"}}, "slurm.login.host"),
    ({"login": {"host": "h", "user": "root"}}, "slurm.login.user: 'root' is refused"),
    ({"nodez": 2}, "slurm.nodez: unknown key 'nodez'"),
    ({"extra": ["--qos high"]}, "slurm.extra: '--qos high' is not one sbatch option"),
])
def test_settings_errors_are_one_line_naming_the_field(tmp_path: Path, change: dict[str, object], words: str) -> None:
    """As a user meets them: higgsfield.yml read by the config loader, one line naming the file, line and field."""
    path = tmp_path / "higgsfield.yml"
    path.write_text(yaml.safe_dump({"name": "lab", "slurm": {**GOOD, **change}}, sort_keys=False))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}:") and f": {words}" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_time_limits() -> None:
    for ok, secs in (("90", 5400), ("10:30", 630), ("24:00:00", 86400), ("2-00", 172800),
                     ("1-02:03", 93780), ("1-00:00:01", 86401)):
        assert check_time(ok) == ok and seconds(ok) == secs
    assert check_time("unlimited") == "UNLIMITED" and seconds("UNLIMITED") == -1
    assert check_time(45) == "45"
    with pytest.raises(ConfigError, match="--time"):
        SlurmConfig.model_validate(GOOD).override(time="soon", where="")


def test_the_task_module_stays_free_of_the_control_side() -> None:
    code = ("import sys, higgsfield.node.slurm_task; "
            "print(sorted(m for m in sys.modules if m.startswith(('higgsfield.control.backends.slurm.', 'higgsfield.control.remote', "
            "'higgsfield.control.config', 'asyncssh', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == "[]"
