"""The fabric test's pure parts, without the bed: the size ladder, the pair schedule, busbw, the outlier rule,
the result's JSON shape, the table printed from it, and the preflight's choice of nodes.

The slowed-node end-to-end case (a node behind a throttled veth in its own network namespace)
is not built yet: the outlier rule that would name it is tested here on figures shaped like
that case (one node's every link slow).
"""

from __future__ import annotations

import io
import itertools
import json
from dataclasses import replace

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.fabric import (
    FabricResult,
    GpuRow,
    NodeRow,
    PairRow,
    SizeRow,
    busbw,
    outliers,
    pairs_of,
    rounds,
    sizes,
)
from higgsfield.control.backends.pick import pick_nodes
from higgsfield.control.doctor.preflight import bad_nodes

pytestmark = pytest.mark.timeout(30)


def test_sizes_go_from_8_bytes_by_powers_of_4_to_64_mib() -> None:
    s = sizes()
    assert s[0] == 8 and s[-1] == 64 << 20 and len(s) == 13
    assert all(b == a * 4 for a, b in itertools.pairwise(s[:-1]))
    assert sizes(8, 100) == [8, 32, 100]
    with pytest.raises(ValueError):
        sizes(8, 4)


def test_busbw_is_nccl_tests_factor() -> None:
    assert busbw(10.0, 2) == 10.0
    assert busbw(10.0, 8) == pytest.approx(17.5)
    assert busbw(10.0, 1) == 0.0


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 17, 40])
def test_rounds_measure_every_pair_once_with_no_node_twice_in_a_round(n: int) -> None:
    got = [p for r in rounds(n) for p in r]
    assert sorted(got) == pairs_of(n) and len(set(got)) == len(got)
    for r in rounds(n):
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    if n <= 16:
        assert len(got) == n * (n - 1) // 2
    else:  # the two neighbour rings: every node in 4 pairs
        assert all(sum(x in p for p in got) == 4 for x in range(n))


def _pairs(figures: dict[tuple[str, str], float]) -> list[PairRow]:
    return [PairRow(a, b, 4 << 20, 1.0, v) for (a, b), v in figures.items()]


def test_the_node_whose_every_link_is_slow_is_named_against_the_median() -> None:
    # a throttled node c: its two links are slow, the healthy pair a-b is fast
    found = outliers(_pairs({("a", "b"): 1.2, ("a", "c"): 0.05, ("b", "c"): 0.06}))
    assert [o.node for o in found] == ["c"]
    assert found[0].busbw_gbps == 0.06 and found[0].median_gbps == 1.2
    assert "c is slow: its best link 0.06 GB/s busbw against the median node's 1.2 GB/s (5%)" == found[0].line()


def test_an_even_fabric_and_two_nodes_name_nobody() -> None:
    assert outliers(_pairs({("a", "b"): 1.0, ("a", "c"): 0.9, ("b", "c"): 0.8})) == []
    assert outliers(_pairs({("a", "b"): 0.001})) == []   # one link: nothing to compare it with
    many = {(f"n{i}", f"n{j}"): 1.0 for i in range(5) for j in range(i + 1, 5)}
    many.update({("n0", "n3"): 0.1, ("n1", "n3"): 0.1, ("n2", "n3"): 0.1, ("n3", "n4"): 0.1})
    assert [o.node for o in outliers(_pairs(many))] == ["n3"]


def _result(gpu_health: str = "ok") -> FabricResult:
    return FabricResult(
        backend="gloo", nodes=["a", "b", "c"], world_size=3,
        allreduce=[SizeRow(8, 2, 500.0, 1.6e-5, busbw(1.6e-5, 3)), SizeRow(64 << 20, 16 << 20, 1e5, 0.671, 0.894)],
        pairs=_pairs({("a", "b"): 1.2, ("a", "c"): 0.05, ("b", "c"): 0.06}),
        per_node=[NodeRow("a", 1, None, 1.2, 400.0, "/ck", None), NodeRow("b", 1, None, 1.2, 380.0, "/ck", None),
                  NodeRow("c", 8, 150.5, 0.06, 300.0, "/ck",
                          [GpuRow(0, "H100", 70000.0, 81559.0, gpu_health)])],
        seconds=3.5, run="fabric-x")


def test_the_json_shape_round_trips_and_a_bad_one_is_one_error() -> None:
    r = _result()
    d = json.loads(json.dumps(encode(r)))
    assert d["latency_us"] == 500.0 and d["peak_busbw_gbps"] == 0.894 and d["version"] == 1
    back = decode(FabricResult, d)
    assert back.allreduce == r.allreduce and back.pairs == r.pairs and back.per_node == r.per_node
    with pytest.raises(DecodeError, match="version"):
        decode(FabricResult, {**d, "version": 99})
    with pytest.raises(DecodeError, match=r"'allreduce\[0\]\.bytes' must be an integer"):
        decode(FabricResult, {**d, "allreduce": [{"bytes": "x"}]})


def test_the_table_shows_the_json_figures() -> None:
    from rich.console import Console

    from higgsfield.control.cli._fabric_table import render, size_text

    r = replace(_result(), outliers=outliers(_result().pairs))
    buf = io.StringIO()
    render(Console(file=buf, width=200, color_system=None), r)
    text = buf.getvalue()
    d = encode(r)
    for row in d["allreduce"]:
        assert size_text(row["bytes"]) in text and f"{row['time_us']:.1f}" in text
        assert f"{row['algbw_gbps']:.3f}" in text and f"{row['busbw_gbps']:.3f}" in text
    assert "64 MiB" in text and "8 B" in text and "latency 500.0 us" in text
    assert "n/a" in text and "68.4/80 GiB" in text and "150.500" in text
    assert "c is slow" in text


def test_preflight_passes_over_the_slow_node_when_there_is_a_spare() -> None:
    r = replace(_result(), outliers=outliers(_result().pairs))
    bad = bad_nodes(r)
    assert list(bad) == ["c"] and bad["c"].startswith("slow in the fabric preflight: c is slow")
    pick = pick_nodes(["c", "a", "b"], bad, 2)
    assert pick.nodes == ["a", "b"] and pick.lines() == [f"passed over c: {bad['c']}"]
    assert pick_nodes(["a", "b", "c"], bad, 3).nodes == ["a", "b", "c"]   # no spare: kept (a line says so)
    sick = bad_nodes(_result(gpu_health="3 uncorrected ECC errors"))
    assert sick["c"] == "unhealthy in the fabric preflight: gpu0: 3 uncorrected ECC errors"
