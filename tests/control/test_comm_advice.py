"""Issue 31, "the link decides": an experiment's step priced on the last fabric test (control.doctor.comm_advice),
the project's cache of that test, ``doctor --fabric --model SIZE`` refused in one line, and ``run``'s one line
when its mode would spend over half a step communicating (the real CLI, its nodes unreachable: the line comes
before any node is contacted, and the run then fails as it would have anyway)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from helpers_project import run_cli, write

from higgsfield.contract.codec import encode
from higgsfield.contract.fabric import FabricResult, GpuRow, NodeRow, PairRow, SizeRow
from higgsfield.contract.fabric_last import LastFabric
from higgsfield.control.config import load_config
from higgsfield.control.doctor import comm_advice as ca
from higgsfield.control.doctor import fabric_cache

pytestmark = pytest.mark.timeout(60)

H100 = [GpuRow(i, "NVIDIA H100 80GB HBM3", 80000.0, 81559.0, "ok") for i in range(8)]
ALPACA = {"size": "7b", "precision": "bf16", "zero_stage": 3, "batch_size_per_gpu": 4, "max_sequence_length": 2048}


def fabric(busbw_gbps: float, *, nodes: int = 2, ranks: int = 8, gpus: list[GpuRow] | None = H100,
           intra: float | None = None) -> FabricResult:
    names = [f"n{i}" for i in range(nodes)]
    return FabricResult(
        backend="nccl", nodes=names, world_size=nodes * ranks,
        allreduce=[SizeRow(8, 2, 30.0, 0.0, 0.0), SizeRow(64 << 20, 16 << 20, 1.0, 1.0, busbw_gbps)],
        pairs=[PairRow("n0", "n1", 4 << 20, 100.0, busbw_gbps)],
        per_node=[NodeRow(n, ranks, intra, busbw_gbps, 500.0, "/x", gpus) for n in names], run="fabric-x")


def last(result: FabricResult, ago_s: float = 7200) -> LastFabric:
    return LastFabric(run="fabric-20261206-100000-ab12", at=time.time() - ago_s, result=result)


def test_size_from_a_size_param_or_from_hidden_and_layers() -> None:
    def size(values: dict[str, object]) -> tuple[float, str] | None:
        return ca.params_of(ca.Shape.of(values))

    assert size(ALPACA) == (7e9, "size=7b")
    assert size({"model_size": "1.3b", "size": "7b"}) == (1.3e9, "model_size=1.3b")
    assert size({"hidden": 128, "layers": 4}) == (12 * 4 * 128 * 128, "12 x layers x hidden^2 (4 x 128)")
    assert size({"size": "large"}) is None
    assert size({"hidden": 128, "layers": True}) is None
    assert size({"steps": 10}) is None


def test_tokens_a_step_and_the_mode_a_run_chooses() -> None:
    shape = ca.Shape.of
    assert ca.tokens_per_rank(shape(ALPACA), 16) == 4 * 2048
    assert ca.tokens_per_rank(shape({"global_batch": 64, "seq_len": 16}), 4) == 16 * 16
    assert ca.tokens_per_rank(shape({"global_batch": 64}), 4) is None
    assert ca.chosen_mode(shape({})) == "full"
    assert ca.chosen_mode(shape({"sharding": "auto", "zero_stage": 0})) == "replicate"
    assert ca.chosen_mode(shape({"sharding": "hybrid", "steps": 3})) == "hybrid"


def test_a_7b_on_10_gbe_is_told_of_diloco() -> None:
    # 7B, 2 nodes x 8 H100, 1.2 GB/s: full ~44 s and hybrid ~23 s of network a step against ~0.9 s of compute
    line = ca.run_line({**ALPACA, "sharding": "auto"}, 2, 8, last(fabric(1.2)))
    assert line is not None and "\n" not in line, line
    assert line.startswith("higgsfield: full would spend ~98% of a step communicating"), line
    assert "7B params, 1.2 GB/s busbw from doctor --fabric 2 h ago" in line
    assert line.endswith("DiLoCo(H=50) would spend ~21%"), line


def test_hybrid_is_named_with_the_param_that_chooses_it() -> None:
    # 1B, 16 x 4096 tokens a GPU: compute ~0.99 s; at 5 GB/s full ~1.5 s (60%), hybrid 0.8 s (45%)
    values = {"size": "1b", "sharding": "full", "batch_size_per_gpu": 16, "max_sequence_length": 4096}
    assert ca.run_line(values, 2, 8, last(fabric(25.0))) is None
    line = ca.run_line(values, 2, 8, last(fabric(5.0)))
    assert line is not None and "full would spend ~60%" in line, line
    assert line.endswith("hybrid would spend ~45% (--param sharding=hybrid)"), line
    no_param = {k: v for k, v in values.items() if k != "sharding"}
    line = ca.run_line(no_param, 2, 8, last(fabric(5.0)))
    assert line is not None and line.endswith("(Llama(sharding='hybrid'))"), line


def test_a_diloco_run_is_priced_as_one() -> None:
    values = {**ALPACA, "sharding": "hybrid", "diloco_every": 0, "diloco_quantize": "int8"}
    line = ca.run_line(values, 2, 8, last(fabric(1.2)))
    assert line is not None and line.endswith("DiLoCo(H=50) would spend ~12% (--param diloco_every=50)"), line
    assert ca.chosen_mode(ca.Shape.of({**values, "diloco_every": 100})) == "diloco"
    assert ca.run_line({**values, "diloco_every": 100}, 2, 8, last(fabric(1.2))) is None
    assert ca.run_line({**values, "diloco_every": 1, "diloco_quantize": "none"}, 2, 8, last(fabric(1.2))) is not None


def test_no_line_without_the_figures_it_needs() -> None:
    assert ca.run_line(ALPACA, 1, 8, last(fabric(0.1))) is None                    # one node: no network
    assert ca.run_line(ALPACA, 2, 8, None) is None                                 # no fabric test kept
    assert ca.run_line({"size": "7b"}, 2, 8, last(fabric(0.1))) is None            # tokens a step unknown
    assert ca.run_line({"steps": 3}, 2, 8, last(fabric(0.1))) is None              # size unknown
    assert ca.run_line({**ALPACA, "sharding": "hybrid"}, 2, 8, last(fabric(0.1)), now=0) is not None


def test_the_cache_round_trips_and_a_bad_file_is_no_figure(tmp_path: Path) -> None:
    write(tmp_path / "higgsfield.yml", "name: demo\nnodes:\n  - host: a.example.com\n")
    cfg = load_config(tmp_path / "higgsfield.yml")
    assert fabric_cache.load(cfg) is None
    result = fabric(1.5)
    fabric_cache.save(cfg, result, at=123.0)
    got = fabric_cache.load(cfg)
    assert got is not None and got.at == 123.0 and got.result is not None
    assert got.result.peak_busbw_gbps == 1.5 and got.run == "fabric-x"
    assert (fabric_cache.path_of(cfg).stat().st_mode & 0o777) == 0o600
    fabric_cache.path_of(cfg).write_text("{not json")
    assert fabric_cache.load(cfg) is None


def test_doctor_rows_for_the_project_and_for_a_model_size(tmp_path: Path) -> None:
    from rich.console import Console

    from higgsfield.control.cli._comm_table import render_comm

    write(tmp_path / "higgsfield.yml", "name: demo\nnodes:\n  - host: a.example.com\n  - host: b.example.com\n")
    write(tmp_path / "src" / "exps.py", """\
        from higgsfield.experiment import experiment, param

        @experiment("big")
        @param("size", default="7b", options=["7b", "13b"])
        @param("batch_size_per_gpu", default=4)
        @param("max_sequence_length", default=2048)
        def big(params):
            pass

        @experiment("tiny")
        @param("hidden", default=128)
        @param("layers", default=4)
        def tiny(params):
            pass

        @experiment("regression")
        def regression(params):
            pass
        """)
    cfg = load_config(tmp_path / "higgsfield.yml")
    rows, unknown, note = ca.project_rows(cfg, fabric(1.2))
    assert [r.experiment for r in rows] == ["big", "tiny"] and unknown == ["regression"] and note == ""
    big, tiny = rows
    assert [e.label for e in big.estimates] == ["full", "hybrid", "DiLoCo(H=50)"]
    assert big.compute_s is not None and tiny.compute_s is None
    assert big.estimates[0].seconds == pytest.approx(8 * 7e9 * 15 / 16 / 1.2e9)
    buf = io.StringIO()
    render_comm(Console(file=buf, width=250, color_system=None), rows, unknown, note)
    text = buf.getvalue()
    assert "big" in text and "7B (size=7b)" in text and "43.8 s (98%)" in text and "(188x)" in text, text
    assert "no model size known for regression" in text
    (model_row,), unknown, _ = ca.project_rows(cfg, fabric(1.2), model=1e9)
    assert model_row.experiment == "--model 1B" and unknown == []
    (shown,) = encode([model_row])                  # --json's "comm": the documented keys
    assert sorted(shown) == ["compute_s", "estimates", "experiment", "nodes", "params", "ranks_per_node", "source"]
    assert [sorted(e) for e in shown["estimates"]] == [["cross_bytes", "label", "mode", "seconds"]] * 3


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI in-process (as tests/test_bad_input.py runs it): exit 2, one ``error:`` line; the line."""
    from higgsfield.control.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_doctor_model_bad_size_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "higgsfield.yml", "name: demo\nnodes:\n  - host: a.example.com\n  - host: b.example.com\n")
    monkeypatch.chdir(tmp_path)
    assert _refused(["doctor", "--fabric", "--model", "7x"], capsys) == (
        "error: Invalid value for '--model': '7x' is not a model size: a number and k, m, b or t "
        "(125m, 1b, 1.3b, 7b, 70b) (see 'higgsfield doctor --help')\n")
    assert _refused(["doctor", "--model", "7b"], capsys) == (
        "error: --nodes, --max-bytes and --model go with --fabric (see 'higgsfield doctor --help')\n")


