"""Step metrics end to end without a cluster: the JSON-lines model, the writer (rank 0 only), the node's
reader (torn lines, restarts), ``nvidia-smi`` parsing and the machine sampler."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest

from higgsfield.contract.codec import encode
from higgsfield.metrics import METRICS_FILE, StepMetrics, decode_line, latest_per_step, parse_lines
from higgsfield.node.observe.metrics import read_metrics
from higgsfield.node.observe.stats import Sampler, parse_smi
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

pytestmark = pytest.mark.timeout(60)


def test_a_step_round_trips_and_a_diverged_loss_is_null() -> None:
    m = StepMetrics(step=3, loss=2.5, tokens_per_s=5400.0, step_time_s=0.2, lr=3e-4, time=1.0)
    assert decode_line(m.to_json()) == m
    nan = StepMetrics(step=4, loss=float("nan"), tokens_per_s=float("inf"), step_time_s=0.1)
    d = json.loads(nan.to_json())
    assert d["loss"] is None and d["tokens_per_s"] is None     # valid JSON, never NaN
    back = decode_line(json.dumps({**d, "tokens_per_s": 1.0}))
    assert math.isnan(back.loss)
    assert "lr 3.00e-04" in str(m)


def test_foreign_torn_and_repeated_lines() -> None:
    lines = ['{"step": 1, "loss": 3.0, "tokens_per_s": 10, "step_time_s": 0.1}',
             "not json", '{"step": "x"}', "[1, 2]", "",
             '{"step": 2, "loss": 2.0, "tokens_per_s": 10, "step_time_s": 0.1, "newer_field": 1}',
             '{"step": 2, "loss": 1.5, "tokens_per_s": 10, "step_time_s": 0.1}',   # a restarted worker again
             '{"step": 3, "loss": 1.0, "tok']
    got = parse_lines(lines)
    assert [m.step for m in got] == [1, 2, 2]
    assert [(m.step, m.loss) for m in latest_per_step(got)] == [(1, 3.0), (2, 1.5)]


def test_the_node_reader_waits_for_a_torn_line_and_ends_with_the_run(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "p", "r")
    rd.make()
    path = rd.path / METRICS_FILE
    path.write_text('{"step": 1, "loss": 3.0, "tokens_per_s": 1, "step_time_s": 1}\n{"step": 2, "lo')
    done = threading.Event()

    def finish() -> None:
        time.sleep(0.5)
        with open(path, "a") as f:
            f.write('ss": 2.0, "tokens_per_s": 1, "step_time_s": 1}\n')
        done.set()

    threading.Thread(target=finish).start()
    got = [x.step for x in read_metrics(rd, follow=True, is_done=done.is_set) if isinstance(x, StepMetrics)]
    assert got == [1, 2]
    assert [x.step for x in read_metrics(rd, skip=1) if isinstance(x, StepMetrics)] == [2]
    assert list(read_metrics(RunDir(NodeState(tmp_path), "p", "other"))) == []   # a node without the file: nothing


def test_only_rank_0_writes_and_outside_a_run_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from higgsfield.training import MetricsLog, StepTimer

    # the rank comes from RANK here, as before a process group exists (another test of this
    # process may have left one initialized)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setenv("HIGGSFIELD_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    StepTimer().step(1, 2.0, 10)
    assert not (tmp_path / METRICS_FILE).exists()
    monkeypatch.setenv("RANK", "0")

    class Opt:
        param_groups = [{"lr": 0.125}]

    timer = StepTimer(optimizer=Opt())
    for step in range(3):
        timer.step(step, 2.0 - step, 10)
    assert isinstance(timer.log, MetricsLog)
    timer.log.close()
    got = parse_lines((tmp_path / METRICS_FILE).read_text().splitlines())
    assert [(m.step, m.lr) for m in got] == [(0, 0.125), (1, 0.125), (2, 0.125)]
    assert (tmp_path / METRICS_FILE).stat().st_mode & 0o777 == 0o600
    monkeypatch.delenv("HIGGSFIELD_RUN_DIR")
    assert StepTimer().log is not None and StepTimer().log.path is None   # type: ignore[union-attr]


def test_nvidia_smi_lines() -> None:
    text = ("0, NVIDIA H200, 87, 40321, 143771, 61\n"
            "1, NVIDIA H200, [N/A], 10, 143771, [Not Supported]\n"
            "garbage line\n")
    gpus = parse_smi(text)
    assert gpus[0].util_percent == 87 and gpus[0].mem_total_mib == 143771 and gpus[0].temperature_c == 61
    assert gpus[1].util_percent is None and gpus[1].temperature_c is None
    assert set(gpus) == {0, 1}


def test_a_machine_sample(tmp_path: Path) -> None:
    s = Sampler(NodeState(tmp_path))
    try:
        d = encode(s.sample())
    finally:
        s.close()
    assert 0 <= d["cpu_percent"] <= 100 and d["cpu_count"] >= 1
    assert 0 < d["mem_used"] <= d["mem_total"] and 0 < d["disk_used"] <= d["disk_total"]
    assert isinstance(d["gpus"], list)


def test_wandb_gets_the_steps_only_where_the_user_started_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import sys
    import types

    from higgsfield.training import MetricsLog

    logged: list[tuple[dict[str, float], int]] = []
    fake = types.SimpleNamespace(run=None, log=lambda d, step: logged.append((d, step)))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("RANK", "0")
    log = MetricsLog(tmp_path / METRICS_FILE)
    log.write(StepMetrics(step=1, loss=2.0, tokens_per_s=10.0, step_time_s=0.1))
    assert logged == []                                   # imported but no wandb.init: nothing sent
    fake.run = object()
    log.write(StepMetrics(step=2, loss=1.5, tokens_per_s=10.0, step_time_s=0.1, lr=0.1))
    log.close()
    assert logged == [({"loss": 1.5, "tokens_per_s": 10.0, "step_time_s": 0.1, "lr": 0.1}, 2)]
    assert [m.step for m in parse_lines((tmp_path / METRICS_FILE).read_text().splitlines())] == [1, 2]
