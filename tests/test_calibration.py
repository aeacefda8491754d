"""The statistics are calibrated at the n users run: A/A and A/B simulated through the very code the
comparison and the gate use (benchmarks/calibration.py), with a fixed seed and 4,000 trials a cell.
This fails when "significant" fires on more than 6% of A/A pairs, when the gate fails more than 5% of
A/A pairs, or when a real 1.25x speedup at 5 runs a side and CV 10% is found less than 80% of the
time; and when the table on the benchmarks page is not the one this run measures."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.measures import stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import calibration  # noqa: E402


@pytest.fixture(scope="module")
def found():
    return calibration.rates()


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("cv", calibration.CVS)
def test_a_a_pairs_are_called_significant_at_most_6_percent_of_the_time(found, n, cv):
    assert found["aa"][(n, cv)] <= 0.06


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("cv", calibration.CVS)
def test_the_gate_fails_at_most_5_percent_of_a_a_pairs(found, n, cv):
    assert found["gate"][(n, cv)] <= 0.05


def test_a_real_speedup_is_found(found):
    """A true 1.25x at CV 10% with 5 runs a side: found in at least 80% of trials; more runs, more power."""
    assert found["power"][(5, 0.10)] >= 0.80
    powers = [found["power"][(n, 0.10)] for n in calibration.RUNS]
    assert powers == sorted(powers)


def test_the_simulation_runs_the_comparisons_own_function():
    """stats.ratio, what the comparison calls for each pair of settings, gives exactly the simulated
    row's figures: the calibration measures the code users run, not a copy of it."""
    rng = np.random.default_rng(1)
    reference, other = rng.lognormal(0, 0.1, (50, 3)), rng.lognormal(0, 0.1, (50, 3))
    estimate, low, high = stats.log_ratios(reference, other)
    for i in range(50):
        ratio = stats.ratio(reference[i], other[i])
        assert (ratio.estimate, ratio.low, ratio.high) == pytest.approx((estimate[i], low[i], high[i]), rel=1e-12)


def test_the_benchmarks_page_shows_this_table(found):
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert calibration.table(found) in page, calibration.table(found)
