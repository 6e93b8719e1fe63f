"""The communication cost model of issue 31 (higgsfield.contract.comm_cost): each mode's bytes and seconds
against figures worked by hand from the ring formulas, a ring simulated link by link, the advice line."""

from __future__ import annotations

import pytest

from higgsfield.contract import comm_cost as cc

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("text", "count"), [("7b", 7e9), ("7B", 7e9), ("1.3b", 1.3e9), ("125m", 125e6),
                                             (" 70b ", 70e9), ("20M", 20e6), ("1t", 1e12), ("300k", 3e5)])
def test_model_size_reads_what_people_write(text: str, count: float) -> None:
    assert cc.model_size(text) == pytest.approx(count)


@pytest.mark.parametrize("text", ["", "7", "b", "7x", "7 bn", "-7b", "0b", "0.1k0", "1e9", "7bb", "seven"])
def test_model_size_refuses_the_rest(text: str) -> None:
    assert cc.model_size(text) is None


def test_size_text() -> None:
    assert [cc.size_text(x) for x in (7e9, 1.24e9, 125e6, 20e3, 12)] == ["7B", "1.24B", "125M", "20K", "12"]


def ring_link_bytes(n: int, total: float, kind: str) -> float:
    """Simulate a ring collective over ``n`` ranks chunk by chunk: the bytes rank 0's outgoing link carries."""
    chunk = total / n
    steps = {"all_gather": n - 1, "reduce_scatter": n - 1, "all_reduce": 2 * (n - 1)}[kind]
    sent = 0.0
    for _ in range(steps):       # every step each rank passes one chunk to its right neighbour
        sent += chunk
    return sent


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_the_ring_factor_is_what_a_ring_moves(n: int) -> None:
    assert ring_link_bytes(n, 1.0, "all_gather") == pytest.approx((n - 1) / n)
    assert ring_link_bytes(n, 1.0, "all_reduce") == pytest.approx(2 * (n - 1) / n)


def test_full_bf16_two_nodes_of_eight() -> None:
    # 1B params, bf16 mixed: 2 gathers x 2 B + 1 reduce-scatter x 4 B = 8 B a parameter, over a ring of 16 ranks
    setup = cc.Setup(params=1e9, nodes=2, ranks_per_node=8)
    e = cc.estimate("full", setup, cc.Link(cross_gbps=1.0))
    assert e.cross_bytes == pytest.approx(8e9 * 15 / 16)
    assert e.seconds == pytest.approx(7.5)
    sim = 2 * ring_link_bytes(16, 2e9, "all_gather") + ring_link_bytes(16, 4e9, "reduce_scatter")
    assert e.cross_bytes == pytest.approx(sim)


def test_full_is_bounded_by_the_slower_of_the_two_links() -> None:
    setup = cc.Setup(params=1e9, nodes=2, ranks_per_node=8)
    fast_net = cc.estimate("full", setup, cc.Link(cross_gbps=100.0, intra_gbps=10.0))
    assert fast_net.seconds == pytest.approx(8e9 * 15 / 16 / 10e9)


def test_hybrid_all_reduces_the_gradients_across_nodes_once() -> None:
    setup = cc.Setup(params=1e9, nodes=4, ranks_per_node=8)
    e = cc.estimate("hybrid", setup, cc.Link(cross_gbps=2.0))
    assert e.cross_bytes == pytest.approx(2 * 4e9 * 3 / 4)      # fp32 gradients, ring over 4 nodes
    assert e.seconds == pytest.approx(3.0)
    with_intra = cc.estimate("hybrid", setup, cc.Link(cross_gbps=2.0, intra_gbps=100.0))
    assert with_intra.seconds == pytest.approx(3.0 + 8e9 * 7 / 8 / 100e9)


