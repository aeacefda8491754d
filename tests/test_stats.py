"""The hierarchical bootstrap of a ratio of medians: it finds a real difference, not a made-up one,
says when there is too little to tell, and prints the same interval every time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline import stats


def _runs(seconds: float, runs: int, epochs: int, seed: int, spread: float = 0.03) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(seconds * (1 + spread * rng.standard_normal(epochs))) for _ in range(runs)]


def test_a_clear_2x_difference_with_4_repeats_is_significant():
    ratio = stats.median_ratio(_runs(2.0, 4, 3, seed=1), _runs(1.0, 4, 3, seed=2))
    assert ratio.estimate == pytest.approx(2.0, rel=0.05)
    assert 1 < ratio.low < ratio.estimate < ratio.high < 2.3
    assert ratio.significant is True


def test_an_a_a_pair_is_not_significant():
    """The same distribution drawn twice (another seed): the interval contains 1."""
    ratio = stats.median_ratio(_runs(1.0, 4, 3, seed=3), _runs(1.0, 4, 3, seed=4))
    assert ratio.low < 1 < ratio.high
    assert ratio.significant is False


def test_one_run_with_one_epoch_has_no_interval():
    ratio = stats.median_ratio([[2.0]], [[1.0]])
    assert ratio.estimate == 2.0 and not ratio.has_interval and ratio.significant is None
    assert math.isnan(ratio.low) and math.isnan(ratio.high)
    # One side alone with a spread is not enough either: the lone value's uncertainty is unknown.
    assert not stats.median_ratio([[2.0]], [[1.0, 1.1, 0.9]]).has_interval


def test_the_interval_is_deterministic_and_follows_the_seed():
    a, b = _runs(1.2, 3, 5, seed=5, spread=0.1), _runs(1.0, 3, 5, seed=6, spread=0.1)
    assert stats.median_ratio(a, b) == stats.median_ratio(a, b)
    assert stats.median_ratio(a, b, seed=1) != stats.median_ratio(a, b, seed=2)


def test_runs_are_resampled_not_only_epochs():
    """Two runs whose epochs agree closely but whose levels differ: resampling only the epochs (one
    flat pool) would give a narrow interval; resampling runs first keeps the between-run spread."""
    spread_runs = [[1.0, 1.0, 1.0, 1.0], [1.4, 1.4, 1.4, 1.4]]
    steady = [[1.2] * 4, [1.2] * 4]
    ratio = stats.median_ratio(spread_runs, steady)
    assert ratio.low <= 1.0 / 1.2 + 1e-9 and ratio.high >= 1.4 / 1.2 - 1e-9


def test_unequal_run_lengths_and_gaps():
    """Runs of different lengths pool as they are; NaN epochs and empty runs are left out."""
    ratio = stats.median_ratio([[2.0, 2.1], [1.9, 2.0, 2.05, float("nan")], []], [[1.0, 1.02, 0.98]])
    assert ratio.estimate == pytest.approx(2.0) and ratio.has_interval
    assert math.isnan(stats.median_ratio([], [[1.0]]).estimate)


def test_quartiles_pool_every_run():
    assert stats.quartiles([[1.0, 2.0], [3.0, 4.0, 5.0]]) == (2.0, 3.0, 4.0)
