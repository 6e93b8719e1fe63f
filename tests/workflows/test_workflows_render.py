"""`higgsfield build-experiments`: typed forms, thin safe jobs, determinism, stale files, user files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from wf_helpers import CONFIG, load, make_project, steps

from higgsfield import __version__
from higgsfield.contract.errors import ExperimentError, HiggsfieldError
from higgsfield.control.config import load_config
from higgsfield.control.project.discovery import discover
from higgsfield.control.workflows import HEADER_MARKER, build_workflows, render_workflows
from higgsfield.control.workflows.form import MAX_INPUTS
from higgsfield.control.workflows.render import PINNED_ACTIONS


def hf(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def rendered(project: Path) -> dict[str, str]:
    cfg = load_config(project / "higgsfield.yml")
    return render_workflows(cfg, discover(project / "src"))


def test_files_and_header(project: Path) -> None:
    files = rendered(project)
    assert sorted(files) == ["deploy.yml", "kill.yml", "run_alpaca.yml", "run_tiny.yml"]
    for text in files.values():
        first = text.splitlines()[0]
        assert first.startswith(HEADER_MARKER) and f"higgsfield {__version__}" in first
        assert "higgsfield build-experiments" in first and text.endswith("\n") and not text.endswith("\n\n")
    assert "# Source: src/train.py" in files["run_alpaca.yml"]
    assert ".higgsfield/known_hosts" in files["deploy.yml"].split("name: Deploy")[0]


def test_form_inputs_are_typed(project: Path) -> None:
    inputs = load(rendered(project)["run_alpaca.yml"])["on"]["workflow_dispatch"]["inputs"]
    assert list(inputs) == ["run_name", "nodes", "lr", "steps", "size", "shards", "fast", "data", "note", "on"]
    assert inputs["run_name"] == {"description": inputs["run_name"]["description"], "type": "string",
                                  "required": False, "default": ""}
    assert inputs["nodes"]["type"] == "number" and "default" not in inputs["nodes"]
    assert "(2)" in inputs["nodes"]["description"]
    assert inputs["lr"] == {"description": "Learning rate", "type": "number", "required": False, "default": 0.001}
    assert inputs["steps"] == {"description": "Optimizer steps", "type": "number", "required": False,
                               "default": 100}
    assert inputs["size"] == {"description": "Model size", "type": "choice", "required": False, "default": "7b",
                              "options": ["7b", "13b", "70b"]}
    # choice options are text, exactly what ParamSpec.coerce reads back
    assert inputs["shards"]["options"] == ["1", "2", "4"] and inputs["shards"]["default"] == "2"
    assert inputs["fast"] == {"description": "Use the fast path", "type": "boolean", "required": False,
                              "default": False}
    assert inputs["data"] == {"description": "Dataset path", "type": "string", "required": True}
    assert inputs["on"]["type"] == "boolean" and "default" not in inputs["on"]   # a YAML-special key, quoted


def test_the_form_carries_a_stall_timeout_where_it_has_room(project: Path) -> None:
    # alpaca's params fill the form: they come first, and its runs take higgsfield.yml's stall_timeout
    assert "stall_timeout" not in load(rendered(project)["run_alpaca.yml"])["on"]["workflow_dispatch"]["inputs"]
    wf = load(rendered(project)["run_tiny.yml"])
    inputs = wf["on"]["workflow_dispatch"]["inputs"]
    assert list(inputs) == ["run_name", "nodes", "stall_timeout"]
    st = inputs["stall_timeout"]
    assert st["type"] == "number" and st["required"] is False and "default" not in st
    assert st["description"].endswith("empty: stall_timeout in higgsfield.yml (600)")
    (launch,) = [s for _j, s in steps(wf) if s.get("run", "").startswith("higgsfield ci")]
    assert launch["env"]["HIGGSFIELD_STALL_TIMEOUT"] == "${{ inputs.stall_timeout }}"
    # a @param of that name is the experiment's own: the form has no second field of it
    proj = make_project(project.parent / "p2", experiment='''
        from higgsfield.experiment import experiment, param
        @experiment("e")
        @param("stall_timeout", default=3)
        def e(params):
            pass
        ''')
    inputs = load(rendered(proj)["run_e.yml"])["on"]["workflow_dispatch"]["inputs"]
    assert list(inputs) == ["run_name", "nodes", "stall_timeout"]
    assert inputs["stall_timeout"]["default"] == 3


def test_a_slurm_projects_form_says_an_empty_nodes_asks_for_slurm_nodes(tmp_path: Path) -> None:
    # A Slurm project lists no nodes: an empty field asks for slurm.nodes, not "every node" of none.
    proj = make_project(tmp_path / "p", config="name: lab\nslurm:\n  login: login.example\n  nodes: 8\n"
                                               "  workdir: /shared/lab\n")
    nodes = load(rendered(proj)["run_alpaca.yml"])["on"]["workflow_dispatch"]["inputs"]["nodes"]
    assert nodes["description"].endswith("empty: slurm.nodes in higgsfield.yml (8)")
    assert "every node" not in nodes["description"]


def test_float_defaults_read_back_as_floats_in_yaml_1_1(tmp_path: Path) -> None:
    proj = make_project(tmp_path / "p", experiment='''
        from higgsfield.experiment import experiment, param
        @experiment("e")
        @param("eps", default=1e-05)
        @param("big", default=1e20)
        @param("neg", default=-2.5)
        def e(params):
            pass
        ''')
    inputs = load(rendered(proj)["run_e.yml"])["on"]["workflow_dispatch"]["inputs"]
    assert inputs["eps"]["default"] == 1e-05 and isinstance(inputs["eps"]["default"], float)
    assert inputs["big"]["default"] == 1e20 and inputs["neg"]["default"] == -2.5


def test_scripts_never_contain_expressions_and_inputs_go_through_env(project: Path) -> None:
    for name, text in rendered(project).items():
        wf = load(text)
        for _job, step in steps(wf):
            if "run" in step:
                assert "${{" not in step["run"], (name, step)
        # every expression sits in env:, if:, outputs: or run-name, never in a script
        for line in text.splitlines():
            if "${{" in line and not line.lstrip().startswith("#"):
                key = line.split(":", 1)[0].strip()
                assert key in ("run-name", "ready", "HAS_SSH_KEY", "SSH_KEY", "HIGGSFIELD_SSH_KEY_FILE",
                               "HIGGSFIELD_RUN_NAME", "HIGGSFIELD_NODES", "HIGGSFIELD_KILL_TARGET",
                               "HIGGSFIELD_STALL_TIMEOUT",
                               "WANDB_API_KEY", "HF_TOKEN") or key.startswith("HIGGSFIELD_PARAM_"), (name, line)
    run = load(rendered(project)["run_alpaca.yml"])
    (launch,) = [s for _j, s in steps(run) if s.get("run", "").startswith("higgsfield ci")]
    assert launch["run"] == "higgsfield ci run alpaca"
    assert launch["env"]["HIGGSFIELD_PARAM_note"] == "${{ inputs.note }}"
    assert launch["env"]["HIGGSFIELD_PARAM_on"] == "${{ inputs.on }}"
    assert launch["env"]["HIGGSFIELD_RUN_NAME"] == "${{ inputs.run_name }}"
    assert launch["env"]["HIGGSFIELD_NODES"] == "${{ inputs.nodes }}"
    kill = load(rendered(project)["kill.yml"])
    (k,) = [s for _j, s in steps(kill) if s.get("run", "").startswith("higgsfield ci")]
    assert k["run"] == 'higgsfield ci kill -- "$HIGGSFIELD_KILL_TARGET"'
    assert k["env"]["HIGGSFIELD_KILL_TARGET"] == "${{ inputs.target }}"


def test_jobs_are_thin_and_pinned(project: Path) -> None:
    for name, text in rendered(project).items():
        wf = load(text)
        assert wf["permissions"] == {"contents": "read"}
        commands = [s["run"] for _j, s in steps(wf) if "run" in s and "higgsfield ci" in s["run"]]
        assert len(commands) == 1, name
        for _job, step in steps(wf):
            if "uses" in step:  # a full commit SHA, the release named in a comment beside it
                assert re.fullmatch(r"actions/(checkout|setup-python)@[0-9a-f]{40}", step["uses"]), step
                action, sha = step["uses"].split("@")
                assert f"uses: {action}@{sha} # {PINNED_ACTIONS[action][1]}\n" in text
                assert PINNED_ACTIONS[action][0] == sha
        for job in wf["jobs"].values():
            assert isinstance(job.get("timeout-minutes"), int)
        job = wf["jobs"]["deploy" if name == "deploy.yml" else next(iter(wf["jobs"]))]
        names = [s.get("name") for s in job["steps"]]
        assert names[:4] == ["Check out", "Set up Python", "Install higgsfield", "Write the SSH key (mode 0600)"]
        assert names[-1] == "Remove the SSH key" and job["steps"][-1]["if"] == "always()"
        checkout = job["steps"][0]
        assert checkout["with"] == {"persist-credentials": False}
        install = job["steps"][2]
        assert install["env"]["HIGGSFIELD_INSTALL"] == f"higgsfield=={__version__}"
        key = job["steps"][3]
        assert key["env"]["SSH_KEY"] == "${{ secrets.SSH_KEY }}" and "umask 077" in key["run"]


def test_secrets_only_where_needed(project: Path) -> None:
    files = rendered(project)
    run = load(files["run_alpaca.yml"])
    launch = [s for _j, s in steps(run) if s.get("run", "").startswith("higgsfield ci")][0]
    assert launch["env"]["WANDB_API_KEY"] == "${{ secrets.WANDB_API_KEY }}"
    assert launch["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    for name in ("deploy.yml", "kill.yml"):
        assert "WANDB_API_KEY }}" not in files[name] and "HF_TOKEN }}" not in files[name]
    # SSH_KEY is read by exactly one step per job (plus the boolean check in deploy's first job)
    for name, text in files.items():
        assert text.count("${{ secrets.SSH_KEY }}") == 1, name


def test_concurrency_by_purpose(project: Path) -> None:
    files = rendered(project)
    deploy = load(files["deploy.yml"])
    assert deploy["concurrency"] == {"group": "higgsfield-demo-deploy", "cancel-in-progress": False}
    for name in ("kill.yml", "run_alpaca.yml", "run_tiny.yml"):
        wf = load(files[name])
        assert "concurrency" not in wf and all("concurrency" not in j for j in wf["jobs"].values()), name


def test_deploy_triggers_and_secret_check(project: Path) -> None:
    deploy = load(rendered(project)["deploy.yml"])
    assert deploy["on"] == {"push": {"branches": ["main"]}, "workflow_dispatch": {}}
    check = deploy["jobs"]["secrets"]
    assert check["outputs"] == {"ready": "${{ steps.check.outputs.ready }}"}
    assert check["steps"][0]["env"] == {"HAS_SSH_KEY": "${{ secrets.SSH_KEY != '' }}"}
    assert "::notice" in check["steps"][0]["run"] and "WANDB_API_KEY, HF_TOKEN" in check["steps"][0]["run"]
    assert deploy["jobs"]["deploy"]["needs"] == "secrets"
    assert deploy["jobs"]["deploy"]["if"] == "needs.secrets.outputs.ready == 'true'"


def test_install_source_and_index_are_configurable(tmp_path: Path) -> None:
    proj = make_project(tmp_path / "p", config=CONFIG + "default_branch: trunk\ninstall:\n"
                        "  source: git+https://github.com/acme/higgsfield@v0.1.0\n"
                        "  index_url: https://pypi.acme.internal/simple\n")
    for text in rendered(proj).values():
        wf = load(text)
        install = [s for _j, s in steps(wf) if s.get("name") == "Install higgsfield"][0]
        assert install["env"] == {"HIGGSFIELD_INSTALL": "git+https://github.com/acme/higgsfield@v0.1.0",
                                  "PIP_EXTRA_INDEX_URL": "https://pypi.acme.internal/simple"}
        assert install["run"] == 'python -m pip install --disable-pip-version-check "$HIGGSFIELD_INSTALL"'
    assert load(rendered(proj)["deploy.yml"])["on"]["push"]["branches"] == ["trunk"]


def test_injection_values_render_as_inert_data(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    proj = make_project(tmp_path / "p", marker=marker)
    text = rendered(proj)["run_alpaca.yml"]
    inputs = load(text)["on"]["workflow_dispatch"]["inputs"]
    # the default reads back exactly, as data
    assert inputs["note"]["default"] == f'"; rm -rf ~ # $(touch {marker})'
    # an expression in a description is made inert ("$ {{"): GitHub would evaluate "${{"
    assert inputs["note"]["description"] == f"$(touch {marker}) `id` $ {{{{ secrets.SSH_KEY }}}}"
    assert not marker.exists()


def test_values_in_comments_stay_on_one_line(project: Path) -> None:
    from higgsfield.control.workflows.render import yaml_comment

    assert yaml_comment("a\nb\r\nc\u2028d\x85e") == "a b  c d e"
    cfg = load_config(project / "higgsfield.yml")
    # config validation refuses this branch name now; the filter is the second line of defence
    cfg.default_branch = 'main\n"on": {push: {}}\n#'
    text = render_workflows(cfg, discover(project / "src"))["deploy.yml"]
    header = text.split("\nname: ", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines()), header
    assert load(text)["on"]["push"]["branches"] == ['main\n"on": {push: {}}\n#']  # data, not YAML


def test_expression_in_a_default_is_refused(tmp_path: Path) -> None:
    proj = make_project(tmp_path / "p", experiment='''
        from higgsfield.experiment import experiment, param
        @experiment("e")
        @param("x", default="${{ secrets.SSH_KEY }}")
        def e(params):
            pass
        ''')
    with pytest.raises(ExperimentError, match=r"@param 'x'.*GitHub reads as an expression"):
        rendered(proj)


def test_names_differing_only_in_case_are_refused(tmp_path: Path) -> None:
    proj = make_project(tmp_path / "p", experiment='''
        from higgsfield.experiment import experiment, param
        @experiment("e")
        @param("lr", default=1.0)
        @param("LR", default=1.0)
        def e(params):
            pass
        ''')
    with pytest.raises(ExperimentError, match="differ only in case"):
        rendered(proj)


def test_params_beyond_the_form_limit_go_to_more_params(tmp_path: Path) -> None:
    decorators = "\n".join(f'@param("p{i}", default={i})' for i in range(11))
    proj = make_project(tmp_path / "p", experiment=f'''
from higgsfield.experiment import experiment, param
@experiment("wide")
@param("must", type=str, required=True)
{decorators}
def e(params):
    pass
''')
    inputs = load(rendered(proj)["run_wide.yml"])["on"]["workflow_dispatch"]["inputs"]
    assert len(inputs) == MAX_INPUTS
    assert list(inputs)[:3] == ["run_name", "nodes", "must"]          # required params keep their own field
    assert list(inputs)[-1] == "more_params" and inputs["more_params"]["type"] == "string"
    assert "p6=6 p7=7 p8=8 p9=9 p10=10" in inputs["more_params"]["description"]


def test_build_is_deterministic_and_spares_user_workflows(project: Path) -> None:
    out = project / ".github" / "workflows"
    out.mkdir(parents=True)
    user = out / "ci.yml"
    user.write_text("name: CI\non: push\njobs: {}\n")
    cfg = load_config(project / "higgsfield.yml")
    first = build_workflows(cfg)
    assert first.written == ["deploy.yml", "kill.yml", "run_alpaca.yml", "run_tiny.yml"] and not first.removed
    snapshot = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    second = build_workflows(cfg)
    assert not second.changed and second.unchanged == first.written
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == snapshot

    # rename an experiment: its old workflow goes, the user's stays byte for byte
    train = project / "src" / "train.py"
    train.write_text(train.read_text().replace('@experiment("tiny")', '@experiment("small")'))
    third = build_workflows(cfg)
    assert third.removed == ["run_tiny.yml"] and third.written == ["kill.yml", "run_small.yml"]
    assert sorted(p.name for p in out.iterdir()) == ["ci.yml", "deploy.yml", "kill.yml", "run_alpaca.yml",
                                                    "run_small.yml"]
    assert user.read_text() == "name: CI\non: push\njobs: {}\n"


def test_a_user_file_with_a_generated_name_is_never_overwritten(project: Path) -> None:
    out = project / ".github" / "workflows"
    out.mkdir(parents=True)
    (out / "deploy.yml").write_text("name: my own deploy\n")
    with pytest.raises(HiggsfieldError, match="did not generate"):
        build_workflows(load_config(project / "higgsfield.yml"))
    assert (out / "deploy.yml").read_text() == "name: my own deploy\n"
    assert sorted(p.name for p in out.iterdir()) == ["deploy.yml"]


def test_cli_build_check_and_experiments(project: Path) -> None:
    r = hf(project, "build-experiments", "--check")
    assert r.returncode == 1 and "is not up to date" in r.stderr, r.stderr
    assert not (project / ".github").exists()
    r = hf(project, "build-experiments")
    assert r.returncode == 0, r.stderr
    assert "wrote .github/workflows/run_alpaca.yml" in r.stdout
    assert r.stdout.strip().endswith("changed (2 experiments: alpaca, tiny)")
    r = hf(project, "build-experiments", "--check")
    assert r.returncode == 0 and r.stdout.strip() == ".github/workflows: up to date (2 experiments: alpaca, tiny)"
    r = hf(project, "experiments")
    assert r.returncode == 0 and "alpaca  (src/train.py:" in r.stdout and "size: str, default '7b'" in r.stdout


def test_this_repos_committed_workflows_are_up_to_date() -> None:
    """The workflows committed for this repo's own src/ are what build-experiments renders today."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "higgsfield", "build-experiments", "--check"], cwd=repo,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to date" in r.stdout + r.stderr


def test_notify_destinations_reach_the_run_job_as_secrets_and_only_it(tmp_path: Path) -> None:
    proj = make_project(tmp_path / "p", config=CONFIG + "notify:\n  to: [SLACK_URL, HF_TOKEN]\n")
    files = rendered(proj)
    launch = [s for _j, s in steps(load(files["run_alpaca.yml"])) if s.get("run", "").startswith("higgsfield ci")][0]
    assert [k for k in launch["env"] if "secrets." in str(launch["env"][k])] == \
        ["WANDB_API_KEY", "HF_TOKEN", "SLACK_URL"]   # a name in both lists once
    assert all("secrets.SLACK_URL" not in files[n] for n in ("deploy.yml", "kill.yml"))
    assert "Runs also read these secrets: WANDB_API_KEY, HF_TOKEN, SLACK_URL." in files["deploy.yml"]
