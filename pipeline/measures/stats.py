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
from scipy import stats as scipy_stats

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
    """geomean(numerator) / geomean(denominator) over one value per run, with Welch's 95% interval
    where both sides have at least MIN_RUNS runs."""

    estimate: float
    low: float = float("nan")
    high: float = float("nan")
    runs: tuple[int, int] = (0, 0)  # the numerator's runs, the denominator's

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


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) over one value per run, with Welch's 95% interval where both sides have at
    least MIN_RUNS runs."""

    estimate: float
    low: float = float("nan")
    high: float = float("nan")
    runs: tuple[int, int] = (0, 0)

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


def finite(values: Sequence[float]) -> np.ndarray:
    """The finite values of one side (a run without the figure gives NaN, and is left out)."""
    array = np.asarray(list(values), dtype=float)
    kept: np.ndarray = array[np.isfinite(array)]  # numpy types a mask's selection as Any
    return kept


def welch(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Welch's 95% interval for mean(a) - mean(b) along the last axis: (low, high). Many comparisons
    at once take one row each (the calibration simulates thousands through this same code). Where
    neither side varies (repeats that computed the same accuracy bit for bit), the difference is known
    exactly and the interval is that point."""
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    low = high = a.mean(axis=-1) - b.mean(axis=-1)
    varies = (np.ptp(a, axis=-1) > 0) | (np.ptp(b, axis=-1) > 0)
    if varies.any():
        with warnings.catch_warnings():
            # One side may not vary (repeats that timed or scored the same): its variance is 0, which
            # scipy's moment check reports as precision loss on stderr, under the user's table.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"scipy\.stats")
            test = scipy_stats.ttest_ind(a[varies], b[varies], axis=-1, equal_var=False)
            interval = test.confidence_interval(confidence_level=CONFIDENCE)
        low, high = low.copy(), high.copy()
        low[varies], high[varies] = interval.low, interval.high
    return low, high


def log_ratios(numerator: np.ndarray, denominator: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ratio of geometric means and its Welch interval on the logs, row by row: (estimate, low,
    high). Each row is one comparison with at least MIN_RUNS positive values a side."""
    logs_top, logs_bottom = np.log(np.atleast_2d(numerator)), np.log(np.atleast_2d(denominator))
    low, high = welch(logs_top, logs_bottom)
    return np.exp(logs_top.mean(axis=-1) - logs_bottom.mean(axis=-1)), np.exp(low), np.exp(high)


def ratio(numerator: Sequence[float], denominator: Sequence[float]) -> Ratio:
    """geomean(numerator) / geomean(denominator), one positive value per run on each side, and its 95%
    interval: Welch's t on the logs. Speedup of `other` over `reference`: ratio(reference, other)
    (> 1: other is faster). NaN estimate when a side has no value; no interval below MIN_RUNS."""
    top, bottom = finite(numerator), finite(denominator)
    top, bottom = top[top > 0], bottom[bottom > 0]
    runs = (len(top), len(bottom))
    if not len(top) or not len(bottom):
        return Ratio(float("nan"), runs=runs)
    if min(runs) < MIN_RUNS:
        return Ratio(math.exp(np.log(top).mean() - np.log(bottom).mean()), runs=runs)
    estimate, low, high = log_ratios(top, bottom)
    return Ratio(float(estimate[0]), float(low[0]), float(high[0]), runs)


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """mean(a) - mean(b), one value per run on each side, and Welch's 95% interval (none below MIN_RUNS)."""
    left, right = finite(a), finite(b)
    runs = (len(left), len(right))
    if not len(left) or not len(right):
        return Difference(float("nan"), runs=runs)
    estimate = float(left.mean() - right.mean())
    if min(runs) < MIN_RUNS:
        return Difference(estimate, runs=runs)
    low, high = welch(left, right)
    return Difference(estimate, float(low[0]), float(high[0]), runs)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile of one value per run (NaN where there is none)."""
    array = finite(values)
    if not len(array):
        return float("nan"), float("nan"), float("nan")
    q1, median, q3 = np.percentile(array, [25, 50, 75])
    return float(q1), float(median), float(q3)
