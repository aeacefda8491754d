"""`repeats: auto`'s sequential design (measures/sequential.py): the boundaries spend 5% over the
looks as the Lan-DeMets Pocock-type function says, checked against published values and against a
simulated Brownian motion; each round's confidence; the futility rule's when and why. The design's
error rates with Welch's test at the n users run are tests/test_calibration.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from pipeline.measures import sequential
from pipeline.measures.sequential import Design, boundaries


def test_one_look_is_the_plain_95_percent():
    assert boundaries(2) == pytest.approx((1.959964,), abs=1e-5)
    assert Design(2).confidence(2) == pytest.approx(0.95)


def test_two_equally_spaced_looks_match_the_published_pocock_type_boundaries():
    """Lan-DeMets with the Pocock-type function at information 1/2 and 1, two-sided 5%: 2.157 and
    2.201 (Jennison and Turnbull, Group Sequential Methods, table 7.6)."""
    assert boundaries(2, first=1) == pytest.approx((2.157, 2.201), abs=2e-3)


def test_the_looks_spend_five_percent_in_all_on_a_simulated_brownian_motion():
    """Under no difference the standardised statistics of the looks after rounds 2..8 are those of a
    Brownian motion at r / 8: the share of paths that cross any boundary is 5%, and by each look the
    spending function's share (200,000 paths; standard error about 0.05 points)."""
    rounds, paths = 8, 200_000
    rng = np.random.default_rng(3)
    fractions = np.arange(2, rounds + 1) / rounds
    steps = np.diff(np.concatenate(([0.0], fractions)))
    walk = np.cumsum(rng.normal(0.0, np.sqrt(steps), size=(paths, len(steps))), axis=1)
    crossed = np.abs(walk / np.sqrt(fractions)) >= np.array(boundaries(rounds))
    ever = np.logical_or.accumulate(crossed, axis=1)
    for look, fraction in enumerate(fractions):
        assert ever[:, look].mean() == pytest.approx(sequential.spent(fraction), abs=0.0015)
    assert ever[:, -1].mean() == pytest.approx(0.05, abs=0.0015)


@pytest.mark.parametrize("rounds", [3, 4, 8, 20, 100])
def test_every_look_is_stricter_than_95_percent_and_more_rounds_stricter_still(rounds):
    design = Design(rounds)
    levels = [design.confidence(r) for r in range(2, rounds + 1)]
    assert all(0.95 < level < 1 for level in levels)
    assert design.confidence(2) > Design(rounds - 1).confidence(2)  # more rounds planned: a stricter first look
    # Rounds past the plan (a rerun that found more DONE runs) are judged as its last look.
    assert design.confidence(rounds + 3) == design.confidence(rounds)


def test_a_speedup_with_no_difference_in_sight_is_settled_from_round_3():
    design = Design(8)
    p = np.array([0.9, 0.5, 0.05, 0.001, np.nan])
    assert not design.futile(p, 2).any()  # two runs a side: too few to give up on
    assert list(design.futile(p, 3)) == [True, True, False, False, False]
    assert not design.futile(p, 8).any()  # the last round: max_repeats decides
    # Conditional power under the trend so far, as the docstring defines it.
    z, t = special.ndtri(1 - 0.5 / 2), 3 / 8
    expected = special.ndtr((z / math.sqrt(t) - boundaries(8)[-1]) / math.sqrt(1 - t))
    assert design.conditional_power(0.5, 3) == pytest.approx(expected)
    assert expected < sequential.FUTILITY < design.conditional_power(0.05, 3)
