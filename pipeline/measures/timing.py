"""Which epochs a speed figure uses. One rule for the comparison table, the sweep summary and charts.

The first epoch pays one-off costs that later epochs do not: DataLoader workers starting, the
allocator growing, and on a GPU the first pinned buffers and kernel choices (the untimed warm-up
takes most of those, not all). With two or more epochs, speed is taken over the epochs after the
first ("steady state": a run's median, a setting's median over its runs); a one-epoch run can only
be timed cold, and says so.

Each child works out its per-run figures here at its end and logs them (its summary and its end
figures); the comparison works out the same figures, with the same functions, from the history of a
run made before children logged them, so that old and new runs agree.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.base.names import (
    FINAL_ACCURACY,
    FIRST_EPOCH,
    PEAK_MEMORY,
    STEADY_ENERGY,
    STEADY_EPOCH,
    STEADY_IMAGES,
    TIME_BUCKETS,
    TIME_SHARES,
    TRAINED_EPOCHS,
)

# The per-epoch metrics a run's figures are worked out from: its summary's and its end figures'.
FIGURE_HISTORIES = ("epoch_duration_s", "images_per_s", *TIME_BUCKETS, "peak_memory_mb", "energy_j")


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
    statistics take this figure, one per run, and a millisecond is 4% of such an epoch), the images of
    an epoch over that time (whole images/s: the rate that time means, not a median of rates), the
    final test accuracy to 4 digits. A figure that cannot be told is left out."""
    figures = {}
    if (epoch := steady_median(epoch_s)) is not None:
        figures[STEADY_EPOCH] = significant(epoch, 4)
        # The images of an epoch over that epoch time (each epoch's rate times its time is its images).
        images = steady_median([rate * seconds for rate, seconds in zip(images_per_s, epoch_s)])
        if images is not None and epoch > 0:
            figures[STEADY_IMAGES] = float(round(images / epoch))
    if test_accuracy is not None and test_accuracy == test_accuracy:  # not NaN
        figures[FINAL_ACCURACY] = round(test_accuracy, 4)
    return figures


def summary_of(epochs: Sequence[Any]) -> dict[str, float]:
    """`summary` of a run's epochs (train.EpochStats, in order): what each child logs at its end."""
    return summary(
        [e.epoch_duration_s for e in epochs],
        [e.images_per_s for e in epochs],
        epochs[-1].test_accuracy if epochs else None,
    )


def end_figures(histories: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """A run's end figures (names.END_FIGURES) from its per-epoch metrics by name, in epoch order, as the
    store holds them (an epoch that could not tell a value has none): how many epochs, the first one's
    time, the share of the steady epochs' time each time bucket took, the
    highest peak memory and the mean energy of the steady epochs. Unrounded; a figure that cannot be
    told is left out."""
    epochs = list(histories.get("epoch_duration_s", ()))
    figures = {TRAINED_EPOCHS: float(len(epochs))}
    if epochs:
        figures[FIRST_EPOCH] = epochs[0]
    total = sum(steady(epochs))
    for bucket, share in zip(TIME_BUCKETS, TIME_SHARES):
        spent = steady(histories.get(bucket, ()))
        if spent and total > 0:
            figures[share] = sum(spent) / total
    if memory := histories.get("peak_memory_mb"):
        figures[PEAK_MEMORY] = max(memory)
    # A mean of 0 is kept: an energy counter that never moved in the steady epochs is the reader's to judge.
    if joules := steady(histories.get("energy_j", ())):
        figures[STEADY_ENERGY] = sum(joules) / len(joules)
    return figures


def has_end_figures(metrics: Mapping[str, float]) -> bool:
    """Whether a run logged its end figures itself (every run that does has TRAINED_EPOCHS). One made
    before children logged them has them worked out from its history instead."""
    return TRAINED_EPOCHS in metrics


def histories_of(epochs: Sequence[Any], names: Sequence[str]) -> dict[str, list[float]]:
    """Per-epoch values of each metric in `names` of a run's epochs (train.EpochStats), as the store holds
    them once logged (epoch order; a None, a value that cannot be told, was never logged)."""
    ordered = sorted(epochs, key=lambda e: e.epoch)
    return {name: [float(v) for e in ordered if (v := getattr(e, name)) is not None] for name in names}


def run_figures(histories: Mapping[str, Sequence[float]], test_accuracy: float | None) -> dict[str, float]:
    """A run's summary (`summary`) and end figures (`end_figures`) from its per-epoch metrics by name
    (FIGURE_HISTORIES, as the store holds them) and its final test accuracy."""
    return {
        **summary(histories.get("epoch_duration_s", ()), histories.get("images_per_s", ()), test_accuracy),
        **end_figures(histories),
    }


def logged_at_end(epochs: Sequence[Any]) -> dict[str, float]:
    """Every figure a child logs at its end (run_figures), of its epochs (train.EpochStats, in order)."""
    return run_figures(histories_of(epochs, FIGURE_HISTORIES), epochs[-1].test_accuracy if epochs else None)


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
