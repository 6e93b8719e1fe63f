"""AST discovery of experiments: found however imported and in any decorator order, never imported."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_project import BODY, IMPORT_STYLES, write

from higgsfield.contract.errors import ExperimentError
from higgsfield.control.project.discovery import discover, find_experiment


@pytest.mark.parametrize("source", list(IMPORT_STYLES.values()), ids=list(IMPORT_STYLES))
def test_found_whatever_the_import_and_order(tmp_path: Path, source: str) -> None:
    file = write(tmp_path / "src" / "mod.py", source + BODY)
    (exp,) = discover(tmp_path / "src")
    assert exp.name == "e" and exp.seed == 1 and exp.function == "train"
    assert exp.file == file.resolve() and exp.module == "mod"
    assert [p.name for p in exp.params] == ["size", "lr"]  # source order, whatever the decorator order
    size, lr = exp.params
    assert (size.type, size.default, size.options) == ("str", "7b", ("7b", "13b"))
    assert (lr.type, lr.default) == ("float", 0.1)


def test_module_names_and_nested_dirs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "llama" / "tiny.py", "from higgsfield.experiment import experiment\n"
                                     "@experiment('tiny')\ndef f(params): pass\n")
    write(src / "pkg" / "__init__.py", "from higgsfield.experiment import experiment\n"
                                       "@experiment('init_exp')\ndef g(params): pass\n")
    write(src / "top.py", "from higgsfield.experiment import experiment\n@experiment('top')\ndef h(params): pass\n")
    write(src / "__pycache__" / "junk.py", "from higgsfield.experiment import experiment\n"
                                           "@experiment('junk')\ndef j(params): pass\n")
    write(src / ".hidden" / "x.py", "from higgsfield.experiment import experiment\n"
                                    "@experiment('hidden')\ndef k(params): pass\n")
    exps = discover(src)
    assert [(e.name, e.module) for e in exps] == [("init_exp", "pkg"), ("tiny", "llama.tiny"), ("top", "top")]
    assert find_experiment(src, "tiny").function == "f"
    with pytest.raises(ExperimentError, match=r"no experiment named 'nope' \(experiments: init_exp, tiny, top\)"):
        find_experiment(src, "nope")


def test_never_imports_the_module(tmp_path: Path) -> None:
    write(tmp_path / "src" / "boom.py", """\
        import torch_that_is_not_installed
        raise SystemExit("imported!")
        from higgsfield.experiment import experiment, param

        @experiment("boom")
        @param("steps", default=3)
        def train(params):
            raise RuntimeError
        """)
    (exp,) = discover(tmp_path / "src")
    assert exp.name == "boom" and exp.params[0].default == 3


def test_unrelated_decorators_and_names_are_ignored(tmp_path: Path) -> None:
    write(tmp_path / "src" / "other.py", """\
        import higgsfield
        from mylib import experiment, param      # not ours

        @experiment("not-ours")
        @param("x")
        def f(params): ...
        """)
    write(tmp_path / "src" / "plain.py", "def experiment(name):\n    return name\n")
    assert discover(tmp_path / "src") == []


def test_missing_src_dir(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="no such directory"):
        discover(tmp_path / "src")


# -- errors name the file and line ---------------------------------------------

HEAD = "from higgsfield.experiment import experiment, param\n"


@pytest.mark.parametrize(("source", "line", "message"), [
    (HEAD + "@experiment('e')\n@param('x', default=foo())\ndef f(params): pass\n", 3,
     "default must be a literal value (a number, string, bool, None or list of them), not 'foo()'"),
    (HEAD + "N = 3\n@experiment('e')\n@param('x', default=N)\ndef f(params): pass\n", 4,
     "default must be a literal value (a number, string, bool, None or list of them), not 'N'"),
    (HEAD + "@experiment('e')\n@param('x', default=1, colour='red')\ndef f(params): pass\n", 3,
     "@param has no argument 'colour' (arguments: name, default, description, required, type, options)"),
    (HEAD + "@experiment('e', gpus=8)\ndef f(params): pass\n", 2,
     "@experiment has no argument 'gpus' (arguments: name, seed)"),
    (HEAD + "@experiment('e')\n@param('x', type='list')\ndef f(params): pass\n", 3,
     "@param 'x': type must be int, float, str or bool (got 'list')"),
    (HEAD + "@experiment('e')\n@param('x', type=dict)\ndef f(params): pass\n", 3,
     "type must be a literal value (a number, string, bool, None or list of them), not 'dict'"),
    (HEAD + "@experiment('e')\n@param('size', default='7b', options=['13b'])\ndef f(params): pass\n", 3,
     "@param 'size': default '7b' is not one of the options ['13b']"),
    (HEAD + "@param('x', default=1)\ndef f(params): pass\n", 2,
     "'f' has @param but no @experiment; add @experiment(\"name\") or remove the @param"),
    (HEAD + "@experiment('e')\n@param('rank')\ndef f(params): pass\n", 3,
     "@param name 'rank' is reserved"),
    (HEAD + "@experiment('e')\n@param('x')\n@param('x')\ndef f(params): pass\n", 4,
     "@param 'x' is declared twice on experiment 'e'"),
    (HEAD + "@experiment('bad-name')\ndef f(params): pass\n", 2, "experiment name 'bad-name' is not valid"),
    (HEAD + "@experiment()\ndef f(params): pass\n", 2, "@experiment needs a name, e.g. @experiment(\"f\")"),
    (HEAD + "@experiment\ndef f(params): pass\n", 2, "@experiment must be called"),
    (HEAD + "@experiment('e', seed='x')\ndef f(params): pass\n", 2, "seed must be an integer (got 'x')"),
    (HEAD + "@experiment('e')\n@experiment('g')\ndef f(params): pass\n", 3, "'f' has two @experiment decorators"),
    (HEAD + "@experiment('e')\ndef f(a, b): pass\n", 3, "must take exactly one argument, params"),
    (HEAD + "@experiment('e')\nasync def f(params): pass\n", 3, "must be a plain function, not async"),
    (HEAD + "@experiment('e')\n@param(*['x'])\ndef f(params): pass\n", 3, "@param arguments cannot use * or **"),
    (HEAD + "@experiment('e')\ndef f(params):\n    return (\n", 4, "syntax error"),
])
def test_bad_decorators_name_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, line: int,
                                           message: str) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "src" / "bad.py", source)
    with pytest.raises(ExperimentError) as info:
        discover(Path("src"))
    text = str(info.value)
    assert text.startswith(f"src/bad.py:{line}: "), text
    assert message in text
    assert "\n" not in text


def test_duplicate_experiment_names_across_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "src" / "a.py", HEAD + "\n@experiment('same')\ndef f(params): pass\n")
    write(tmp_path / "src" / "b.py", HEAD + "\n\n@experiment('same')\ndef g(params): pass\n")
    with pytest.raises(ExperimentError) as info:
        discover(Path("src"))
    assert str(info.value) == ("src/b.py:4: experiment 'same' is already defined at src/a.py:3; "
                               "experiment names must be unique")


def test_duplicate_experiment_names_in_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "src" / "a.py", HEAD + "@experiment('same')\ndef f(params): pass\n"
                                            "@experiment('same')\ndef g(params): pass\n")
    with pytest.raises(ExperimentError, match=r"^src/a.py:4: experiment 'same' is already defined at src/a.py:2"):
        discover(Path("src"))


def test_the_json_is_json_ready(tmp_path: Path) -> None:
    import json

    from higgsfield.contract.codec import encode

    write(tmp_path / "src" / "m.py", IMPORT_STYLES["from-import"] + BODY)
    (exp,) = discover(tmp_path / "src")
    d = json.loads(json.dumps(encode(exp.as_json())))
    assert d["name"] == "e" and d["params"][0]["options"] == ["7b", "13b"]
