"""A run and a sweep as plain data: what `tracking.records` reads from a store, and what analysis
decides on and presentation renders, with no MLflow type in sight.

They live here, below every layer, so that analysis and presentation name them without importing
tracking (import-linter's contracts "Analysis never reaches MLflow" and "Presentation renders: it
never reaches the store").
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunRecord:
    """A finished run as plain data."""

    run_id: str
    name: str
    params: dict[str, str]
    metrics: dict[str, float]  # last values
    tags: dict[str, str]
    histories: dict[str, list[float]] = field(default_factory=dict)  # per-epoch values, step order


@dataclass
class SweepRecord:
    run_id: str
    name: str
    experiment_id: str
    experiment_name: str
    children: list[RunRecord]
