"""Orchestrates a grid: plan devices, load data once, then one tracked run per grid point.

Bad input (grid, device with --require-devices, data, tracking store) raises UserError before any
MLflow run exists. A failure inside one run marks that run FAILED with its reason, and the grid goes
on. Ctrl-C marks the current run and the parent KILLED and re-raises.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from pipeline.config import GridSpec, RunConfig
from pipeline.errors import UserError
from pipeline.grid import GridPoint, config_hash, expand

if TYPE_CHECKING:
    import torch

    from pipeline.data import Dataset
    from pipeline.report import Reporter
    from pipeline.tracking import Tracker
    from pipeline.train import EpochStats

FINISHED, FAILED, KILLED, SKIPPED = "FINISHED", "FAILED", "KILLED", "SKIPPED"


@dataclass(frozen=True)
class Options:
    """How to run, as opposed to what to train (the RunConfig)."""

    tracking_uri: str | None = None
    experiment: str | None = None
    data_dir: str | None = None
    require_devices: bool = False
    dry_run: bool = False
    system_metrics: bool = False


@dataclass
class Outcome:
    point: GridPoint
    status: str
    device: str = ""  # the device actually used, e.g. "cpu" or "cuda:0"
    reason: str = ""
    run_id: str | None = None
    epochs: list["EpochStats"] = field(default_factory=list)
    run_duration_s: float | None = None

    @property
    def final(self) -> "EpochStats | None":
        return self.epochs[-1] if self.epochs else None

    @property
    def mean_epoch_s(self) -> float | None:
        return statistics.fmean(e.epoch_duration_s for e in self.epochs) if self.epochs else None


@dataclass
class Planned:
    point: GridPoint
    device: "torch.device | None"
    reason: str = ""  # why the device is unavailable


@dataclass
class SweepResult:
    outcomes: list[Outcome]
    experiment_id: str | None = None
    parent_run_id: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if any(o.status == FAILED for o in self.outcomes) else 0


def plan(points: Sequence[GridPoint]) -> list[Planned]:
    """Resolve every point's device once; unavailable ones carry the reason."""
    from pipeline.device import DeviceUnavailable, resolve

    planned = []
    for point in points:
        try:
            planned.append(Planned(point, resolve(point.config.device)))
        except DeviceUnavailable as exc:
            planned.append(Planned(point, None, str(exc)))
    return planned


def _require_devices(planned: Sequence[Planned]) -> None:
    missing = [p for p in planned if p.device is None]
    if missing:
        reasons = sorted({p.reason for p in missing})
        raise UserError(
            f"{len(missing)} of {len(planned)} grid points need a device this machine lacks: "
            f"{'; '.join(reasons)}. Drop those devices from the grid, or run without --require-devices to skip them"
        )


def run_grid(spec: GridSpec, reporter: "Reporter", options: Options = Options()) -> SweepResult:
    """Train every point of `spec` under one parent run; returns what happened to each point."""
    from pipeline import data as data_mod
    from pipeline.tracking import TAG_GRID_FILE, TAG_GRID_SIZE, TAG_ROLE, Tracker, resolve_tracking_uri

    points = expand(spec)
    planned = plan(points)
    if options.require_devices:
        _require_devices(planned)
    data_root = options.data_dir or spec.data.root
    if options.dry_run:
        folder, _ = data_mod.locate(data_root)
        reporter.plan(spec, planned, folder)
        return SweepResult([Outcome(p.point, SKIPPED, reason="dry run") for p in planned])

    dataset = data_mod.load(data_root, spec.data.train_size, spec.data.test_size)
    reporter.data(dataset.description)
    tracker = Tracker(resolve_tracking_uri(options.tracking_uri), options.experiment or spec.experiment)
    if tracker.resumed_run_id and options.experiment is None and spec.experiment != tracker.experiment_name:
        reporter.note(f"under `mlflow run` the runs go to the project run's experiment "
                      f"{tracker.experiment_name!r} (pass --experiment-name to `mlflow run` to choose it)")
    name = f"{spec.path.stem} {datetime.now():%Y-%m-%d %H:%M:%S}"
    parent_id, adopted = tracker.adopt_or_start(
        name, {TAG_ROLE: "sweep", TAG_GRID_FILE: str(spec.path), TAG_GRID_SIZE: str(len(points))}
    )
    try:
        tracker.client.log_text(parent_id, spec.path.read_text(encoding="utf-8"), f"grid/{spec.path.name}")
    except OSError:
        pass
    reporter.sweep_start(tracker, parent_id, len(points))

    outcomes: list[Outcome] = []
    total = sum(p.device is not None for p in planned)
    done = 0
    try:
        for item in planned:
            if item.device is None:
                outcomes.append(Outcome(item.point, SKIPPED, reason=item.reason))
                reporter.skipped(item.point, item.reason)
                continue
            done += 1
            outcomes.append(_run_point(tracker, dataset, item, parent_id, reporter, (done, total), options))
    except KeyboardInterrupt:
        tracker.end_run(parent_id, KILLED)
        raise
    result = SweepResult(outcomes, tracker.experiment_id, parent_id)
    comparison = _log_comparison(tracker, parent_id, reporter) if done else None
    if not adopted:  # `mlflow run` ends its own run from our exit code
        tracker.end_run(parent_id, FAILED if result.exit_code else FINISHED)
    reporter.summary(spec.axes, result, tracker, comparison)
    return result


