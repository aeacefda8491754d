"""What execution hands back, as plain data: each point's outcome, a sweep's result, the plan of
which device each point runs on, and the Progress a running point reports to.

The Reporter and the verdict (`present/`) read these without reaching the tracking store, so this
module imports nothing of `tracking/` and no MLflow: import-linter's contract "Presentation renders:
it never reaches the store" holds through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.base import names
from pipeline.measures.timing import steady_mean, summary_of

if TYPE_CHECKING:
    import torch

    from pipeline.settings.grid import GridPoint
    from pipeline.training.train import EpochStats

FINISHED, FAILED, KILLED = names.FINISHED, names.FAILED, names.KILLED
SKIPPED = "SKIPPED"  # its device is missing here
DONE = "DONE"  # already FINISHED in an earlier sweep: not trained again
NOT_RUN = "NOT RUN"  # left out after --fail-fast or a tracking outage
UNLOGGED = "UNLOGGED"  # trained, but the store went down: the results wait in the results file


@dataclass
class Planned:
    """A grid point and the device it will run on, or why it cannot run."""

    point: GridPoint
    device: torch.device | None
    reason: str = ""  # why the device is unavailable
    hardware: str = ""  # what the run key names as the hardware (empty: the device's own name)
    run_key: str = ""  # set by the runner once the data is known


@dataclass
class Outcome:
    point: GridPoint
    status: str
    device: str = ""  # the device actually used, e.g. "cpu" or "cuda:0"
    reason: str = ""
    run_id: str | None = None
    epochs: list[EpochStats] = field(default_factory=list)
    run_duration_s: float | None = None
    one_off: dict[str, float] = field(default_factory=dict)  # warm-up, upload: costs paid once per run
    stored_mean_epoch_s: float | None = None  # DONE runs: the mean of their stored history
    stored_figures: dict[str, float] | None = None  # DONE runs: their steady-state summary as stored
    model_state: dict | None = None  # UNLOGGED only: the trained weights, for the results file
    store_down: bool = False  # the tracking store stopped answering: the sweep stops here
    no_room: bool = False  # ... because the disk under it is full
    device_lost: bool = False  # a sticky CUDA error: this process cannot use CUDA any more
    tags: dict[str, str] = field(default_factory=dict)  # the run's tags, for the results file
    # Run-level metrics measured over the training, name → (value, step): the machine's load
    # (contention.py) and the time to target (target.py). Kept for the results file as well.
    measured: dict[str, tuple[float, int]] = field(default_factory=dict)
    span: tuple[float, float] | None = None  # time.time() when training started and ended (Ray's concurrency)

    @property
    def mean_epoch_s(self) -> float | None:
        """Seconds per epoch in steady state (timing.steady: after the first, when there are two)."""

        if self.stored_mean_epoch_s is not None:
            return self.stored_mean_epoch_s
        return steady_mean([e.epoch_duration_s for e in self.epochs])

    @property
    def figures(self) -> dict[str, float]:
        """The run's steady-state summary (names.STEADY_EPOCH, STEADY_IMAGES, FINAL_ACCURACY), as
        logged: of its epochs, or as stored for a DONE run."""
        if self.stored_figures is not None:
            return self.stored_figures
        return summary_of(self.epochs)

    @property
    def final(self) -> EpochStats | None:
        return self.epochs[-1] if self.epochs else None

    @property
    def trained(self) -> bool:
        return self.status in (FINISHED, UNLOGGED)


@dataclass
class SweepResult:
    """What a sweep did: each point's outcome, in grid order, and where they were recorded."""

    outcomes: list[Outcome]
    experiment_id: str | None = None
    parent_run_id: str | None = None
    tracking_uri: str | None = None
    stopped: str = ""  # `repeats: auto`: why its rounds stopped, e.g. "repeats: auto stopped after 4 rounds: ..."
    # The comparison its verdict was built from (analysis.compare.Comparison: every point of the
    # grid, trained now or DONE), which `run --register` registers from; None where there is none.
    comparison: Any = None

    @property
    def exit_code(self) -> int:
        return 1 if any(o.status in (FAILED, NOT_RUN, UNLOGGED) for o in self.outcomes) else 0

    @property
    def recorded_run_ids(self) -> list[str]:
        """Runs of this grid's points that are FINISHED in the store, trained now or before (DONE)."""
        return [o.run_id for o in self.outcomes if o.status in (FINISHED, DONE) and o.run_id]


class Progress:
    """What a point reports while it runs; the Reporter shows it, a Ray worker's is silent."""

    def run_start(self, point: GridPoint, device: str, index: int, total: int) -> None: ...

    def note(self, text: str) -> None: ...

    def epoch_start(self, epoch: int, epochs: int, steps: int) -> None: ...

    def step(self) -> None: ...

    def epoch_end(self, stats: EpochStats, epochs: int) -> None: ...

    def epoch_done(self) -> None: ...

    def run_end(self, outcome: Outcome) -> None: ...
