"""Welch's t on the logs of one value per run: it finds a real difference, not a made-up one, says
when there is too little to tell, and treats the run, not the epoch, as the unit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from pipeline.measures import stats


def _runs(seconds: float, runs: int, seed: int, spread: float = 0.03) -> list[float]:
    """One value per run (its median steady epoch), `spread` apart."""
    rng = np.random.default_rng(seed)
    return list(seconds * np.exp(spread * rng.standard_normal(runs)))


def test_a_clear_2x_difference_with_4_repeats_is_significant():
    ratio = stats.ratio(_runs(2.0, 4, seed=1), _runs(1.0, 4, seed=2))
    assert ratio.estimate == pytest.approx(2.0, rel=0.05)
    assert 1 < ratio.low < ratio.estimate < ratio.high < 2.3
    assert ratio.significant is True and ratio.runs == (4, 4)


def test_a_clear_2x_difference_at_two_runs_a_side_is_significant():
    """Two runs a side are enough when the difference dwarfs the spread between runs."""
    ratio = stats.ratio([2.0, 2.06], [1.0, 1.02])
    assert ratio.significant is True and 1.5 < ratio.low < 2 < ratio.high < 2.6


def test_an_a_a_pair_is_not_significant():
    """The same distribution drawn twice (another seed): the interval contains 1."""
    ratio = stats.ratio(_runs(1.0, 4, seed=3), _runs(1.0, 4, seed=4))
    assert ratio.low < 1 < ratio.high
    assert ratio.significant is False


def test_one_run_a_side_has_no_interval_and_says_why():
    ratio = stats.ratio([2.0], [1.0])
    assert ratio.estimate == 2.0 and not ratio.has_interval and ratio.significant is None
    assert math.isnan(ratio.low) and math.isnan(ratio.high) and math.isnan(ratio.half_width)
    assert ratio.why_no_interval == "n too small (1 run)"
    # One side alone with a spread is not enough either: the lone run's own spread is unknown.
    lone = stats.ratio([2.0], [1.0, 1.1, 0.9])
    assert not lone.has_interval and lone.why_no_interval == "n too small (1 run vs 3)"


def test_the_runs_spread_decides_not_their_epochs():
    """Two runs whose levels differ by 40%: however steady each run's epochs were, the interval
    spans the difference between the runs (pseudo-replication would have made it narrow)."""
    ratio = stats.ratio([1.0, 1.4], [1.2, 1.2])
    assert ratio.low < 1 < ratio.high and ratio.significant is False


def test_a_side_that_does_not_vary_warns_nothing_and_its_interval_is_the_other_sides():
    """Repeats of one setting that timed the same: no scipy warning reaches the user's terminal, and
    the interval is Welch's with that side's variance 0, i.e. the other side's t interval, shifted."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ratio = stats.ratio([1.0, 1.4], [1.2, 1.2])
    t = scipy.stats.t.ppf(0.975, 1)
    logs = np.log([1.0, 1.4])
    half = t * np.std(logs, ddof=1) / math.sqrt(2)
    assert math.log(ratio.low) == pytest.approx(logs.mean() - math.log(1.2) - half)
    assert ratio.low < 1 < ratio.high


def test_the_estimate_is_the_ratio_of_geometric_means_and_sits_in_its_interval():
    ratio = stats.ratio([1.0, 4.0], [1.0, 1.0, 1.0])
    assert ratio.estimate == pytest.approx(2.0)
    assert ratio.low < ratio.estimate < ratio.high
    assert ratio.half_width == pytest.approx((ratio.high - ratio.low) / 2 / 2.0)


def test_gaps_are_left_out():
    """A run without the figure (NaN) is not a run of that side; nor is a non-positive time."""
    ratio = stats.ratio([2.0, 2.1, float("nan"), 0.0], [1.0, 1.02, 0.98])
    assert ratio.runs == (2, 3) and ratio.has_interval
    assert math.isnan(stats.ratio([], [1.0]).estimate)


def test_the_same_numbers_give_the_same_interval():
    a, b = _runs(1.2, 3, seed=5, spread=0.1), _runs(1.0, 3, seed=6, spread=0.1)
    assert stats.ratio(a, b) == stats.ratio(a, b)


def test_an_accuracy_difference_has_welchs_interval():
    change = stats.difference([0.80, 0.82, 0.81], [0.85, 0.86, 0.84])
    assert change.estimate == pytest.approx(-0.04) and change.low < -0.04 < change.high < 0
    assert not stats.difference([0.8], [0.85, 0.86]).has_interval


def test_repeats_that_computed_the_same_accuracy_say_so_instead_of_a_zero_width_interval():
    """Runs of one seed on a deterministic device compute the same numbers: their difference says
    nothing of how accuracy varies between seeds, so there is no interval, and the reason says what
    gives one. A side that varies beside one that does not is no better: that side's repeats are
    still identical."""
    for a, b in (([0.80, 0.80], [0.81, 0.81]), ([0.81, 0.83, 0.82], [0.8123, 0.8123, 0.8123])):
        change = stats.difference(a, b)
        assert change.estimate == pytest.approx(np.mean(a) - np.mean(b))
        assert not change.has_interval and change.identical == len(b)
        assert change.why_no_interval == f"identical in all {len(b)} repeats: vary `seed` for an accuracy interval"


def test_p_values_are_welchs():
    """The p-values behind every judgement are scipy's Welch test on the logs, two-sided and one-sided,
    also against a bound other than no difference (the gate's PCT)."""
    a, b = [1.30, 1.22, 1.41, 1.35], [1.0, 1.05, 0.97]
    ratio = stats.ratio(a, b)
    logs_a, logs_b = np.log(a), np.log(b)
    assert ratio.p_value == pytest.approx(scipy.stats.ttest_ind(logs_a, logs_b, equal_var=False).pvalue)
    greater = scipy.stats.ttest_ind(logs_a - math.log(1.1), logs_b, equal_var=False, alternative="greater")
    assert ratio.p_above(1.1) == pytest.approx(greater.pvalue)
    assert ratio.p_below(1.1) == pytest.approx(1 - greater.pvalue)
    assert math.isnan(stats.ratio([2.0], [1.0]).p_value)


def test_a_higher_confidence_widens_the_interval_around_the_same_estimate():
    a, b = _runs(1.2, 4, seed=7, spread=0.1), _runs(1.0, 4, seed=8, spread=0.1)
    plain, strict = stats.ratio(a, b), stats.ratio(a, b, 0.99)
    assert strict.estimate == plain.estimate and strict.low < plain.low < plain.high < strict.high
    assert strict.confidence == 0.99 and plain.confidence == stats.CONFIDENCE


def test_the_geometric_mean_is_the_estimate_speedups_are_ratios_of():
    values = [1.0, 4.0, float("nan"), 0.0]
    assert stats.geometric_mean(values) == pytest.approx(2.0)
    assert stats.ratio([1.0, 4.0], [1.0, 1.0]).estimate == pytest.approx(stats.geometric_mean(values))
    assert math.isnan(stats.geometric_mean([]))


def test_quartiles_are_over_the_runs():
    assert stats.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert all(math.isnan(v) for v in stats.quartiles([float("nan")]))