def _log_comparison(tracker: "Tracker", parent_id: str, reporter: "Reporter"):
    """The comparison table and charts, as artifacts of the parent run (under comparison/)."""
    from pipeline.compare import HISTORIES, build, write_report
    from pipeline.tracking import read_sweep

    try:
        comparison = build(read_sweep(tracker.client, parent_run_id=parent_id, histories=HISTORIES))
        if comparison.table.empty:
            return comparison
        with tempfile.TemporaryDirectory() as tmp:
            write_report(comparison, Path(tmp))
            tracker.log_artifacts(parent_id, Path(tmp), "comparison")
        return comparison
    except Exception as exc:  # a report must never cost the user their sweep
        reporter.note(f"could not build the comparison charts ({exc.__class__.__name__}: {exc})")
        return None


def run_single(config: RunConfig, reporter: "Reporter", options: Options = Options()) -> SweepResult:
    """One run (`pipeline train`): a top-level run, or the `mlflow run` project run itself."""
    from pipeline import data as data_mod
    from pipeline.tracking import Tracker, resolve_tracking_uri

    values = config.as_params()
    name = " ".join(f"{k}={values[k]}" for k in ("lr", "batch_size", "num_workers", "device"))
    (item,) = plan([GridPoint(1, config, name)])
    if item.device is None:
        raise UserError(f"--device {config.device}: {item.reason}; use --device cpu or auto")
    dataset = data_mod.load(options.data_dir)
    reporter.data(dataset.description)
    tracker = Tracker(resolve_tracking_uri(options.tracking_uri), options.experiment or "train")
    outcome = _run_point(tracker, dataset, item, None, reporter, (1, 1), options)
    result = SweepResult([outcome], tracker.experiment_id, None)
    reporter.summary(tuple((k, (v,)) for k, v in values.items()), result, tracker)
    return result


def _run_point(tracker: "Tracker", dataset: "Dataset", item: Planned, parent_id: str | None,
               reporter: "Reporter", position: tuple[int, int], options: Options) -> Outcome:
    """Train and track one grid point. Exceptions become a FAILED run; Ctrl-C a KILLED one."""
    import torch

    from pipeline import tracking
    from pipeline.device import hardware_name
    from pipeline.train import Hooks, fit

    point, device = item.point, item.device
    outcome = Outcome(point, FAILED, device=str(device))
    identity = {"train_size": len(dataset.train), "test_size": len(dataset.test), "verified": dataset.verified}
    tags = {
        tracking.TAG_ROLE: "point" if parent_id else "single",
        tracking.TAG_DEVICE: str(device),
        tracking.TAG_HARDWARE: hardware_name(device),
        tracking.TAG_TORCH: torch.__version__,
        tracking.TAG_CUDA: torch.version.cuda or "none",
        tracking.TAG_CONFIG_HASH: config_hash(point.config, **identity),
        tracking.TAG_DATA: dataset.description,
    }
    if parent_id is None:
        run_id, _ = tracker.adopt_or_start(point.name, tags)
    else:
        run_id = tracker.start_run(point.name, parent_id, tags)
    outcome.run_id = run_id
    tracker.log_params(run_id, {**point.config.as_params(), "train_size": len(dataset.train),
                                "test_size": len(dataset.test)})
    reporter.run_start(point, str(device), *position)

    class _Hooks(Hooks):
        def model_ready(self, model) -> None:
            tracker.log_network(run_id, model, dataset.train.images[: min(point.config.batch_size, 64)])

        def epoch_start(self, epoch: int, steps: int) -> None:
            reporter.epoch_start(epoch, point.config.epochs, steps)

        def step(self) -> None:
            reporter.step()

        def epoch_end(self, stats: "EpochStats") -> None:
            outcome.epochs.append(stats)
            tracker.log_epoch(run_id, stats)
            reporter.epoch_end(stats, point.config.epochs)

    try:
        with tracker.system_metrics(run_id, options.system_metrics):
            result = fit(point.config, dataset, device, _Hooks())
        outcome.run_duration_s = result.duration_s
        tracker.log_run_duration(run_id, result.duration_s)
        example = (dataset.test.images[:2].float() / 255).numpy()
        tracker.log_model(run_id, result.model, example)
        outcome.status = FINISHED
    except KeyboardInterrupt:
        outcome.status, outcome.reason = KILLED, "interrupted"
        tracker.end_run(run_id, KILLED)
        reporter.run_end(outcome)
        raise
    except Exception as exc:  # one run's failure must not stop the grid
        outcome.reason = f"{exc.__class__.__name__}: {exc}"
        tracker.log_failure(run_id, exc)
    finally:
        reporter.epoch_done()
    tracker.end_run(run_id, outcome.status)
    reporter.run_end(outcome)
    return outcome
