"""Fixtures of the data push tests: hosts hfnode27..29 of the test bed (127.0.0.29-31), so a push never
disturbs the other multi-node tests (30 and up are the benches', which tests/provision and tests/test_testbed_delay.py
use too), and one project ``hfdata`` on them (``make_cluster`` of tests/runs:
Docker runtime, the invoker linked from the bed's shared venv), deployed once and shared by every test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runs"))  # runs_helpers (tests/ has no packages)

from runs_helpers import Cluster, bed_for, runs_conftest  # noqa: E402

INDICES = (27, 28, 29)


@pytest.fixture(scope="session")
def data_bed():  # type: ignore[no-untyped-def]
    return bed_for(INDICES)


@pytest.fixture(scope="session")
def data_cluster(data_bed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = runs_conftest().make_cluster(data_bed, tmp_path_factory.mktemp("data") / "hfdata", INDICES)
    yield c
