"""One grid point's job: a frozen description of it, and the one function that trains and records it.

`run_point` is the only body an executor runs, in this process or in a Ray worker; it knows nothing
of a sweep. `pipeline train` is a one-point job without a parent. Whatever happens inside, the run
it opened ends with an honest status: FINISHED, FAILED with the reason (the grid goes on), KILLED on
Ctrl-C (re-raised), or, when the store stopped answering, left to the results file (UNLOGGED).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.base import interrupts, names
from pipeline.base.files import replacing
from pipeline.execution.outcomes import (
    FAILED,
    FINISHED,
    KILLED,
    NOT_RUN,
    UNLOGGED,
    Outcome,
    Progress,
)
from pipeline.measures import contention
from pipeline.measures.target import Target
from pipeline.measures.target import Timing as TargetTiming
from pipeline.measures.target import timing as target_timing
from pipeline.measures.timing import logged_at_end, steady_median
from pipeline.settings.config import KEYS
from pipeline.settings.grid import GridPoint, config_hash
from pipeline.tracking.store import TrackingUnavailable, is_no_room
from pipeline.tracking.tracker import Tracker
from pipeline.training import flops, peak
from pipeline.training.energy import energy_source

if TYPE_CHECKING:
    import torch

    from pipeline.settings.config import RunConfig
    from pipeline.training.data import Dataset
    from pipeline.training.train import EpochStats

# The tags a run gets once it has trained (the rest it has from the start): logged with its results.
MEASURED_TAGS = (
    names.TAG_CONTENDED,
    names.TAG_TARGET,
    names.TAG_TARGET_STATUS,
    names.TAG_PEAK,
    names.TAG_BANDWIDTH,
)


@dataclass(frozen=True)
class DataRef:
    """Which data a job trains on, cheap to send to another process (each loads it once)."""

    folder: str
    train_size: int | None = None
    test_size: int | None = None

    def load(self) -> Dataset:
        from pipeline.training import data

        return data.load(self.folder, self.train_size, self.test_size)


@dataclass(frozen=True)
class PointJob:
    point: GridPoint
    device: str  # resolved where the job runs, e.g. "cpu" or "cuda:0"
    run_key: str  # settings + data + host + hardware: what "already done" means
    tracking_uri: str
    experiment_id: str
    experiment_name: str
    data: DataRef
    parent_run_id: str | None = None  # None: a top-level run
    adopt_run_id: str | None = None  # `mlflow run`'s project run: recorded into instead of a new run
    checkpoint: str | None = None  # this point's checkpoint file, removed once it finishes
    save_checkpoints: bool = False  # save state after every epoch
    resume: bool = False  # continue from the checkpoint file when there is one
    system_metrics: bool = False
    position: tuple[int, int] = (1, 1)  # n of m, for progress lines
    where: tuple[tuple[str, str], ...] = ()  # tags naming where it ran, set there (a Ray node's id)
    target: Target | None = None  # the grid's target: each run is timed to it (time_to_target_s)
    stop_at: Target | None = None  # the same with stop_at_target: the run ends at the epoch that reaches it
    claim: int = 0  # the attempt at the point its sweep claimed (tracking/claims.py); 0: none (pipeline train)


def run_point(job: PointJob, progress: Progress | None = None) -> Outcome:
    """Train and record one point. Exceptions become a FAILED run; Ctrl-C a KILLED one (re-raised)."""
    import torch

    from pipeline.training.train import EpochStats, fit  # torch

    progress = progress or Progress()
    dataset, device = job.data.load(), torch.device(job.device)
    tracker = Tracker.attach(job.tracking_uri, job.experiment_id, job.experiment_name)
    checkpoint = Path(job.checkpoint) if job.checkpoint else None
    resume = _load_checkpoint(checkpoint) if job.resume else None
    try:
        run_id, tags, run_params = _open_run(tracker, job, dataset, device, resume)
    except TrackingUnavailable as exc:
        return Outcome(job.point, NOT_RUN, device=job.device, reason=str(exc), store_down=True, no_room=is_no_room(exc))
    outcome = Outcome(job.point, FAILED, device=job.device, run_id=run_id, tags=tags)
    progress.run_start(job.point, job.device, *job.position)
    if resume is not None:
        outcome.epochs = [EpochStats(**e) for e in resume["epochs"]]  # logged again by model_ready
        progress.note(f"resuming from the checkpoint after epoch {resume['epoch']} ({checkpoint})")
    hooks = _PointHooks(tracker, run_id, job, dataset, outcome, progress, checkpoint, run_params)
    with interrupts.last_resort(lambda: tracker.end_run(run_id, KILLED, quick=True)):
        try:
            # One active run from training to the model: MLflow ends it when the block ends, and a run
            # must never be FINISHED before its summary and model are logged.
            with tracker.system_metrics(run_id, job.system_metrics):
                started, cpu = time.time(), contention.sample()
                # _PointHooks has every method of train.Hooks; subclassing it would import torch with this module.
                result = fit(
                    job.point.config,
                    dataset,
                    device,
                    hooks,  # type: ignore[arg-type]
                    resume=resume,
                    stop_at=job.stop_at,
                )
                load, outcome.span = contention.since(cpu), (started, time.time())
                outcome.run_duration_s, outcome.one_off = result.duration_s, result.one_off
                timing = _measured(outcome, job.target, load)
                _utilisation(outcome, job.point.config, len(dataset.train), device)
                if (
                    job.stop_at is not None
                    and timing is not None
                    and timing.epoch is not None
                    and timing.epoch < job.point.config.epochs
                ):
                    progress.note(f"{timing.target} {timing.status}: stopped there (stop_at_target)")
                if hooks.tracking_error is None:
                    _record_result(tracker, run_id, result, dataset, hooks)
            if hooks.tracking_error is None:
                outcome.status = FINISHED
            else:  # trained, but not recorded: the results file keeps it for `pipeline relog`
                outcome.status, outcome.reason = UNLOGGED, f"kept in the results file: {hooks.tracking_error}"
                outcome.store_down, outcome.no_room = True, is_no_room(hooks.tracking_error)
                outcome.model_state = {k: v.detach().cpu() for k, v in result.model.state_dict().items()}
                tracker.end_run(run_id, FAILED, quick=True, reason=str(hooks.tracking_error))
        except KeyboardInterrupt:
            _killed(tracker, run_id, outcome, progress)
            raise
        except Exception as exc:  # one run's failure must not stop the grid
            if _interrupted(exc):  # a Ctrl-C (or Ray's cancel) that a library wrapped in an error of its own
                _killed(tracker, run_id, outcome, progress)
                raise KeyboardInterrupt(str(exc)) from exc
            outcome.reason = _failure_reason(exc, job.point.config.batch_size)
            outcome.device_lost = device.type == "cuda" and cuda_context_lost(exc)
            _end_failed(tracker, run_id, exc, outcome.reason)
        finally:
            progress.epoch_done()
    if outcome.status == FAILED:
        # Here, not in `except`: until the exception is gone its traceback holds the model, the
        # optimizer and the activations, and nothing could be released.
        _free_device_memory(device)
    if outcome.trained and checkpoint is not None:
        checkpoint.unlink(missing_ok=True)  # whatever the flags: a later run must never resume a finished point
    progress.run_end(outcome)
    return outcome


def _open_run(
    tracker: Tracker, job: PointJob, dataset: Dataset, device: torch.device, resume: dict | None
) -> tuple[str, dict[str, str], dict[str, str]]:
    import torch

    from pipeline.training.device import arithmetic_tags, hardware_name
    from pipeline.training.train import torch_threads

    tags = {
        names.TAG_ROLE: "point" if job.parent_run_id else "single",
        names.TAG_DEVICE: job.device,
        names.TAG_HARDWARE: hardware_name(device),
        names.TAG_TORCH: torch.__version__,
        names.TAG_CUDA: torch.version.cuda or "none",
        names.TAG_CONFIG_HASH: config_hash(job.point.config, **dataset.identity),
        names.TAG_RUN_KEY: job.run_key,
        names.TAG_DATA: dataset.description,
        names.TAG_ENERGY: energy_source(device),
        names.TAG_THREADS: str(torch_threads(job.point.config)),
        **arithmetic_tags(device),
        **dict(job.where),
    }
    if job.claim:
        tags[names.TAG_CLAIM] = str(job.claim)
    if resume is not None:
        tags[names.TAG_RESUMED_FROM] = str(resume["epoch"])
        tags[names.TAG_RESUMED_FROM_RUN] = resume.get("run_id", "")
    if job.adopt_run_id:
        run_id = tracker.adopt(job.adopt_run_id, job.point.name, tags)
    else:
        run_id = tracker.start_run(job.point.name, job.parent_run_id, tags)
    run_params = tracker.log_params(run_id, params_of(job), new_run=not job.adopt_run_id)
    tracker.log_data(run_id, dataset)
    return run_id, tags, run_params


def params_of(job: PointJob) -> dict:
    """What a point's run records as params: its settings and the data sizes it trained on. A key
    kept to one device type (Key.device_only: gpus_per_run on cuda) only on a run on that type."""
    params = {
        name: value
        for name, value in job.point.config.as_params().items()
        if not KEYS[name].device_only or job.device.startswith(KEYS[name].device_only)
    }
    return {
        **params,
        "train_size": job.data.train_size,
        "test_size": job.data.test_size,
        names.REPEAT: job.point.repeat,
    }


def _measured(outcome: Outcome, target: Target | None, load: contention.Contention) -> TargetTiming | None:
    """What the training measured beside its epochs, into the outcome's metrics and tags: the steady-state
    summary and end figures of its epochs (timing.logged_at_end), the machine's load (tagged contended
    when others took a meaningful share), and the time to the target (returned)."""
    outcome.measured.update({name: (value, 0) for name, value in logged_at_end(outcome.epochs).items()})
    outcome.measured.update(load.metrics())
    outcome.tags.update(load.tags())
    if target is None:
        return None
    timing = target_timing(target, outcome.epochs)
    outcome.measured.update(timing.metrics())
    outcome.tags.update(timing.tags())
    return timing


def _utilisation(outcome: Outcome, config: RunConfig, train_size: int, device: torch.device) -> None:
    """The run's arithmetic and its share of the device's peak, into the outcome's metrics and tags:
    FLOPs and bytes per epoch (flops.epoch_flops, flops.epoch_bytes at its precision), the FLOP/s of
    its steady-state epochs (their median time, timing.steady_median) and that over the device's
    matmul peak at its precision (peak.share), and the device's copy bandwidth with the share of it
    the counted bytes took where that share means something (peak.copy_share). The peak is the one
    `pipeline devices --peak` cached for this device (peak.cached): a run never measures one. Where
    there is none or it is in doubt, the run has no mfu and its TAG_PEAK says why; where it has no
    bandwidth_share, TAG_BANDWIDTH says why."""
    per_epoch = flops.epoch_flops(train_size, config.batch_size)
    outcome.measured[names.TRAIN_FLOPS] = (float(per_epoch), 0)
    moved: int | None = None
    try:
        moved = flops.epoch_bytes(train_size, config.batch_size, config.precision)
    except RuntimeError as exc:  # a torch whose make_fx cannot trace the step: the run stands without its bytes
        reason = f"no byte count: tracing the step failed ({exc.__class__.__name__}: {exc})"
        outcome.tags[names.TAG_BANDWIDTH] = reason[:500]
    else:
        outcome.measured[names.TRAIN_BYTES] = (float(moved), 0)
    epoch_s = steady_median([e.epoch_duration_s for e in outcome.epochs])
    achieved = flops.achieved_flops(per_epoch, epoch_s) if epoch_s is not None else None
    if achieved is None or epoch_s is None:
        return
    outcome.measured[names.ACHIEVED_TFLOPS] = (achieved / peak.TERA, 0)
    measured = peak.cached(device)
    if measured is None:
        outcome.tags[names.TAG_PEAK] = peak.not_measured(device)[:500]
        return
    share = peak.share(measured, config.precision, achieved)
    outcome.tags[names.TAG_PEAK] = share.note
    if share.peak_flops is not None:
        outcome.measured[names.PEAK_TFLOPS] = (share.peak_flops / peak.TERA, 0)
    if share.mfu is not None:
        outcome.measured[names.MFU] = (share.mfu, 0)
    if moved is None:
        return
    bandwidth = peak.copy_share(measured, moved, epoch_s, config.compile)
    outcome.tags[names.TAG_BANDWIDTH] = bandwidth.note
    if bandwidth.copy_bytes_per_s is not None:
        outcome.measured[names.PEAK_BANDWIDTH] = (bandwidth.copy_bytes_per_s / 1e9, 0)
    if bandwidth.share is not None:
        outcome.measured[names.BANDWIDTH_SHARE] = (bandwidth.share, 0)


def _record_result(tracker: Tracker, run_id: str, result, dataset: Dataset, hooks: _PointHooks) -> None:
    measured, outcome = hooks.outcome.measured, hooks.outcome
    run_metrics = {names.RUN_DURATION: result.duration_s, **{name: value for name, (value, _) in measured.items()}}
    steps = {name: step for name, (_, step) in measured.items()}
    tags = {k: v for k, v in outcome.tags.items() if k in MEASURED_TAGS}
    try:
        tracker.log_epochs(run_id, [], run_metrics=run_metrics, tags=tags, steps=steps)
        tracker.log_model(
            run_id,
            result.model,
            (dataset.test.images[:2].float() / 255).numpy(),
            result.final.epoch,
            params=hooks.run_params,
        )
        tracker.log_tags(run_id, {names.TAG_COMPLETE: "true"})  # last: only now is the run done (resume)
        tracker.end_run(run_id, FINISHED)
    except TrackingUnavailable as exc:
        hooks.tracking_error = exc


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the causes of `exc` (raised `from` it, or while it was
    being handled): the run was interrupted, not failed."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _killed(tracker: Tracker, run_id: str, outcome: Outcome, progress: Progress) -> None:
    outcome.status, outcome.reason = KILLED, "interrupted"
    progress.epoch_done()
    tracker.end_run(run_id, KILLED)
    progress.run_end(outcome)


def _end_failed(tracker: Tracker, run_id: str, exc: BaseException, reason: str) -> None:
    try:
        tracker.log_failure(run_id, exc, reason)
        tracker.end_run(run_id, FAILED)
    except TrackingUnavailable:
        tracker.end_run(run_id, FAILED, quick=True, reason=reason)


class _PointHooks:
    """What the training loop reports, sent to MLflow, the progress display and the checkpoint file.
    A store that stops answering does not stop training: the results go to the results file."""

    def __init__(
        self,
        tracker: Tracker,
        run_id: str,
        job: PointJob,
        dataset: Dataset,
        outcome: Outcome,
        progress: Progress,
        checkpoint: Path | None,
        run_params: dict[str, str],
    ) -> None:
        self.tracker, self.run_id, self.job, self.dataset = tracker, run_id, job, dataset
        self.run_params = run_params  # all the run's params: copied onto its model, as MLflow does
        self.outcome, self.progress, self.checkpoint = outcome, progress, checkpoint
        self.checkpointing = job.save_checkpoints and checkpoint is not None
        self.tracking_error: Exception | None = None
        self.devices = ""  # where the model's parameters live, once it is made

    def _track(self, call, *args):
        if self.tracking_error is None:
            try:
                return call(*args)
            except TrackingUnavailable as exc:
                self.tracking_error = exc
        return None

    def _log_epochs(self, epochs: list[EpochStats]) -> None:
        self._track(self.tracker.log_epochs, self.run_id, epochs)

    def model_ready(self, model) -> None:
        from pipeline.model import summary
        from pipeline.training.data import image_grid, png

        images = self.dataset.train.images[: min(self.job.point.config.batch_size, 64)]
        self.devices = ",".join(sorted({str(p.device) for p in model.parameters()}))
        self._track(
            self.tracker.log_files,
            self.run_id,
            {names.ARTIFACT_BATCH: png(image_grid(images)), names.ARTIFACT_SUMMARY: summary(model)},
        )
        if self.outcome.epochs:  # epochs restored from a checkpoint: log them again in this run
            self._log_epochs(self.outcome.epochs)

    def before_training(self, one_off: dict[str, float]) -> None:
        # The outcome keeps the tags for the results file, should the store be down.
        tags = {names.TAG_PARAM_DEVICES: self.devices}
        self.outcome.tags.update(tags)
        self._track(self.tracker.log_epochs, self.run_id, [], one_off, tags)

    def epoch_start(self, epoch: int, steps: int) -> None:
        self.progress.epoch_start(epoch, self.job.point.config.epochs, steps)

    def step(self) -> None:
        self.progress.step()

    def epoch_end(self, stats: EpochStats) -> None:
        self.outcome.epochs.append(stats)
        self._log_epochs([stats])
        self.progress.epoch_end(stats, self.job.point.config.epochs)

    def save_state(self, state: dict) -> None:
        import torch

        if self.checkpoint is None:  # then checkpointing is False, and fit never calls this
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with replacing(self.checkpoint) as temporary:  # an interrupted write never spoils the last good one
            torch.save({**state, "run_id": self.run_id}, temporary)


def _load_checkpoint(path: Path | None) -> dict | None:
    import torch

    if path is None or not path.exists():
        return None
    try:
        # On the CPU: the sampler's generator state must stay a CPU tensor, and load_state_dict
        # moves weights and optimizer moments to the run's device itself.
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a damaged checkpoint costs a restart, not the run
        return None


def _failure_reason(exc: BaseException, batch_size: int) -> str:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return (
            f"CUDA out of memory at batch_size {batch_size}: lower batch_size (or free the GPU) "
            f"and run again ({str(exc).splitlines()[0][:200]})"
        )
    return f"{exc.__class__.__name__}: {exc}"


# CUDA errors after which every later CUDA call in the process fails the same way.
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "illegal instruction",
    "misaligned address",
    "uncorrectable ECC",
)


def cuda_context_lost(exc: BaseException) -> bool:
    """Whether `exc` left this process's CUDA context unusable (unlike out-of-memory, which is not)."""
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in STICKY_CUDA_ERRORS)


def _free_device_memory(device: torch.device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def with_position(job: PointJob, index: int, total: int) -> PointJob:
    return dataclasses.replace(job, position=(index, total))
