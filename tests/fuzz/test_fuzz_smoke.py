"""The fuzz driver runs: every target, a few examples each, no finding (the real run is minutes long)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz_inputs  # noqa: E402


@pytest.mark.timeout(300)
def test_every_fuzz_target_runs_a_round_without_findings() -> None:
    fuzz_inputs.COUNTS.clear()
    total, findings = fuzz_inputs.run(seconds=float("inf"), batch=8, out=None, targets=list(fuzz_inputs.TARGETS),
                                      first_seed=1, rounds=1, quiet=True)
    assert findings == []
    assert set(fuzz_inputs.COUNTS) == set(fuzz_inputs.TARGETS) and total >= 5 * 8
