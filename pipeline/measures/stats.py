"""How sure a comparison of two settings is: Welch's t on the logs of one value per run.

The run is the unit of replication. A setting's runs (its repeats) each give one value per figure:
the median of its steady-state epochs, its time to target, its final test accuracy. Epochs of one
run share its process, its data order and its machine's mood, so they describe that run's spread,
never the interval between two settings: an interval built from them (pseudo-replication) is far
too narrow.

A timing comparison is a ratio. Times are positive and their noise is multiplicative, so the method
works on their logarithms: the estimate is the ratio of the two sides' geometric means, and its 95%
interval is Welch's t interval for the difference of the mean logs (scipy.stats.ttest_ind with
equal_var=False), taken back through exp. An accuracy comparison is a difference, with Welch's
interval on the values themselves.

Chosen by simulation at the n users run (tests/test_calibration.py, benchmarks/calibration.py): on
A/A samples (both sides from one lognormal, CV 3-30%) it calls 2-6% significant at 2, 3, 4 and 8
runs a side, where the percentile bootstrap of a ratio of medians that it replaces called 31-36% at
2 runs (its interval at n = 2 is [min/max, max/min]). Below MIN_RUNS runs on either side there is
no interval: "n too small", never a guess dressed as a number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.base.names import MIN_RUNS

CONFIDENCE = 0.95
TOO_SMALL = "n too small"


def too_small(runs: tuple[int, int]) -> str:
    """Why a comparison has no interval: "n too small (1 run)", or "(1 run vs 3)" where the sides differ."""
    fewer, more = sorted(runs)
    counts = f"{fewer} run" + ("s" if fewer != 1 else "") + (f" vs {more}" if more != fewer else "")
    return f"{TOO_SMALL} ({counts})"


@dataclass(frozen=True)
class Ratio:
    """geomean(numerator) / geomean(denominator) over one value per run, with Welch's interval at
    `confidence` (95% unless a sequential design asks for more) where both sides have at least
    MIN_RUNS runs. `log_se` and `df` are the test behind the interval: the standard error of the
    difference of the mean logs and its Welch-Satterthwaite degrees of freedom."""

    estimate: float
    low: float = float("nan")
    high: float = float("nan")
    runs: tuple[int, int] = (0, 0)  # the numerator's runs, the denominator's
    confidence: float = CONFIDENCE
    log_se: float = float("nan")
    df: float = float("nan")

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def significant(self) -> bool | None:
        """Whether the interval excludes 1 (no difference); None where there is no interval."""
        if not self.has_interval:
            return None
        return bool(self.low > 1 or self.high < 1)

    @property
    def half_width(self) -> float:
        """Half the interval's width as a share of the estimate (0.05: within about 5%); NaN without one."""
        if not self.has_interval:
            return float("nan")
        return (self.high - self.low) / 2 / self.estimate

    @property
    def why_no_interval(self) -> str:
        return "" if self.has_interval else too_small(self.runs)

    @property
    def p_value(self) -> float:
        """Welch's two-sided p-value for no difference (NaN without an interval)."""
        if not self.has_interval:
            return float("nan")
        return float(2 * min(self.p_above(1.0), self.p_below(1.0)))

    def p_above(self, bound: float) -> float:
        """Welch's one-sided p-value for "the true ratio is above `bound`": small when the runs show it
        is (NaN without an interval)."""
        return float(one_sided(np.log(self.estimate) - math.log(bound), self.log_se, self.df))

    def p_below(self, bound: float) -> float:
        """Welch's one-sided p-value for "the true ratio is below `bound`"."""
        return float(one_sided(math.log(bound) - np.log(self.estimate), self.log_se, self.df))


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) over one value per run, with Welch's 95% interval where both sides have at
    least MIN_RUNS runs and each side's runs vary. Repeats that computed the same value bit for bit
    (one seed on a deterministic device) say nothing of how it varies between seeds: no interval,
    and `identical` counts those repeats."""

    estimate: float
    low: float = float("nan")
    high: float = float("nan")
    runs: tuple[int, int] = (0, 0)
    identical: int = 0  # the repeats of a side that all gave the same value (0: each side varies)

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def why_no_interval(self) -> str:
        if self.has_interval:
            return ""
        if self.identical:
            return identical(self.identical)
        return too_small(self.runs) if min(self.runs) else ""


def identical(repeats: int) -> str:
    """Why an accuracy comparison has no interval where repeats computed the same value."""
    return f"identical in all {repeats} repeats: vary `seed` for an accuracy interval"


def finite(values: Sequence[float]) -> np.ndarray:
    """The finite values of one side (a run without the figure gives NaN, and is left out)."""
    array = np.asarray(list(values), dtype=float)
    kept: np.ndarray = array[np.isfinite(array)]  # numpy types a mask's selection as Any
    return kept


@dataclass(frozen=True)
class Welch:
    """Welch's test of mean(a) - mean(b), row by row: the difference, its interval at the confidence
    asked for, its standard error and degrees of freedom."""

    difference: np.ndarray
    low: np.ndarray
    high: np.ndarray
    se: np.ndarray
    df: np.ndarray

    def p_above(self, shift: float | np.ndarray = 0.0) -> np.ndarray:
        """One-sided p-values for "the true difference is above `shift`", row by row."""
        return one_sided(self.difference - shift, self.se, self.df)

    @property
    def p_value(self) -> np.ndarray:
        """Two-sided p-values for no difference, row by row."""
        above, below = self.p_above(0.0), one_sided(-self.difference, self.se, self.df)
        two_sided: np.ndarray = np.minimum(1.0, 2 * np.minimum(above, below))
        return two_sided


def welch(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> Welch:
    """Welch's test of mean(a) - mean(b) along the last axis, with its interval at `confidence`
    (scipy.stats.ttest_ind, equal_var=False). Many comparisons at once take one row each (the
    calibration simulates thousands through this same code). Where neither side varies (repeats that
    timed or scored the same bit for bit), the difference is known exactly: the interval is that
    point, its standard error 0."""
    from scipy import stats as scipy_stats  # a third of a second: only where runs are compared

    a, b = np.atleast_2d(a), np.atleast_2d(b)
    difference = a.mean(axis=-1) - b.mean(axis=-1)
    low, high = difference.copy(), difference.copy()
    se, df = np.zeros_like(difference), np.full_like(difference, np.inf)
    varies = (np.ptp(a, axis=-1) > 0) | (np.ptp(b, axis=-1) > 0)
    if varies.any():
        with warnings.catch_warnings():
            # One side may not vary (repeats that timed or scored the same): its variance is 0, which
            # scipy's moment check reports as precision loss on stderr, under the user's table.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"scipy\.stats")
            test = scipy_stats.ttest_ind(a[varies], b[varies], axis=-1, equal_var=False)
            interval = test.confidence_interval(confidence_level=confidence)
        low[varies], high[varies], df[varies] = interval.low, interval.high, test.df
        # The interval is the difference plus or minus t * se: se from its width.
        quantile = scipy_stats.t.ppf(1 - (1 - confidence) / 2, test.df)
        se[varies] = (np.asarray(interval.high) - np.asarray(interval.low)) / (2 * quantile)
    return Welch(difference, low, high, se, df)


def one_sided(gap: float | np.ndarray, se: float | np.ndarray, df: float | np.ndarray) -> np.ndarray:
    """The one-sided p-value of an observed `gap` above a bound (positive: beyond it), given Welch's
    standard error and degrees of freedom; where se is 0 (a difference known exactly) 0 beyond the
    bound, else 1."""
    from scipy import stats as scipy_stats

    gap, se, df = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (gap, se, df)))
    p = np.where(gap > 0, 0.0, 1.0)
    spread = se > 0
    p = np.where(spread, scipy_stats.t.sf(np.divide(gap, se, out=np.zeros_like(gap), where=spread), df), p)
    return np.where(np.isnan(se) | np.isnan(gap), np.nan, p)


def log_ratios(numerator: np.ndarray, denominator: np.ndarray, confidence: float = CONFIDENCE) -> Welch:
    """Welch's test on the logs, row by row: `difference` is the log of the ratio of geometric means,
    the interval (exp of `low` and `high`) the ratio's at `confidence`. Each row is one comparison
    with at least MIN_RUNS positive values a side."""
    return welch(np.log(np.atleast_2d(numerator)), np.log(np.atleast_2d(denominator)), confidence)


def ratio(numerator: Sequence[float], denominator: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """geomean(numerator) / geomean(denominator), one positive value per run on each side, and its
    interval at `confidence`: Welch's t on the logs. Speedup of `other` over `reference`:
    ratio(reference, other) (> 1: other is faster). NaN estimate when a side has no value; no interval
    below MIN_RUNS."""
    top, bottom = finite(numerator), finite(denominator)
    top, bottom = top[top > 0], bottom[bottom > 0]
    runs = (len(top), len(bottom))
    if not len(top) or not len(bottom):
        return Ratio(float("nan"), runs=runs, confidence=confidence)
    if min(runs) < MIN_RUNS:
        return Ratio(math.exp(np.log(top).mean() - np.log(bottom).mean()), runs=runs, confidence=confidence)
    test = log_ratios(top, bottom, confidence)
    return Ratio(
        math.exp(float(test.difference[0])),
        math.exp(float(test.low[0])),
        math.exp(float(test.high[0])),
        runs,
        confidence,
        float(test.se[0]),
        float(test.df[0]),
    )


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """mean(a) - mean(b), one value per run on each side, and Welch's 95% interval: none below
    MIN_RUNS, and none where a side's repeats all gave the same value (Difference.identical)."""
    left, right = finite(a), finite(b)
    runs = (len(left), len(right))
    if not len(left) or not len(right):
        return Difference(float("nan"), runs=runs)
    estimate = float(left.mean() - right.mean())
    if min(runs) < MIN_RUNS:
        return Difference(estimate, runs=runs)
    same = [len(side) for side in (left, right) if np.ptp(side) == 0]
    if same:
        return Difference(estimate, runs=runs, identical=max(same))
    test = welch(left, right)
    return Difference(estimate, float(test.low[0]), float(test.high[0]), runs)


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of one positive value per run (NaN where there is none): the estimate every
    speedup is a ratio of, so a setting's figure and its speedups agree."""
    array = finite(values)
    array = array[array > 0]
    return float(np.exp(np.log(array).mean())) if len(array) else float("nan")


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile of one value per run (NaN where there is none)."""
    array = finite(values)
    if not len(array):
        return float("nan"), float("nan"), float("nan")
    q1, median, q3 = np.percentile(array, [25, 50, 75])
    return float(q1), float(median), float(q3)
