"""A run and a sweep as plain data: what `tracking.records` reads from a store, and what analysis
decides on and presentation renders, with no MLflow type in sight.

They live here, below every layer, so that analysis and presentation name them without importing
tracking (import-linter's contracts "Analysis never reaches MLflow" and "Presentation renders: it
never reaches the store").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.base.names import TAG_PARENT_RUN


@dataclass
class RunRecord:
    """A finished run as plain data."""

    run_id: str
    name: str
    params: dict[str, str]
    metrics: dict[str, float]  # last values
    tags: dict[str, str]
    histories: dict[str, list[float]] = field(default_factory=dict)  # per-epoch values, step order

    @property
    def parent_run_id(self) -> str:
        """The sweep that trained it (MLflow's parent tag), or '' for a run of no sweep."""
        return self.tags.get(TAG_PARENT_RUN, "")


@dataclass
class SweepRecord:
    run_id: str
    name: str
    experiment_id: str
    experiment_name: str
    # Its FINISHED runs: those it trained, and the DONE ones of earlier sweeps it counted (names.TAG_DONE_RUNS).
    children: list[RunRecord]
    status: str = "FINISHED"  # the parent run's: RUNNING while the sweep trains
    planned: int | None = None  # the runs its grid plans (names.TAG_GRID_SIZE), where it says
    # Earlier sweeps whose DONE runs it counts, by parent run id: their names ("grid 2026-12-05 10:00").
    earlier: dict[str, str] = field(default_factory=dict)

    def from_earlier(self) -> list[RunRecord]:
        """The runs it counts that an earlier sweep trained (DONE here: skipped, not trained again)."""
        return [run for run in self.children if run.parent_run_id != self.run_id]

    @property
    def partial(self) -> bool:
        """Whether it is still training: its verdict covers the runs finished so far."""
        return self.status == "RUNNING"
