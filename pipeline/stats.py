"""How sure a timing comparison is: a hierarchical bootstrap of the ratio of two pooled medians.

A setting's timing is a few runs (its repeats), each with a few steady-state epochs. Epochs of one
run share its process, its data order and its machine's mood, so they are not independent draws:
resampling them as one flat pool would make intervals too narrow. The bootstrap here resamples at
both levels, as the data was made: runs with replacement, then epochs with replacement within each
resampled run. The statistic is median(numerator) / median(denominator) over the pooled epochs of
each resample; the interval is the 2.5th to 97.5th percentile of those ratios.

Deterministic: one numpy Generator with a fixed seed per call, so the same numbers always print the
same interval (a report that changes when re-run would be read as a change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

RESAMPLES = 4000
SEED = 20_240_601
CONFIDENCE = 0.95
CHUNK_VALUES = 2_000_000  # values drawn at once (16 MB of float64)
TOO_SMALL = "n too small"  # why a ratio has no interval: a side with a single value has no spread to resample

Runs = Sequence[Sequence[float]]  # one sequence of values (steady epoch times, or one time to target) per run


@dataclass(frozen=True)
class Ratio:
    """median(numerator) / median(denominator), with its bootstrap interval where one can be told."""

    estimate: float
    low: float = float("nan")
    high: float = float("nan")

    @property
    def has_interval(self) -> bool:
        return not (np.isnan(self.low) or np.isnan(self.high))

    @property
    def significant(self) -> bool | None:
        """Whether the interval excludes 1 (no difference); None where there is no interval."""
        if not self.has_interval:
            return None
        return bool(self.low > 1 or self.high < 1)


def _usable(runs: Runs) -> list[np.ndarray]:
    """Each run's finite values; runs left with none are dropped."""
    arrays = [np.asarray(values, dtype=float) for values in runs]
    arrays = [a[np.isfinite(a)] for a in arrays]
    return [a for a in arrays if a.size]


def pooled_median(runs: Runs) -> float:
    values = _usable(runs)
    return float(np.median(np.concatenate(values))) if values else float("nan")


def _resampled_medians(runs: list[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The pooled median of each of `resamples` hierarchical resamples of `runs`, as one array.

    Runs are padded into an (n, longest) matrix; each resample draws n run indices, then, for each
    drawn run, as many epoch positions as that run has (the padding past its length stays NaN and
    nanmedian skips it)."""
    lengths = np.array([len(r) for r in runs])
    longest = int(lengths.max())
    padded = np.full((len(runs), longest), np.nan)
    for i, values in enumerate(runs):
        padded[i, : len(values)] = values
    # In chunks of resamples, so that a long sweep (many runs of many epochs) stays a few MB at a time.
    chunk = max(1, CHUNK_VALUES // padded.size)
    medians = []
    for start in range(0, resamples, chunk):
        count = min(chunk, resamples - start)
        chosen = rng.integers(0, len(runs), size=(count, len(runs)))  # runs, with replacement
        chosen_lengths = lengths[chosen]  # (count, n)
        positions = np.floor(rng.random((count, len(runs), longest)) * chosen_lengths[..., None]).astype(int)
        values = padded[chosen[..., None], positions]
        values[np.arange(longest) >= chosen_lengths[..., None]] = np.nan  # a short run adds its own count
        medians.append(np.nanmedian(values.reshape(count, -1), axis=1))
    return np.concatenate(medians)


def median_ratio(numerator: Runs, denominator: Runs, resamples: int = RESAMPLES, seed: int = SEED) -> Ratio:
    """median(numerator) / median(denominator) and its 95% hierarchical bootstrap interval.

    Speedup of `other` over `reference`: median_ratio(reference, other) (> 1: other is faster).
    No interval (NaN bounds) when either side holds a single value: one run with one steady epoch
    has no spread, and an interval from the other side alone would look surer than it is."""
    top, bottom = _usable(numerator), _usable(denominator)
    if not top or not bottom:
        return Ratio(float("nan"))
    estimate = pooled_median(top) / pooled_median(bottom)
    if sum(map(len, top)) < 2 or sum(map(len, bottom)) < 2:
        return Ratio(estimate)
    rng = np.random.default_rng(seed)
    ratios = _resampled_medians(top, rng, resamples) / _resampled_medians(bottom, rng, resamples)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return Ratio(float(estimate), float(low), float(high))


def quartiles(runs: Runs) -> tuple[float, float, float]:
    """First quartile, median and third quartile of the pooled values."""
    values = _usable(runs)
    if not values:
        return float("nan"), float("nan"), float("nan")
    q1, median, q3 = np.percentile(np.concatenate(values), [25, 50, 75])
    return float(q1), float(median), float(q3)
