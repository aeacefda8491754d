"""Orchestrates a grid: plan devices, load data once, then one tracked run per grid point.

Bad input (grid, device with --require-devices, data, tracking store) raises UserError before any
MLflow run exists. Points that already have a FINISHED run with the same run key (settings, data,
host, hardware) are skipped unless --rerun. A failure inside one run marks that run FAILED with its
reason and the grid goes on (or stops, with --fail-fast). Ctrl-C or SIGTERM marks the current run
and the parent KILLED; a second one exits at once. Finished results are also appended to a local
JSONL file, so a tracking outage loses no training.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pipeline import interrupts
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
DONE = "DONE"  # already FINISHED in an earlier sweep: not trained again
NOT_RUN = "NOT RUN"  # left out after --fail-fast or a tracking outage


@dataclass(frozen=True)
class Options:
    """How to run, as opposed to what to train (the RunConfig)."""

    tracking_uri: str | None = None
    experiment: str | None = None
    data_dir: str | None = None
    require_devices: bool = False
    dry_run: bool = False
    system_metrics: bool = False
    rerun: bool = False
    fail_fast: bool = False
    checkpoint: bool = False
    executor: str = "local"  # or "ray"
    ray_address: str | None = None  # with ray: None starts Ray here; "auto" or "ray://..." joins a cluster


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
    run_key: str = ""
    hardware: str = ""  # when known before the run (Ray: a device the driver itself lacks)


@dataclass
class SweepResult:
    outcomes: list[Outcome]
    experiment_id: str | None = None
    parent_run_id: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if any(o.status in (FAILED, NOT_RUN) for o in self.outcomes) else 0


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


def run_key(config: RunConfig, dataset: "Dataset", hardware: str) -> str:
    """A point's identity: its settings, the data, and where it was measured (host, hardware).
    The same settings timed on another machine are a different measurement, not a duplicate."""
    return config_hash(config, **dataset.identity, host=socket.gethostname(), hardware=hardware)


def _check_store(options: Options) -> None:
    """Fail in seconds on a store that cannot be used, before decoding data or training."""
    from pipeline.tracking import sqlite_path, check_reachable, open_client, resolve_tracking_uri

    uri = resolve_tracking_uri(options.tracking_uri)
    if sqlite_path(uri) is not None:
        check_reachable(uri)  # its folder exists; the file itself is only created once data is found
    else:
        open_client(uri)


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

    planned = plan(expand(spec))
    if options.require_devices:
        _require_devices(planned)
    data_root = options.data_dir or spec.data.root
    if options.dry_run:
        folder, _ = data_mod.locate(data_root)
        reporter.plan(spec, planned, folder)
        return SweepResult([Outcome(p.point, SKIPPED, reason="dry run") for p in planned])
    _check_store(options)
    dataset = data_mod.load(data_root, spec.data.train_size, spec.data.test_size)
    options = Options(**{**asdict(options), "checkpoint": options.checkpoint or spec.checkpoint})
    return _Sweep(dataset, reporter, options, options.experiment or spec.experiment).run(planned, spec)


def run_single(config: RunConfig, reporter: "Reporter", options: Options = Options()) -> SweepResult:
    """One run (`pipeline train`): a top-level run, or the `mlflow run` project run itself."""
    from pipeline import data as data_mod

    values = config.as_params()
    name = " ".join(f"{k}={values[k]}" for k in ("lr", "batch_size", "num_workers", "device"))
    (item,) = plan([GridPoint(1, config, name)])
    if item.device is None:
        raise UserError(f"--device {config.device}: {item.reason}; use --device cpu or auto")
    _check_store(options)
    dataset = data_mod.load(options.data_dir)
    options = Options(**{**asdict(options), "rerun": True})  # `train` always trains: it is one explicit run
    return _Sweep(dataset, reporter, options, options.experiment or "train").run([item], None)


class _Sweep:
    """One invocation: the tracker, the data, and the runs it has open (for honest interrupts)."""

    def __init__(self, dataset: "Dataset", reporter: "Reporter", options: Options, experiment: str) -> None:
        from pipeline.tracking import Tracker, local_state_dir, resolve_tracking_uri

        self.dataset, self.reporter, self.options = dataset, reporter, options
        reporter.data(dataset.description)
        self.tracker: Tracker = Tracker(resolve_tracking_uri(options.tracking_uri), experiment)
        self.state_dir = local_state_dir(self.tracker.uri)
        self.open_runs: list[str] = []  # parent first, then the current child
        self.parent_id: str | None = None
        self.write_results = True  # a Ray worker leaves the results file to the driver

    def run(self, planned: list[Planned], spec: GridSpec | None) -> SweepResult:
        tracker, reporter = self.tracker, self.reporter
        reaped = tracker.reap_orphans()
        if reaped:
            reporter.note(f"marked {len(reaped)} run(s) KILLED whose process ended without closing them: "
                          f"{', '.join(reaped)}")
        if spec is not None and tracker.resumed_run_id and self.options.experiment is None \
                and spec.experiment != tracker.experiment_name:
            reporter.note(f"under `mlflow run` the runs go to the project run's experiment "
                          f"{tracker.experiment_name!r} (pass --experiment-name to `mlflow run` to choose it)")
        cluster = None
        if self.options.executor == "ray":
            from pipeline.executors import RayCluster

            cluster = RayCluster(self.options.ray_address, tracker.uri)
            planned = _plan_for_cluster(planned, cluster)
        try:
            return self._run(planned, spec, cluster)
        finally:
            if cluster is not None:
                cluster.close()

    def _run(self, planned: list[Planned], spec: GridSpec | None, cluster) -> SweepResult:
        from pipeline.tracking import TAG_GRID_FILE, TAG_GRID_SIZE, TAG_ROLE

        tracker, reporter = self.tracker, self.reporter
        outcomes = self._skip_done(planned)
        todo = [p for p in planned if p.device is not None and p.point.index not in outcomes]

        parent_id, adopted = None, False
        if spec is not None and todo:
            name = f"{spec.path.stem} {datetime.now():%Y-%m-%d %H:%M:%S}"
            parent_id, adopted = tracker.adopt_or_start(
                name, {TAG_ROLE: "sweep", TAG_GRID_FILE: str(spec.path), TAG_GRID_SIZE: str(len(planned))})
            self.open_runs.append(parent_id)
            self.parent_id = parent_id
            with contextlib.suppress(OSError):
                tracker.client.log_text(parent_id, spec.path.read_text(encoding="utf-8"), f"grid/{spec.path.name}")
            reporter.sweep_start(tracker, parent_id, len(planned))

        from pipeline.tracking import TrackingUnavailable

        stop = ""
        try:
            with interrupts.handled(self._last_resort):
                if cluster is not None:
                    from pipeline.executors import run_on_ray

                    outcomes.update(run_on_ray(self, cluster, todo, parent_id))
                    todo = []
                for position, item in enumerate(todo, start=1):
                    if stop:
                        outcomes[item.point.index] = Outcome(item.point, NOT_RUN, reason=stop)
                        continue
                    outcome = self._run_point(item, parent_id, (position, len(todo)))
                    outcomes[item.point.index] = outcome
                    if outcome.status == FAILED and self.options.fail_fast:
                        stop = f"not run: --fail-fast after #{item.point.index} failed"
        except TrackingUnavailable as exc:
            stop = f"not run: the tracking store went down ({exc})"
            for item in todo:
                outcomes.setdefault(item.point.index, Outcome(item.point, NOT_RUN, reason=stop))
            reporter.tracking_down(str(exc), self.state_dir)
        except KeyboardInterrupt:
            if parent_id:
                self._close(parent_id, KILLED)
            raise
        for item in planned:
            if item.device is None:
                outcomes[item.point.index] = Outcome(item.point, SKIPPED, reason=item.reason)
        result = SweepResult([outcomes[p.point.index] for p in planned], tracker.experiment_id, parent_id)
        comparison = None
        if parent_id and not stop.startswith("not run: the tracking"):
            comparison = _log_comparison(tracker, parent_id, reporter)
            if not adopted:  # `mlflow run` ends its own run from our exit code
                self._close(parent_id, FAILED if result.exit_code else FINISHED)
        axes = spec.axes if spec is not None else tuple((k, (v,)) for k, v in planned[0].point.config.as_params().items())
        reporter.summary(axes, result, tracker, comparison)
        return result

    def _skip_done(self, planned: list[Planned]) -> dict[int, Outcome]:
        """Outcomes for the points already FINISHED with the same run key (none with --rerun)."""
        from pipeline.device import hardware_name

        for item in planned:
            if item.device is not None:
                item.run_key = run_key(item.point.config, self.dataset, item.hardware or hardware_name(item.device))
        if self.options.rerun:
            return {}
        finished = self.tracker.finished_runs()
        done = {}
        for item in planned:
            previous = finished.get(item.run_key) if item.device is not None else None
            if previous is not None:
                done[item.point.index] = _outcome_of_finished(item, previous)
        if done:
            self.reporter.note(f"{len(done)} of {len(planned)} points already have a FINISHED run here "
                               "(same settings, data, host and hardware): skipped; --rerun trains them again")
        return done

    def _close(self, run_id: str, status: str) -> None:
        self.tracker.end_run(run_id, status)
        if run_id in self.open_runs:
            self.open_runs.remove(run_id)

    def _last_resort(self) -> None:
        """A second Ctrl-C: mark what is open KILLED with one quick call each, no retries."""
        for run_id in reversed(self.open_runs):
            self.tracker.end_run(run_id, KILLED, quick=True)

    def _checkpoint_path(self, item: Planned) -> Path | None:
        from pipeline.tracking import CHECKPOINT_DIR

        return self.state_dir / CHECKPOINT_DIR / f"{item.run_key}.pt" if self.options.checkpoint else None

    def _run_point(self, item: Planned, parent_id: str | None, position: tuple[int, int]) -> Outcome:
        """Train and track one grid point. Exceptions become a FAILED run; Ctrl-C a KILLED one."""
        import torch

        from pipeline import tracking
        from pipeline.device import hardware_name
        from pipeline.train import fit

        tracker, dataset, reporter = self.tracker, self.dataset, self.reporter
        point, device = item.point, item.device
        outcome = Outcome(point, FAILED, device=str(device))
        checkpoint = self._checkpoint_path(item)
        resume = _load_checkpoint(checkpoint, device)
        tags = {
            tracking.TAG_ROLE: "point" if parent_id else "single",
            tracking.TAG_DEVICE: str(device),
            tracking.TAG_HARDWARE: hardware_name(device),
            tracking.TAG_TORCH: torch.__version__,
            tracking.TAG_CUDA: torch.version.cuda or "none",
            tracking.TAG_CONFIG_HASH: config_hash(point.config, **dataset.identity),
            tracking.TAG_RUN_KEY: item.run_key,
            tracking.TAG_DATA: dataset.description,
        }
        if resume is not None:
            tags[tracking.TAG_RESUMED_FROM] = str(resume["epoch"])
            tags["pipeline.resumed_from_run"] = resume.get("run_id", "")
        if parent_id is None:
            run_id, _ = tracker.adopt_or_start(point.name, tags)
        else:
            run_id = tracker.start_run(point.name, parent_id, tags)
        self.open_runs.append(run_id)
        outcome.run_id = run_id
        tracker.log_params(run_id, {**point.config.as_params(), "train_size": len(dataset.train),
                                    "test_size": len(dataset.test)})
        reporter.run_start(point, str(device), *position)
        if resume is not None:
            from pipeline.train import EpochStats

            outcome.epochs = [EpochStats(**e) for e in resume["epochs"]]  # logged again by model_ready
            reporter.note(f"resuming from the checkpoint after epoch {resume['epoch']} ({checkpoint})")
        hooks = _RunHooks(self, point, run_id, outcome, checkpoint)
        try:
            with tracker.system_metrics(run_id, self.options.system_metrics):
                result = fit(point.config, dataset, device, hooks, resume=resume)
            outcome.run_duration_s = result.duration_s
            if hooks.tracking_error is not None:
                raise hooks.tracking_error
            tracker.log_run_duration(run_id, result.duration_s)
            tracker.log_model(run_id, result.model, (dataset.test.images[:2].float() / 255).numpy())
            outcome.status = FINISHED
        except KeyboardInterrupt:
            outcome.status, outcome.reason = KILLED, "interrupted"
            reporter.epoch_done()
            self._close(run_id, KILLED)
            reporter.run_end(outcome)
            raise
        except tracking.TrackingUnavailable:
            outcome.reason = "the tracking store went down; results kept locally"
            self._append_result(item, outcome, logged=False)
            tracker.end_run(run_id, FAILED, quick=True)
            raise
        except Exception as exc:  # one run's failure must not stop the grid
            outcome.reason = _failure_reason(exc, point.config)
            tracker.log_failure(run_id, exc, outcome.reason)
            _free_device_memory(device)
        finally:
            reporter.epoch_done()
        self._close(run_id, outcome.status)
        if outcome.status == FINISHED:
            if self.write_results:
                self._append_result(item, outcome, logged=True)
            if checkpoint is not None:
                checkpoint.unlink(missing_ok=True)
        reporter.run_end(outcome)
        return outcome

    def _append_result(self, item: Planned, outcome: Outcome, logged: bool) -> None:
        """One JSON line per finished run beside the store: the results survive a tracking outage."""
        from pipeline import tracking

        line = {
            "time": datetime.now().isoformat(timespec="seconds"), "logged": logged,
            "tracking_uri": tracking.absolute_store_uri(self.tracker.uri),
            "experiment": self.tracker.experiment_name, "parent_run_id": self.parent_id,
            "run_id": outcome.run_id, "name": item.point.name, "run_key": item.run_key,
            "device": outcome.device, "params": {**item.point.config.as_params(), **self.dataset.identity},
            "run_duration_s": outcome.run_duration_s, "epochs": [asdict(e) for e in outcome.epochs],
        }
        with open(self.state_dir / tracking.RESULTS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


class _RunHooks:
    """What the training loop reports, sent to MLflow, the screen and the checkpoint file."""

    def __init__(self, sweep: _Sweep, point: GridPoint, run_id: str, outcome: Outcome, checkpoint: Path | None):
        self.sweep, self.point, self.run_id, self.outcome = sweep, point, run_id, outcome
        self.checkpoint = checkpoint
        self.checkpointing = checkpoint is not None
        self.tracking_error: Exception | None = None  # training goes on; results are kept locally

    def _track(self, call, *args) -> None:
        from pipeline.tracking import TrackingUnavailable

        if self.tracking_error is None:
            try:
                call(*args)
            except TrackingUnavailable as exc:
                self.tracking_error = exc

    def model_ready(self, model) -> None:
        images = self.sweep.dataset.train.images[: min(self.point.config.batch_size, 64)]
        self._track(self.sweep.tracker.log_network, self.run_id, model, images)
        for stats in self.outcome.epochs:  # epochs restored from a checkpoint: log them again here
            self._track(self.sweep.tracker.log_epoch, self.run_id, stats)

    def epoch_start(self, epoch: int, steps: int) -> None:
        self.sweep.reporter.epoch_start(epoch, self.point.config.epochs, steps)

    def step(self) -> None:
        self.sweep.reporter.step()

    def epoch_end(self, stats: "EpochStats") -> None:
        self.outcome.epochs.append(stats)
        self._track(self.sweep.tracker.log_epoch, self.run_id, stats)
        self.sweep.reporter.epoch_end(stats, self.point.config.epochs)

    def save_state(self, state: dict) -> None:
        import torch

        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.checkpoint.with_suffix(".tmp")
        torch.save({**state, "run_id": self.run_id}, temporary)
        os.replace(temporary, self.checkpoint)  # an interrupted write never spoils the last good one


def _plan_for_cluster(planned: list[Planned], cluster) -> list[Planned]:
    """On Ray, a device is available when some node of the cluster has it, not this machine."""
    import torch

    from pipeline.device import hardware_name
    from pipeline.executors import task_resources

    result = []
    for item in planned:
        config = item.point.config
        resources = task_resources(item)
        reason = cluster.unsatisfiable(config.device, resources["num_gpus"], int(resources["num_cpus"]))
        if reason:
            result.append(Planned(item.point, None, reason))
            continue
        # The run key names the hardware; a device this driver lacks is known only by its kind.
        device = item.device if item.device is not None else torch.device(config.device.split(":")[0])
        hardware = hardware_name(device) if item.device is not None else f"ray cluster {config.device}"
        result.append(Planned(item.point, device, hardware=hardware))
    return result


def _load_checkpoint(path: Path | None, device: "torch.device") -> dict | None:
    import torch

    if path is None or not path.exists():
        return None
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception:  # a damaged checkpoint costs a restart, not the run
        return None


def _outcome_of_finished(item: Planned, run: Any) -> Outcome:
    from pipeline.tracking import TAG_DEVICE
    from pipeline.train import EpochStats

    metrics = run.data.metrics
    fields = {name: metrics.get(name, float("nan")) for name in EpochStats.__dataclass_fields__ if name != "epoch"}
    stats = EpochStats(epoch=item.point.config.epochs, **fields)
    return Outcome(item.point, DONE, device=run.data.tags.get(TAG_DEVICE, ""), run_id=run.info.run_id,
                   reason=f"already FINISHED as run {run.info.run_id}", epochs=[stats],
                   run_duration_s=metrics.get("run_duration_s"))


def _failure_reason(exc: BaseException, config: RunConfig) -> str:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return (f"CUDA out of memory at batch_size {config.batch_size}: lower batch_size (or free the GPU) "
                f"and run again ({str(exc).splitlines()[0][:200]})")
    return f"{exc.__class__.__name__}: {exc}"


def _free_device_memory(device: "torch.device") -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
