"""A grid's quality target (`target: {test_accuracy: 0.85}`): what it means, and when a run reached it.

The target names one per-epoch quality metric and a threshold; the direction follows the metric (an
accuracy reaches it at or above the threshold, a loss at or below). Two figures time a run to it, up
to and including the first epoch that reaches it:

- time to target (`time_to_target_s`): the sum of those epochs' training passes (`epoch_duration_s`),
  evaluation and one-off costs (warm-up, compile, upload, capture) left out, so that it compares
  devices and settings on the training alone;
- wall time to target (`wall_to_target_s`): the wall clock from the start of the run's fit (the model
  built, warmed up or compiled, the data uploaded, the step captured) to the end of the evaluation
  that found the target (train.EpochStats.wall_clock_s): what a person waits for that answer.

Never imports torch or mlflow (config reads targets from grid files, train stops at them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.base.names import TAG_TARGET, TAG_TARGET_STATUS, TIME_TO_TARGET, WALL_TO_TARGET

ACCURACIES = ("train_accuracy", "test_accuracy")  # reached at >= threshold, threshold in (0, 1]
LOSSES = ("train_loss", "test_loss")  # reached at <= threshold, threshold > 0
METRICS = ("test_accuracy", "test_loss", "train_accuracy", "train_loss")


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
    accuracy = metric in ACCURACIES  # else a loss: METRICS is the two together
    if number is None or (accuracy and not 0 < number <= 1) or (not accuracy and number <= 0):
        expected = "an accuracy above 0 and at most 1, e.g. 0.85" if accuracy else "a loss above 0, e.g. 0.4"
        raise ValueError(f"{metric}: got {value!r}; expected {expected}")
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

    # Read-only properties: a frozen dataclass's fields match them, and the target changes none.
    @property
    def epoch(self) -> int: ...

    @property
    def epoch_duration_s(self) -> float: ...

    @property
    def wall_clock_s(self) -> float | None: ...


@dataclass(frozen=True)
class Timing:
    """How a run fared against its target: the first epoch that reached it (None: none did) and
    the times to it."""

    target: Target
    epochs_run: int
    epoch: int | None = None
    time_s: float | None = None  # the epochs' training passes up to `epoch`: evaluation and one-off costs left out
    wall_s: float | None = None  # the wall clock from the fit's start to the end of `epoch`'s evaluation

    @property
    def status(self) -> str:
        if self.epoch is None:
            return f"not reached in {self.epochs_run} epoch{'s' if self.epochs_run != 1 else ''}"
        return f"reached at epoch {self.epoch}"

    def tags(self) -> dict[str, str]:
        return {TAG_TARGET: str(self.target), TAG_TARGET_STATUS: self.status}

    def metrics(self) -> dict[str, tuple[float, int]]:
        """Metric name → (value, step = the epoch that reached the target); none when not reached, and
        no wall time where it was not measured."""
        if self.epoch is None:
            return {}
        figures = {TIME_TO_TARGET: self.time_s, WALL_TO_TARGET: self.wall_s}
        return {name: (value, self.epoch) for name, value in figures.items() if value is not None}


def timing(target: Target, epochs: Sequence[Epoch]) -> Timing:
    """The run's Timing against `target`, from its epochs in order."""
    elapsed = 0.0
    for stats in epochs:
        elapsed += stats.epoch_duration_s
        if target.reached(getattr(stats, target.metric)):
            return Timing(target, len(epochs), stats.epoch, elapsed, stats.wall_clock_s)
    return Timing(target, len(epochs))
