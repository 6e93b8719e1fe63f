"""The straggler rule (higgsfield.node.gang.stragglers) on recorded series and on the cases around its edges,
and what a node does with the coordinator's finding (higgsfield.node.runs.stragglers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.gang import KINDS, Progress, Straggling
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.contract.straggler import RankWork, Straggler, parse_work, work_line
from higgsfield.node.gang.stall import StallWatch
from higgsfield.node.gang.stragglers import StragglerRule

pytestmark = pytest.mark.timeout(30)

DATA = Path(__file__).parent / "data"


def replay(name: str, rule: StragglerRule | None = None) -> tuple[StragglerRule, dict[int, int], dict[str, Any]]:
    """Feed a recorded series (bench/straggler.py --record) to a rule: the rule, and rank -> the highest step
    any rank had reported when that rank was first named."""
    data = json.loads((DATA / name).read_text())
    rule = rule or StragglerRule()
    named_at: dict[int, int] = {}
    newest = 0
    for rank, step, steps, own, step_s, at in data["rows"]:
        newest = max(newest, step)
        rule.report([RankWork(rank=rank, step=step, steps=steps, own_s=own, step_s=step_s, node="localhost")], at)
        for r in rule.named:
            named_at.setdefault(r, newest)
    return rule, named_at, data


def works(step: int, own: dict[int, float], steps: int = 2) -> list[RankWork]:
    return [RankWork(rank=r, step=step, steps=steps, own_s=v, step_s=max(own.values()), node=f"n{r // 2}")
            for r, v in own.items()]


def test_a_rank_recorded_13x_slower_is_named_within_20_steps_and_no_other_rank_is() -> None:
    rule, named_at, data = replay("straggler_slow13.json")
    assert set(named_at) == {data["slow_rank"]}
    assert named_at[data["slow_rank"]] - data["slow_from"] <= 20, named_at
    s = rule.named[data["slow_rank"]]
    assert 1.25 <= s.ratio <= 1.35 and abs(s.since_step - data["slow_from"]) <= 3
    assert s.node == "localhost" and s.summary.startswith("rank 3 on localhost is 1.")


def test_the_healthy_part_of_a_recording_names_no_one() -> None:
    data = json.loads((DATA / "straggler_slow13.json").read_text())
    rule = StragglerRule()
    for rank, step, steps, own, step_s, at in data["rows"]:
        if step < data["slow_from"]:
            assert not rule.report([RankWork(rank=rank, step=step, steps=steps, own_s=own, step_s=step_s)], at)
    assert not rule.named


def test_one_slow_report_names_no_one_and_two_ranks_are_enough() -> None:
    rule = StragglerRule()
    for step in range(2, 12, 2):
        rule.report(works(step, {0: 0.2, 1: 0.2}), step)
    assert not rule.report(works(12, {0: 0.2, 1: 0.5}), 12)      # one noisy half-second
    assert not rule.report(works(14, {0: 0.2, 1: 0.2}), 14)
    assert not rule.report(works(16, {0: 0.2, 1: 0.3}), 16)
    assert not rule.report(works(18, {0: 0.2, 1: 0.3}), 18)      # 4 steps: not yet 6
    assert rule.report(works(20, {0: 0.2, 1: 0.3}), 20)          # compared with the other rank, not a mean
    (s,) = rule.findings()
    assert (s.rank, s.node, s.ratio, s.since_step, s.at) == (1, "n0", 1.5, 15, 20)


def test_hysteresis_a_named_rank_stays_named_in_the_band_and_is_cleared_below_it() -> None:
    rule = StragglerRule()
    own = {0: 0.2, 1: 0.2, 2: 0.2, 3: 0.2}
    for step in range(2, 14, 2):
        rule.report(works(step, own), step)
    for step in range(14, 22, 2):
        rule.report(works(step, {**own, 3: 0.26}), step)
    assert set(rule.named) == {3}
    for step in range(22, 40, 2):                                  # 1.1x: inside the band, still named
        assert not rule.report(works(step, {**own, 3: 0.22}), step)
    assert set(rule.named) == {3}
    assert not rule.report(works(40, own), 40)
    assert not rule.report(works(42, own), 42)
    assert rule.report(works(44, own), 44)                         # 6 steps below 1.07: cleared
    assert not rule.named
    for step in range(46, 80, 2):                                  # and an unnamed rank in the band is never named
        assert not rule.report(works(step, {**own, 3: 0.225}), step)


def test_warm_up_steps_and_a_restarted_worker_are_judged_afresh() -> None:
    rule = StragglerRule()
    for step in (2, 4, 6):                                         # rank 1's first steps: compiling, not judged
        rule.report(works(step, {0: 0.2, 1: 0.9}), step)
    assert not rule.named
    for step in range(8, 30, 2):
        rule.report(works(step, {0: 0.2, 1: 0.4}), step)
    assert set(rule.named) == {1}
    assert rule.report([RankWork(rank=1, step=3, steps=2, own_s=0.4, step_s=0.4)], 31)   # steps went back
    assert not rule.named


def test_a_whole_slow_node_is_named_rank_by_rank() -> None:
    rule = StragglerRule()
    for step in range(2, 30, 2):
        rule.report(works(step, {0: 0.2, 1: 0.2, 2: 0.3, 3: 0.3}), step)
    assert {(s.node, s.rank) for s in rule.findings()} == {("n1", 2), ("n1", 3)}


def test_the_stall_watch_broadcasts_each_change_of_the_named_set() -> None:
    sent: list[Any] = []
    watch = StallWatch(StallPolicy(0, 0), ["hfnode34", "hfnode35"], broadcast=sent.append, fail=lambda f: None)
    for step in range(2, 40, 2):
        slow = 0.3 if step >= 20 else 0.2
        watch.progress(0, step, [RankWork(rank=0, step=step, steps=2, own_s=0.2, step_s=0.3),
                                 RankWork(rank=1, step=step, steps=2, own_s=0.2, step_s=0.3)])
        watch.progress(1, step, [RankWork(rank=2, step=step, steps=2, own_s=0.2, step_s=0.3),
                                 RankWork(rank=3, step=step, steps=2, own_s=slow, step_s=0.3)])
    assert [type(m) for m in sent] == [Straggling]
    (s,) = sent[0].stragglers
    assert (s.node, s.rank, s.since_step) == ("hfnode35", 3, 19)   # named by the node that sent it
    line = json.loads(json.dumps(encode(sent[0])))
    assert line["t"] == "straggling" and decode(KINDS["straggling"], line) == sent[0]


def test_the_work_line_and_the_progress_message_round_trip() -> None:
    w = RankWork(rank=5, step=120, steps=4, own_s=0.31, step_s=0.42)
    line = work_line(w, 1700000000.5)
    assert len(line) == 80 and line.endswith(b"\n")
    assert parse_work(5, line) == (w, 1700000000.5)
    assert parse_work(5, b"") is None and parse_work(5, b"12 0 0.1 0.1 1") is None and parse_work(5, b"x y") is None
    assert encode(Progress(at=1.0, steps=True)) == {"t": "progress", "at": 1.0, "steps": True}   # as an older node's
    msg = Progress(at=1.0, steps=True, work=(w,))
    assert decode(Progress, json.loads(json.dumps(encode(msg)))) == msg
    bad = {**encode(msg), "work": [{"rank": 1}, encode(w)]}        # one rank's that does not decode is left out
    assert decode(Progress, bad).work == (w,)


def test_a_node_keeps_the_finding_in_its_record_and_tells_each_rank_named_once(tmp_path: Path) -> None:
    from higgsfield.node.runs import stragglers
    from higgsfield.node.runs.notify import Note
    from higgsfield.node.state.home import NodeState
    from higgsfield.node.state.records import RunDir, RunRecord

    rd = RunDir(NodeState(tmp_path), "demo", "r-1")
    rd.make()
    rd.write(RunRecord(project="demo", experiment="e", run="r-1", node="hfnode34", node_rank=0, nnodes=2, nproc=2))
    told: list[Note] = []
    lines: list[str] = []

    class Notifier:
        def event(self, note: Note) -> None:
            told.append(note)

    def note(event: Any, **fields: Any) -> Note:
        return Note(event, "r-1", "demo", "e", step=40, **fields)

    s = Straggler(node="hfnode35", rank=3, ratio=1.3, since_step=31, step=40, own_s=0.26, median_s=0.2, at=5.0)
    assert stragglers.noted("other", rd, Notifier(), note, lines.append) == "other"   # type: ignore[arg-type]
    for _ in range(2):
        assert stragglers.noted(Straggling((s,), 5.0), rd, Notifier(), note, lines.append) is None  # type: ignore[arg-type]
    assert rd.read().stragglers == [s]
    assert [(n.event, n.node, n.rank) for n in told] == [("straggler", "hfnode35", 3)]
    assert "since step 31" in told[0].detail and lines == [f"straggler: {s.summary}"]
    stragglers.noted(Straggling((), 9.0), rd, Notifier(), note, lines.append)  # type: ignore[arg-type]
    assert rd.read().stragglers == [] and lines[-1] == "stragglers: none now"


def test_on_straggler_is_warn_by_default_replace_is_taken_and_a_typo_refused(tmp_path: Path) -> None:
    from higgsfield.contract.errors import ConfigError
    from higgsfield.control.config.loader import parse_config

    cfg = parse_config("name: a\nnodes:\n  - host: h1\n", tmp_path / "higgsfield.yml")
    assert cfg.on_straggler == "warn"
    assert parse_config("name: a\nnodes:\n  - host: h1\non_straggler: replace\n", tmp_path / "h.yml").on_straggler \
        == "replace"
    with pytest.raises(ConfigError, match="on_straggler"):
        parse_config("name: a\nnodes:\n  - host: h1\non_straggler: replce\n", tmp_path / "h.yml")
