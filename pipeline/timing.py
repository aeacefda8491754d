"""Which epochs a speed figure uses. One rule for the comparison table, the sweep summary and charts.

The first epoch pays one-off costs that later epochs do not: DataLoader workers starting, the
allocator growing, and on a GPU the first pinned buffers and kernel choices (the untimed warm-up
takes most of those, not all). With two or more epochs, speed is taken over the epochs after the
first ("steady state": a run's median, a setting's median over its runs); a one-epoch run can only
be timed cold, and says so.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from pipeline.names import FINAL_ACCURACY, STEADY_EPOCH, STEADY_IMAGES


def steady(values: Sequence[float]) -> list[float]:
    """The per-epoch values a speed figure averages: every epoch after the first, when there is one."""
    return list(values[1:]) if len(values) >= 2 else list(values)


def steady_mean(values: Sequence[float]) -> float | None:
    timed = steady(values)
    return sum(timed) / len(timed) if timed else None


def timed_label(epochs: int) -> str:
    """What a speed figure over `epochs` epochs measured, for tables: "epochs 2-3", "epoch 1 (cold)"."""
    if epochs >= 3:
        return f"epochs 2-{epochs}"
    return "epoch 2" if epochs == 2 else "epoch 1 (cold)"


def steady_median(values: Sequence[float]) -> float | None:
    """The median of the steady-state epochs' values (None when there are none)."""
    timed = steady(values)
    return statistics.median(timed) if timed else None


def significant(value: float, digits: int) -> float:
    """`value` rounded to `digits` significant digits (0.0234149 -> 0.02341, 12.3456 -> 12.35)."""
    return float(f"{value:.{digits}g}")


def summary(epoch_s: Sequence[float], images_per_s: Sequence[float], test_accuracy: float | None) -> dict[str, float]:
    """A run's steady-state summary as it is logged and shown everywhere (names.STEADY_EPOCH, ...):
    the median steady epoch to 4 significant digits (a 23 ms GPU epoch keeps 23.41 ms: the comparison's
    statistics take this figure, one per run, and a millisecond is 4% of such an epoch), its images/s
    whole, the final test accuracy to 4 digits. A figure that cannot be told is left out."""
    figures = {}
    if (epoch := steady_median(epoch_s)) is not None:
        figures[STEADY_EPOCH] = significant(epoch, 4)
    if (images := steady_median(images_per_s)) is not None:
        figures[STEADY_IMAGES] = float(round(images))
    if test_accuracy is not None and test_accuracy == test_accuracy:  # not NaN
        figures[FINAL_ACCURACY] = round(test_accuracy, 4)
    return figures


def summary_of(epochs: Sequence[Any]) -> dict[str, float]:
    """`summary` of a run's epochs (train.EpochStats, in order): what each child logs at its end."""
    return summary([e.epoch_duration_s for e in epochs], [e.images_per_s for e in epochs],
                   epochs[-1].test_accuracy if epochs else None)


def summary_line(figures: dict[str, float]) -> str:
    """A summary in words, e.g. "steady epoch 1.234 s, 48,612 img/s, test acc 0.8123"."""
    parts = []
    if STEADY_EPOCH in figures:
        parts.append(f"steady epoch {figures[STEADY_EPOCH]:.3f} s")
    if STEADY_IMAGES in figures:
        parts.append(f"{figures[STEADY_IMAGES]:,.0f} img/s")
    if FINAL_ACCURACY in figures:
        parts.append(f"test acc {figures[FINAL_ACCURACY]:.4f}")
    return ", ".join(parts)
