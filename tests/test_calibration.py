"""The statistics are calibrated at the n users run: A/A and A/B simulated through the very code the
comparison, `repeats: auto` and the gate use (benchmarks/calibration.py), with a fixed seed and 4,000
trials a cell (a rate's standard error at 5% is 0.34 points). This fails when "significant" fires on
more than 6% of A/A pairs at a fixed n; when a `repeats: auto` sweep of an A/A pair ends significant
more than 5.5% of the time over its whole sequence of rounds, loses its power, or always runs to
max_repeats; when the gate fails more than 5% of A/A builds of 4 or 18 points; and when the tables on
the benchmarks page are not the ones this run measures. The rules they replaced fail the same bounds
(tests below run them too), so each bound tells the two apart."""

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


@pytest.fixture(scope="module")
def rounds():
    return calibration.sequential()


@pytest.fixture(scope="module")
def builds():
    return calibration.gate_rates()


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
    test = stats.log_ratios(reference, other, 0.987)
    for i in range(50):
        ratio = stats.ratio(reference[i], other[i], 0.987)
        assert (ratio.estimate, ratio.low, ratio.high) == pytest.approx(
            np.exp((test.difference[i], test.low[i], test.high[i])), rel=1e-12
        )
        assert ratio.p_value == pytest.approx(test.p_value[i], rel=1e-9)


# --- repeats: auto ---------------------------------------------------------------------------------


@pytest.mark.parametrize("most", calibration.MAX_REPEATS)
def test_repeats_auto_ends_significant_on_an_a_a_pair_at_most_5_percent_of_the_time(rounds, most):
    """Over the whole sequence of rounds, whichever round it stops at: 5% plus two standard errors."""
    assert rounds[(calibration.DESIGN, most)]["aa"] <= 0.055


@pytest.mark.parametrize("most", calibration.MAX_REPEATS)
def test_judging_a_plain_95_percent_after_every_round_fails_that_bound(rounds, most):
    """The rule repeats: auto had before (optional stopping): the bound above tells it from the design."""
    assert rounds[(calibration.NAIVE, most)]["aa"] > 0.055


def test_repeats_auto_keeps_its_power_and_stops_a_clear_speedup_early(rounds):
    """A true 1.25x at CV 10%: found in at least 85% of sweeps at the default max_repeats 8 and 95% at
    20, in fewer rounds on average than a fixed count of max_repeats; a 2x at CV 3% stops by round 3."""
    default, long = rounds[(calibration.DESIGN, 8)], rounds[(calibration.DESIGN, 20)]
    assert default["power"] >= 0.85 and long["power"] >= 0.95
    assert default["power_rounds"] < 6 and long["power_rounds"] < 8
    assert all(rounds[(calibration.DESIGN, most)]["clear_rounds"] <= 3 for most in calibration.MAX_REPEATS)


@pytest.mark.parametrize("most", [8, 20])
def test_a_sweep_with_equal_pairs_does_not_run_to_max_repeats(rounds, most):
    """A speedup that is no faster is settled as "no difference found" (the futility rule): an A/A
    pair reaches max_repeats in at most 10% of sweeps, a grid of four of them in at most 25%, where the
    rule before ran to max_repeats in 78-100% of them."""
    design, naive = rounds[(calibration.DESIGN, most)], rounds[(calibration.NAIVE, most)]
    assert design["aa_max"] <= 0.10 and design["pairs_max"] <= 0.25
    assert naive["aa_max"] > 0.5 and naive["pairs_max"] > 0.9


# --- the gate over a build ----------------------------------------------------------------------------


@pytest.mark.parametrize("points", calibration.POINTS)
def test_the_gate_fails_at_most_5_percent_of_builds_with_no_change(builds, points):
    """At --fail-if-slower 0 and 10; and a true 5% slowdown at every point fails a 10% gate at most 5%
    of the time (the interval, not the point estimate, must be beyond 10%)."""
    corrected = builds[(calibration.CORRECTED, points)]
    assert corrected["aa_0"] <= 0.05 and corrected["aa_10"] <= 0.05 and corrected["slower_5"] <= 0.05


@pytest.mark.parametrize("points", calibration.POINTS)
def test_judging_each_point_alone_fails_those_bounds(builds, points):
    """The gate before Holm, each point on its own interval and its point estimate against PCT."""
    uncorrected = builds[(calibration.UNCORRECTED, points)]
    assert uncorrected["aa_0"] > 0.05 and uncorrected["slower_5"] > 0.05


def test_the_gate_still_finds_a_real_regression(builds):
    """One point 25% slower among 4, at 8 runs a side: failed in at least 80% of builds."""
    assert builds[(calibration.CORRECTED, 4)]["power_more"] >= 0.80


def test_the_benchmarks_page_shows_these_tables(found, rounds, builds):
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for measured in (calibration.table(found), calibration.sequential_table(rounds), calibration.gate_table(builds)):
        assert measured in page, measured


def test_the_grids_and_comparing_pages_state_these_rates():
    """The prose that states the rules' error rates, power and rounds is made of the same figures."""
    for page, said in (
        ("grids.md", calibration.sequential_words(calibration.sequential())),
        ("comparing.md", calibration.gate_words(calibration.gate_rates())),
    ):
        text = " ".join((REPO / "docs" / page).read_text(encoding="utf-8").split())
        for words in said:
            assert words in text, (page, words)
