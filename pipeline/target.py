"""A grid's quality target (`target: {test_accuracy: 0.85}`): what it means, and when a run reached it.

The target names one per-epoch quality metric and a threshold; the direction follows the metric (an
accuracy reaches it at or above the threshold, a loss at or below). A run's time to target is its
training time up to and including the first epoch that reaches it: the sum of those epochs'
`epoch_duration_s`, so warm-up and compile are left out and the figure compares devices and settings
fairly; the wall time to target adds the one-off costs paid before epoch 1. Never imports torch or
mlflow (config reads targets from grid files, train stops at them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from pipeline.names import (CAPTURE, COMPILE, TAG_TARGET, TAG_TARGET_STATUS, TIME_TO_TARGET, UPLOAD,
                            WALL_TO_TARGET, WARMUP)

ACCURACIES = ("train_accuracy", "test_accuracy")  # reached at >= threshold, threshold in (0, 1]
LOSSES = ("train_loss", "test_loss")  # reached at <= threshold, threshold > 0
METRICS = ("test_accuracy", "test_loss", "train_accuracy", "train_loss")
# The costs paid once per run before epoch 1 (FitResult.one_off) that the wall time to target counts.
ONE_OFF_COSTS = (WARMUP, COMPILE, UPLOAD, CAPTURE)


@dataclass(frozen=True)
class Target:
    """One metric and the threshold it must reach."""

    metric: str
    threshold: float

    @property
    def higher_is_better(self) -> bool:
        return self.metric in ACCURACIES

    def reached(self, value: float) -> bool:
        """Whether one epoch's value of the metric reaches the target (NaN never does)."""
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.threshold:g}"


def parse(raw: Any) -> Target:
    """A grid file's `target:` value as a Target; ValueError saying what is allowed otherwise. The
    message is the part after "target: " in the loader's one-line error."""
    example = "e.g. {test_accuracy: 0.85} or {test_loss: 0.4}"
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"got {raw!r}; expected one metric and its threshold, {example}")
    if len(raw) > 1:
        raise ValueError(f"got {len(raw)} metrics ({', '.join(map(str, raw))}); a target names one, {example}")
    ((metric, value),) = raw.items()
    if metric not in METRICS:
        raise ValueError(f"{metric}: unknown metric; allowed: {', '.join(METRICS)}")
    number = _number(value)
    if metric in ACCURACIES and not (number is not None and 0 < number <= 1):
        raise ValueError(f"{metric}: got {value!r}; expected an accuracy above 0 and at most 1, e.g. 0.85")
    if metric in LOSSES and not (number is not None and number > 0):
        raise ValueError(f"{metric}: got {value!r}; expected a loss above 0, e.g. 0.4")
    return Target(metric, number)


def _number(value: Any) -> float | None:
    """A finite number, or None: YAML gives `1.0e-1` as a float but `1e-1` as a string, `yes` as a bool."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class Epoch(Protocol):
    """What the target reads from an epoch (train.EpochStats has it, without this module importing torch)."""

    epoch: int
    epoch_duration_s: float


@dataclass(frozen=True)
class Timing:
    """How a run fared against its target: the first epoch that reached it (None: none did) and
    the times to it."""

    target: Target
    epochs_run: int
    epoch: int | None = None
    time_s: float | None = None  # the epochs' training time up to `epoch`, warm-up and compile left out
    wall_s: float | None = None  # the same plus the one-off costs before epoch 1

    @property
    def status(self) -> str:
        if self.epoch is None:
            return f"not reached in {self.epochs_run} epoch{'s' if self.epochs_run != 1 else ''}"
        return f"reached at epoch {self.epoch}"

    def tags(self) -> dict[str, str]:
        return {TAG_TARGET: str(self.target), TAG_TARGET_STATUS: self.status}

    def metrics(self) -> dict[str, tuple[float, int]]:
        """Metric name → (value, step = the epoch that reached the target); none when not reached."""
        if self.epoch is None or self.time_s is None or self.wall_s is None:
            return {}
        return {TIME_TO_TARGET: (self.time_s, self.epoch), WALL_TO_TARGET: (self.wall_s, self.epoch)}


def timing(target: Target, epochs: Sequence[Epoch], one_off: Mapping[str, float]) -> Timing:
    """The run's Timing against `target`, from its epochs in order and its one-off costs (FitResult.one_off)."""
    elapsed = 0.0
    for stats in epochs:
        elapsed += stats.epoch_duration_s
        if target.reached(getattr(stats, target.metric)):
            wall = elapsed + sum(one_off.get(name, 0.0) for name in ONE_OFF_COSTS)
            return Timing(target, len(epochs), stats.epoch, elapsed, wall)
    return Timing(target, len(epochs))
