"""Which nodes a run gets (higgsfield.control.backends.pick) and ``run --exclude``'s checks: pure, no node."""

from __future__ import annotations

import pytest

from higgsfield.contract.errors import ConfigError
from higgsfield.control.backends.pick import NotEnoughNodes, exclude, pick_nodes
from higgsfield.control.backends.slurm.script import exclude_option

pytestmark = pytest.mark.timeout(10)

NODES = ["n1", "n2", "n3", "n4"]


def test_healthy_nodes_in_rank_order_and_bad_ones_passed_over_with_a_line() -> None:
    pick = pick_nodes(NODES, {"n2": "drifted: numpy 1.26.4 (others: 2.1.0)", "n4": "unreachable"}, count=2)
    assert pick.nodes == ["n1", "n3"]
    assert pick.lines() == ["passed over n2: drifted: numpy 1.26.4 (others: 2.1.0)"]   # n4 was never needed
    assert pick_nodes(NODES, {}, count=2).nodes == ["n1", "n2"]


def test_without_spare_nodes_every_candidate_stays_and_the_caller_decides() -> None:
    assert pick_nodes(NODES, {"n2": "unreachable"}).nodes == NODES
    assert pick_nodes(NODES, {"n2": "unreachable"}, count=4).passed_over == {}


def test_too_few_healthy_nodes_is_one_line_naming_why() -> None:
    with pytest.raises(NotEnoughNodes, match=r"--nodes 3: only 2 of 4 node\(s\) are healthy \(n1: slow; n2: x\)"):
        pick_nodes(NODES, {"n1": "slow", "n2": "x"}, count=3)


def test_exclude_leaves_nodes_out_and_refuses_an_unknown_name() -> None:
    assert exclude(NODES, ["n3", "n1"]) == ["n2", "n4"]
    with pytest.raises(ConfigError, match="--exclude n9: no such node"):
        exclude(NODES, ["n9"])
    with pytest.raises(ConfigError, match="leaves no node"):
        exclude(["n1"], ["n1"])


def test_slurm_exclude_is_one_sbatch_word_of_plain_names() -> None:
    assert exclude_option(("n1", "n3")) == "--exclude=n1,n3"
    with pytest.raises(ConfigError, match="not a Slurm node name"):
        exclude_option(("n1 --wrap=x",))
