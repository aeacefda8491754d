"""`repeats: auto`'s sequential design: the confidence each round judges at, and when a speedup is
settled, so that judging after every round keeps a false "significant" at 5% over the whole sequence.

Judging the same 95% interval after every round and stopping once it excludes 1 is optional
stopping: with no difference at all, 13% of sweeps end "significant" at max_repeats 8 and 21% at
20 (benchmarks/calibration.py measures it). Group-sequential trials, which look at their data
several times too, solve it by spending their 5% over the looks. So does this design:

- **The looks.** After rounds r = 2, 3, ..., K (K = max_repeats), each at the information fraction
  r / K (an interval's variance shrinks as 1 / runs).
- **Significant.** Lan-DeMets alpha spending with the Pocock-type function 5% * ln(1 + (e - 1) t):
  by look j, at most that share of the 5% is spent. Each look's boundary c_j comes from the joint
  distribution of the looks (a Brownian motion, integrated numerically look by look), and its
  confidence is 1 - 2 (1 - Phi(c_j)): 95% when K is 2, about 98.5% at each of the 7 looks of K = 8.
  A speedup is significant at a round when Welch's interval at that round's confidence excludes 1.
  Together these repeated confidence intervals hold with 95%, whichever round the sweep stops at
  (Jennison and Turnbull), so the verdict the sweep ends with is a 95% claim, as a fixed count's is.
- **No difference found (futility).** From round 3, a speedup is settled without a difference once
  the chance that it would become significant by round K, were the trend so far to hold (conditional
  power), is below 10%. Two runs a side give Welch's test about 2 degrees of freedom: too few to
  give up on. Stopping for futility can only lower the false-positive rate.

Chosen by simulation at the n users run, against O'Brien-Fleming-type and power-family spending
and other futility thresholds (benchmarks/calibration.py; tests/test_calibration.py keeps the
chosen design's A/A rate, power and rounds spent, and docs/benchmarks.md shows them).

Numbers only: no torch, no MLflow, nothing rendered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, special

from pipeline.base.names import MIN_RUNS

ALPHA = 0.05  # two-sided, over the whole sequence of looks
FUTILITY = 0.10  # settled without a difference below this conditional power
FIRST_FUTILITY_ROUND = 3  # two runs a side are too few to give up on
GRID_POINTS = 121  # the numerical integration's points per look: boundaries to about 1e-4
LARGEST = 40.0  # a boundary no statistic reaches: a look that spends nothing


def spent(fraction: float) -> float:
    """The share of ALPHA spent by the information fraction `fraction` (Lan-DeMets, Pocock type)."""
    return ALPHA * math.log(1 + (math.e - 1) * min(fraction, 1.0))


@lru_cache(maxsize=64)
def boundaries(rounds: int, first: int = MIN_RUNS) -> tuple[float, ...]:
    """The two-sided z boundaries of the looks after rounds first, first + 1, ..., `rounds`: under no
    difference, the chance of crossing at look j (and at none before) is spent(j) - spent(j - 1).

    The standardised statistic at fraction t is B(t) / sqrt(t) for a standard Brownian motion B. The
    sub-density of B at each look, on the region where no look has crossed, is carried from look to
    look by a Gaussian kernel on a grid (the recursive integration of Armitage, McPherson and Rowe);
    each boundary is the root of its crossing probability."""
    found: list[float] = []
    region: _Region | None = None  # B at the previous look, where no look has crossed
    previous_t = previous_spent = 0.0
    for t in (r / rounds for r in range(first, rounds + 1)):
        wanted = spent(t) - previous_spent
        if wanted <= _crossing(LARGEST, t, previous_t, region):
            c = LARGEST
        else:
            c = optimize.brentq(_excess, 0.0, LARGEST, args=(t, previous_t, region, wanted), xtol=1e-9)
        found.append(c)
        previous_spent += _crossing(c, t, previous_t, region)
        region = _carried(c, t, previous_t, region)
        previous_t = t
    return tuple(found)


@dataclass(frozen=True)
class _Region:
    """B(t) on the region no look has crossed: grid points and the probability mass at each."""

    points: np.ndarray
    mass: np.ndarray


def _crossing(c: float, t: float, previous_t: float, region: _Region | None) -> float:
    """The chance that the look at `t` crosses boundary `c`, having crossed none before."""
    if region is None:
        return float(2 * special.ndtr(-c))
    edge, sd = c * math.sqrt(t), math.sqrt(t - previous_t)
    beyond = special.ndtr((-edge - region.points) / sd) + special.ndtr((region.points - edge) / sd)
    return float(np.sum(region.mass * beyond))


def _excess(c: float, t: float, previous_t: float, region: _Region | None, wanted: float) -> float:
    return _crossing(c, t, previous_t, region) - wanted


def _carried(c: float, t: float, previous_t: float, region: _Region | None) -> _Region:
    """B(t) on the look's region (-c sqrt(t), c sqrt(t)), by the trapezoid rule on GRID_POINTS."""
    edge = min(c, 8.0) * math.sqrt(t)  # beyond 8 sd the density is nothing
    points = np.linspace(-edge, edge, GRID_POINTS)
    width = np.full(GRID_POINTS, points[1] - points[0])
    width[[0, -1]] /= 2
    if region is None:
        density = np.exp(-(points**2) / (2 * t)) / math.sqrt(2 * math.pi * t)
    else:
        sd = math.sqrt(t - previous_t)
        kernel = np.exp(-(((points[:, None] - region.points[None, :]) / sd) ** 2) / 2) / (sd * math.sqrt(2 * math.pi))
        density = kernel @ region.mass
    return _Region(points, density * width)


@dataclass(frozen=True)
class Design:
    """The looks of a `repeats: auto` sweep of at most `rounds` rounds (max_repeats), the first after
    round `first`."""

    rounds: int
    first: int = MIN_RUNS

    def look(self, round_: int) -> int:
        """The look a round is (0 for the first), rounds past the plan counted as its last."""
        return min(max(round_, self.first), self.rounds) - self.first

    def boundary(self, round_: int) -> float:
        return boundaries(self.rounds, self.first)[self.look(round_)]

    def confidence(self, round_: int) -> float:
        """The confidence of the intervals judged after `round_`: 0.95 when the design has one look."""
        return float(1 - 2 * special.ndtr(-self.boundary(round_)))

    def conditional_power(self, p_value: float | np.ndarray, round_: int) -> np.ndarray:
        """The chance that a speedup with Welch's two-sided `p_value` after `round_` crosses the last
        look's boundary, were the trend so far to hold; row by row (NaN where there is no p-value, or
        after the last round)."""
        p = np.asarray(p_value, dtype=float)
        t = min(round_, self.rounds) / self.rounds
        if t >= 1:
            return np.full(p.shape, np.nan)
        z = special.ndtri(1 - p / 2)  # |z| of the look
        final = boundaries(self.rounds, self.first)[-1]
        power = np.asarray(special.ndtr((z / math.sqrt(t) - final) / math.sqrt(1 - t)), dtype=float)
        return power

    def futile(self, p_value: float | np.ndarray, round_: int) -> np.ndarray:
        """Whether a speedup is settled without a difference after `round_`: from
        FIRST_FUTILITY_ROUND and before the last round, its conditional power below FUTILITY. Row by
        row; NaN (no interval) is never futile. The caller asks only of speedups not significant."""
        power = self.conditional_power(p_value, round_)
        if round_ < FIRST_FUTILITY_ROUND:
            return np.zeros(power.shape, dtype=bool)
        futile: np.ndarray = np.nan_to_num(power, nan=1.0) < FUTILITY
        return futile