PROJECT = """\
    name: demo
    nodes:
      - {host: 127.0.0.1, port: 1, name: a}
      - {host: 127.0.0.1, port: 9, name: b}
    nproc_per_node: 8
    runtime: process
    ssh:
      connect_timeout: 2
      user: hfuser
    """
EXPERIMENT = """\
    from higgsfield.experiment import experiment, param

    @experiment("big")
    @param("size", default="7b", options=["7b", "13b"])
    @param("sharding", default="auto", options=["auto", "full", "hybrid"])
    @param("batch_size_per_gpu", default=4)
    @param("max_sequence_length", default=2048)
    def big(params):
        pass
    """


def test_a_planned_run_on_one_node_or_several(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from higgsfield.control.backends import RunRequest, backend_for

    write(tmp_path / "higgsfield.yml", PROJECT)
    write(tmp_path / "src" / "big.py", EXPERIMENT)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(tmp_path / "higgsfield.yml")
    backend = backend_for(cfg)
    two, one = backend.plan(RunRequest("big", {})), backend.plan(RunRequest("big", {}, nodes=1))
    assert ca.plan_line(cfg, two) is None                     # no fabric test kept yet
    fabric_cache.save(cfg, fabric(1.2))
    line = ca.plan_line(cfg, two)
    assert line is not None and line.startswith("higgsfield: full would spend ~98%"), line
    assert ca.plan_line(cfg, one) is None                     # one node: nothing crosses a network
    hybrid = backend.plan(RunRequest("big", {"sharding": "hybrid"}))
    line = ca.plan_line(cfg, hybrid)
    assert line is not None and line.startswith("higgsfield: hybrid would spend ~96%"), line
    assert ca.plan_line(cfg, object()) is None                # a hint never raises


def test_run_prints_the_line_before_it_starts(tmp_path: Path) -> None:
    write(tmp_path / "higgsfield.yml", PROJECT)
    write(tmp_path / "src" / "big.py", EXPERIMENT)
    fabric_cache.save(load_config(tmp_path / "higgsfield.yml"), fabric(1.2))
    r = run_cli(tmp_path, "run", "big", timeout=50)
    lines = [x for x in r.stderr.splitlines() if "would spend" in x]
    assert len(lines) == 1 and r.stderr.startswith(lines[0]), r.stderr
    assert lines[0].startswith("higgsfield: full would spend ~98% of a step communicating"), lines
    assert r.returncode != 0 and "cannot connect" in r.stderr, r.stderr   # unreachable nodes: it went on to start