def test_diloco_sends_the_pseudo_gradient_once_every_h_steps() -> None:
    setup = cc.Setup(params=1e9, nodes=2, ranks_per_node=8)
    link = cc.Link(cross_gbps=1.0)
    bf16 = cc.estimate("diloco", setup, link, h=50, pg_bytes=2)
    assert bf16.label == "DiLoCo(H=50)"
    assert bf16.cross_bytes == pytest.approx(2 * 2e9 * 0.5 / 50)
    int8 = cc.estimate("diloco", setup, link, h=50, pg_bytes=1)
    assert int8.cross_bytes == pytest.approx(bf16.cross_bytes / 2)
    h1 = cc.estimate("diloco", setup, link, h=1, pg_bytes=4)
    assert h1.cross_bytes == pytest.approx(cc.estimate("hybrid", setup, link).cross_bytes)   # H=1 fp32 is HSDP
    full = cc.estimate("full", setup, link)
    assert full.cross_bytes / int8.cross_bytes > 100       # issue 31's target at H=50, quantized


def test_zero2_and_precisions_change_the_bytes() -> None:
    link = cc.Link(cross_gbps=1.0)
    z3 = cc.estimate("full", cc.Setup(params=1e9, nodes=2), link)
    z2 = cc.estimate("full", cc.Setup(params=1e9, nodes=2, gathers=1), link)
    fp32 = cc.estimate("full", cc.Setup(params=1e9, nodes=2, param_bytes=4, grad_bytes=4), link)
    assert (z3.cross_bytes, z2.cross_bytes, fp32.cross_bytes) == pytest.approx((4e9, 3e9, 6e9))
    ddp = cc.estimate("replicate", cc.Setup(params=1e9, nodes=2), link)
    assert ddp.cross_bytes == pytest.approx(4e9)


def test_one_node_sends_nothing_out() -> None:
    setup = cc.Setup(params=1e9, nodes=1, ranks_per_node=8)
    for e in cc.estimate_all(setup, cc.Link(cross_gbps=1.0)):
        assert e.cross_bytes == 0.0


def test_bad_arguments_are_refused() -> None:
    setup = cc.Setup(params=1e9, nodes=2)
    with pytest.raises(ValueError, match="unknown mode"):
        cc.estimate("ring", setup, cc.Link(1.0))
    with pytest.raises(ValueError, match="at least 1"):
        cc.estimate("diloco", setup, cc.Link(1.0), h=0)
    with pytest.raises(ValueError, match="positive"):
        cc.Link(0.0)
    with pytest.raises(ValueError):
        cc.Setup(params=0, nodes=2)
    with pytest.raises(ValueError):
        cc.compute_seconds(1e9, 1e3, 0)


def test_compute_and_assumed_flops() -> None:
    assert cc.achieved_flops("NVIDIA H100 80GB HBM3") == pytest.approx(989e12 * 0.4)
    assert cc.achieved_flops("Some GPU") == cc.UNKNOWN_GPU_FLOPS
    assert cc.achieved_flops(None) == cc.CPU_FLOPS
    assert cc.compute_seconds(1e9, 1000, 6e12) == pytest.approx(1.0)
    assert cc.compute_seconds(1e9, 1000, 8e12, activation_checkpointing=True) == pytest.approx(1.0)


def test_advice_names_a_mode_under_half_and_says_nothing_when_fine() -> None:
    setup = cc.Setup(params=1e9, nodes=2, ranks_per_node=8)
    est = cc.estimate_all(setup, cc.Link(cross_gbps=1.0))        # full 7.5 s, hybrid 4 s, DiLoCo 0.04 s
    line = cc.advice("full", est, compute_s=5.0, how={"hybrid": "--param sharding=hybrid"}, basis="1B")
    assert line is not None and "\n" not in line
    assert line.startswith("full would spend ~60% of a step communicating (7.5 s against 5 s of compute; 1B)")
    assert line.endswith(": hybrid would spend ~44% (--param sharding=hybrid)"), line
    assert cc.advice("hybrid", est, compute_s=5.0) is None                  # 44%: fine
    only = cc.advice("full", est, compute_s=1.0)
    assert only is not None and "DiLoCo(H=50) would spend ~4%" in only     # hybrid is over half too
    worst = cc.advice("full", est, compute_s=0.001)
    assert worst is not None and "every mode would spend over half; the least is DiLoCo(H=50)" in worst
    assert cc.advice("diloco", est, compute_s=5.0) is None
