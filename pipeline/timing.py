"""Which epochs a speed figure uses. One rule for the comparison table, the sweep summary and charts.

The first epoch pays one-off costs that later epochs do not: DataLoader workers starting, the
allocator growing, and on a GPU the first pinned buffers and kernel choices (the untimed warm-up
takes most of those, not all). With two or more epochs, speed is the mean of the epochs after the
first ("steady state"); a one-epoch run can only be timed cold, and says so.
"""

from __future__ import annotations

from typing import Sequence


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
