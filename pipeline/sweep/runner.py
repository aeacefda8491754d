"""A sweep's story: plan, skip what is done, open the parent, run the jobs, close the parent, compare, summarise.

Bad input (grid, device with --require-devices, data, tracking store, Ray) raises UserError before
any MLflow run or experiment exists. Points that already have a FINISHED run with the same run key
(settings, data, host, hardware; a repeat past the first; a target it stops at) are DONE unless
--rerun. With `repeats: N` each point is planned N times, interleaved. With `repeats: auto` the first
MIN_RUNS rounds are planned so, and after them one round at a time until rounds.py says the speedups are
clear (or there is nothing to judge, or max_repeats). Each point is a `PointJob` that an executor runs
through `point.run_point`; what happens inside one run is that function's concern.
Every trained point is also appended to the local results file, so a tracking outage loses no
training. Ctrl-C, SIGTERM or SIGHUP marks the current run and the parent KILLED; a second one exits at once.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.base import interrupts
from pipeline.base.files import check_writable, free_bytes
from pipeline.base.names import (
    ARTIFACT_EFFECTIVE_GRID,
    ARTIFACT_GRID_DIR,
    BEST_FINAL_ACCURACY,
    BEST_STEADY_EPOCH,
    CHECKPOINT_DIR,
    EPOCH_METRICS,
    FINAL_ACCURACY,
    FINISHED_RUNS,
    ROUNDS,
    RUN_DURATION,
    STEADY_EPOCH,
    STEADY_IMAGES,
    TAG_DEVICE,
    TAG_ERROR,
    TAG_GRID_FILE,
    TAG_GRID_SIZE,
    TAG_OPTIONS,
    TAG_OVERRIDES,
    TAG_REPEATS_STOPPED,
    TAG_ROLE,
    TAG_TARGET,
    experiment_name_problem,
)
from pipeline.base.runs import RunRecord, SweepRecord
from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.execution.executors import Executor, LocalExecutor, open_executor, plan
from pipeline.execution.outcomes import (
    DONE,
    FAILED,
    FINISHED,
    KILLED,
    NOT_RUN,
    SKIPPED,
    UNLOGGED,
    Outcome,
    Planned,
    SweepResult,
)
from pipeline.execution.point import DataRef, PointJob, params_of, with_position
from pipeline.measures.contention import contended_share
from pipeline.measures.timing import histories_of, steady_mean, summary, summary_line
from pipeline.settings.config import AUTO, DEFAULTS, GridSpec, RunConfig, effective_yaml, with_repeats
from pipeline.settings.grid import (
    MAX_POINTS,
    SHOWN_POINTS,
    GridPoint,
    check_size,
    config_hash,
    expand,
    grid_size,
    round_points,
    run_count,
    single_name,
)
from pipeline.tracking import claims, results
from pipeline.tracking.liveness import kill_running_children, reap_orphans
from pipeline.tracking.records import (
    done_tags,
    experiment_id_of,
    finished_by_key,
    history,
    read_sweep,
    record,
    sweep_names,
)
from pipeline.tracking.store import (
    NO_ROOM_ERRNOS,
    absolute_store_uri,
    check_reachable,
    check_writable_store,
    first_line,
    local_state_dir,
    open_client,
    resolve_tracking_uri,
    sqlite_path,
    store_failure,
)
from pipeline.tracking.tracker import Tracker, check_new_artifact_folder, param_str
from pipeline.training import idx

if TYPE_CHECKING:
    from pipeline.analysis.compare import CompareOptions, Comparison
    from pipeline.measures.target import Target
    from pipeline.present.report import Reporter
    from pipeline.training.data import Dataset


CLAIM_POLL_S = 2.0  # how often a sweep looks again at the points another process trains


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
    register: str | None = None  # the CLI registers the best run under this name afterwards
    max_points: int = MAX_POINTS  # a bigger sweep (points x repeats) is refused (a dry run shows its first runs)
    repeats: int | str | None = None  # --repeats N or auto: overrides the grid file's `repeats`
    train_size: int | None = None  # `pipeline train --train-size`: the first N training images (a grid has data:)
    test_size: int | None = None  # `pipeline train --test-size`

    def flags(self) -> str:
        """The sweep-wide options that were set, as flags (the parent run's tag, not params:
        no child has them)."""
        set_ = [
            f"--{name.replace('_', '-')}"
            for name in ("system_metrics", "rerun", "fail_fast", "checkpoint")
            if getattr(self, name)
        ]
        set_ += [f"--executor {self.executor}"] if self.executor != "local" else []
        set_ += [f"--register {self.register}"] if self.register else []
        set_ += [f"--repeats {self.repeats}"] if self.repeats is not None else []
        return " ".join(set_)


@dataclass(frozen=True)
class _Sweep:
    """What every step of one invocation shares."""

    tracker: Tracker
    reporter: Reporter
    options: Options
    data: DataRef
    identity: dict
    state_dir: Path
    project_run: str | None = None  # `mlflow run`'s project run, when the runs go into it (its experiment)

    def job(
        self,
        item: Planned,
        parent_id: str | None,
        adopt: str | None = None,
        target: Target | None = None,
        stop_at: Target | None = None,
        claim: int = 0,
    ) -> PointJob:
        checkpoint = self.state_dir / CHECKPOINT_DIR / f"{item.run_key}.pt"
        return PointJob(
            point=item.point,
            device=str(item.device),
            run_key=item.run_key,
            tracking_uri=self.tracker.uri,
            experiment_id=self.tracker.experiment_id,
            experiment_name=self.tracker.experiment_name,
            data=self.data,
            parent_run_id=parent_id,
            adopt_run_id=adopt,
            checkpoint=str(checkpoint),
            save_checkpoints=self.options.checkpoint,
            resume=self.options.checkpoint and not self.options.rerun,
            system_metrics=self.options.system_metrics,
            target=target,
            stop_at=stop_at,
            claim=claim,
        )


def run_key(config: RunConfig, identity: dict, hardware: str, repeat: int = 1, stop_at: Target | None = None) -> str:
    """A point's identity: its settings, the data, and where it was measured (host, hardware).
    The same settings timed on another machine are a different measurement, not a duplicate.
    A repeat past the first, and a target the run stops at, join it only when there is one: repeat
    1 of any sweep keeps the key its point had before repeats existed (raising `repeats` trains only
    the new repeats), and a target that only times runs changes nothing that is trained."""
    extra: dict = {}
    if repeat > 1:
        extra["repeat"] = repeat
    if stop_at is not None:
        extra["stop_at_target"] = {"metric": stop_at.metric, "threshold": stop_at.threshold}
    return config_hash(config, **identity, host=socket.gethostname(), hardware=hardware, **extra)


def run_grid(
    spec: GridSpec, reporter: Reporter, options: Options = Options(), executor: Executor | None = None
) -> SweepResult:
    """Train every point of `spec` under one parent run; returns what happened to each point."""
    if options.repeats is not None:
        spec = with_repeats(spec, options.repeats)
    if options.ray_address and options.executor != "ray":
        raise UserError(f"--ray-address {options.ray_address} needs --executor ray; add it, or drop --ray-address")
    if not options.dry_run:
        check_size(spec, options.max_points)
    # A dry run of a grid too big to run plans its first points only (and says the run would refuse).
    points = expand(spec, limit=SHOWN_POINTS if run_count(spec) > options.max_points else None)
    options = replace(options, checkpoint=options.checkpoint or spec.checkpoint)
    # Before planning, which imports torch (seconds): a store, folder or data folder that cannot be
    # used is one line at once.
    store = None if options.dry_run else _check_inputs(options, options.data_dir or spec.data.root)
    return _run_grid(spec, plan(points), reporter, options, executor, store)


def _run_grid(
    spec: GridSpec,
    planned: list[Planned],
    reporter: Reporter,
    options: Options,
    executor: Executor | None,
    store: tuple[str, Any] | None,
) -> SweepResult:
    from pipeline.training import data as data_mod  # torch (seconds): after the inputs are checked

    if options.require_devices:
        _require_devices(planned)
    if options.dry_run or store is None:
        return _dry_run(spec, planned, reporter, options)
    uri, client = store
    dataset = data_mod.load(options.data_dir or spec.data.root, spec.data.train_size, spec.data.test_size)
    reporter.data(dataset.description)
    executor = executor or open_executor(options.executor, options.ray_address, uri, reporter)
    try:  # Ray is up (or refused) before the experiment exists: a failed start leaves nothing behind
        sweep = _open_sweep(uri, client, options.experiment or spec.experiment, dataset, reporter, options)
        if sweep.project_run and options.experiment is None and spec.experiment != sweep.tracker.experiment_name:
            reporter.note(
                f"under `mlflow run` the runs go to the project run's experiment "
                f"{sweep.tracker.experiment_name!r} (pass --experiment-name to `mlflow run` to choose it)"
            )
        return _run_sweep(sweep, spec, executor.plan(planned), executor)
    finally:
        executor.close()


def run_single(config: RunConfig, reporter: Reporter, options: Options = Options()) -> SweepResult:
    """One run (`pipeline train`): a top-level run, or the `mlflow run` project run itself.
    It always trains: it is one explicit run, not a point of a sweep that may be done."""
    uri, client = _check_inputs(options, options.data_dir)  # at once, before planning imports torch
    (item,) = plan([GridPoint(1, config, single_name(config))])
    if item.device is None:
        from pipeline.training.device import DeviceUnavailable, resolve  # torch (seconds): after the inputs are checked

        try:
            resolve(config.device)
        except DeviceUnavailable:  # the device itself is missing
            raise UserError(f"--device {config.device}: {item.reason}; use --device cpu or auto") from None
        raise UserError(f"pipeline train: {item.reason}")  # a setting this device cannot run
    from pipeline.training import data as data_mod  # torch (seconds): after the inputs are checked

    dataset = data_mod.load(options.data_dir, options.train_size, options.test_size)
    reporter.data(dataset.description)
    sweep = _open_sweep(uri, client, options.experiment or "train", dataset, reporter, options)
    _assign_run_keys([item], sweep.identity)
    job = sweep.job(item, parent_id=None, adopt=sweep.project_run)
    with interrupts.handled():
        (outcome,) = LocalExecutor(reporter).run([job], lambda job, outcome: _keep(sweep, job, outcome))
    result = SweepResult([outcome], sweep.tracker.experiment_id, None, sweep.tracker.uri)
    # Its table shows the settings given that differ from the defaults (and the device), as a grid's
    # shows the keys it varies: all fifteen cut every header to a letter.
    given = tuple((k, (v,)) for k, v in config.as_params().items() if v != DEFAULTS[k])
    _summary(reporter, given, result, sweep.tracker)
    return result


# --- the steps --------------------------------------------------------------------------------------


def _summary(
    reporter: Reporter,
    axes: Sequence[tuple[str, tuple]],
    result: SweepResult,
    tracker: Tracker,
    comparison: Comparison | None = None,
) -> None:
    """The sweep's end on the reporter's console (Verdict.summary): the verdict, a row per run, what
    failed and why, and the UI's link."""
    from pipeline.present.verdict import Verdict  # pandas and scipy (2 s): only once the sweep is over

    Verdict(reporter.console).summary(axes, result, tracker.ui(), comparison)


def _check_inputs(options: Options, data_root: str | None) -> tuple[str, Any]:
    """Fail in a second on a store that cannot be used, a folder the sweep cannot write, or no
    Fashion-MNIST where it is looked for: before torch is imported and before the data is decoded.
    Returns the store's URI and its client (None for sqlite: opened once the data is loaded)."""
    contended_share()  # a bad $PIPELINE_CONTENDED_SHARE is one line before anything trains
    if options.experiment is not None and experiment_name_problem(options.experiment):
        raise UserError(f"--experiment: {experiment_name_problem(options.experiment)}")
    uri, client = absolute_store_uri(resolve_tracking_uri(options.tracking_uri)), None
    if (path := sqlite_path(uri)) is not None:
        check_reachable(uri)  # its folder exists; the file itself is only created once data is found
        check_writable_store(uri, path)  # ... and can be: a read-only folder fails here, at once
        if not path.exists():  # a new store, so a new experiment: its artifacts go to ./mlruns
            check_new_artifact_folder()
    else:
        client = open_client(uri)
    _check_folders(uri, options.checkpoint)
    idx.locate(data_root)  # the data is there (decoding and verifying it comes with loading)
    return uri, client


def _check_folders(uri: str, checkpoint: bool) -> None:
    """The folders a sweep writes into besides the store, checked before anything trains (a
    checkpoint folder that is a file made every point train, then fail): the results file's, where
    every trained point is kept, and with --checkpoint the checkpoints'."""
    state_dir = local_state_dir(uri)
    where = "beside the store" if sqlite_path(uri) is not None else "in the working folder"
    results_file = results.path_in(state_dir)
    check_writable(
        state_dir,
        "the results folder",
        f"the sweep keeps {results_file.name} {where}: make it "
        "writable, or use a store (or working folder) you can write in",
    )
    if results_file.exists() and not results_file.is_file():
        raise UserError(
            f"the results file {results_file}: not a file; move it away (the sweep appends a line "
            "per trained point to it)"
        )
    if checkpoint:
        check_writable(
            state_dir / CHECKPOINT_DIR,
            "the checkpoint folder",
            f"move what is there away (the sweep keeps checkpoints {where}), or run without --checkpoint",
        )


# What one run adds, measured (du) on sweeps of 1- and 3-epoch points on generated data: about 0.32
# MB of artifacts (the logged model and its examples most of it, the sweep's charts shared out) and
# 30-40 KB in a sqlite store, growing with the epochs' metrics. Deliberately modest: the check
# refuses only a sweep that clearly cannot fit.
ARTIFACT_BYTES_PER_RUN = 300_000
STORE_BYTES_PER_RUN = 50_000


def _check_free_space(uri: str, artifact_location: str | None, runs: int) -> None:
    """UserError when `runs` runs clearly cannot fit in the free space of a sqlite store's folder
    and of a local artifact folder (together when they share a file system). Nothing is said where
    it cannot be estimated: a server's store, remote artifacts."""
    store = sqlite_path(uri)
    if store is None:
        return
    needs = [(store.parent, runs * STORE_BYTES_PER_RUN)]
    artifacts = _local_folder(artifact_location)
    if artifacts is not None:
        needs.append((artifacts, runs * ARTIFACT_BYTES_PER_RUN))
    by_device: dict[int, list] = {}
    for folder, need in needs:
        found = free_bytes(folder)
        if found is not None:
            _, device, free = found
            by_device.setdefault(device, [folder, 0, free])[1] += need
    for folder, need, free in by_device.values():
        if need > free:
            raise UserError(
                f"{folder}: {runs} run(s) to train need about {need / 1e6:,.1f} MB there and "
                f"{free / 1e6:,.1f} MB is free; free some space, or train fewer points"
            )


def _check_artifact_folder(location: str | None) -> None:
    """UserError when an experiment's local artifact location cannot be written (a read-only mount,
    a folder that is a file), before any run: every run's model and charts go there. (A new
    experiment's folder is checked before it is created: tracker._experiment_id.)"""
    folder = _local_folder(location)
    if folder is not None:
        check_writable(
            folder,
            "the experiment's artifact folder",
            "its runs' models and charts go there: make it a folder you can write in, or name a new "
            "--experiment (one MLflow creates keeps them in ./mlruns where the command runs)",
        )


def _artifact_location(tracker: Tracker) -> str | None:
    return tracker.client.get_experiment(tracker.experiment_id).artifact_location


def _local_folder(location: str | None) -> Path | None:
    """The folder of a local artifact location (a path or a file: URI), else None."""
    import urllib.parse
    import urllib.request

    if not location:
        return None
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    return Path(location) if parsed.scheme == "" else None


def _open_sweep(uri: str, client, experiment: str, dataset: Dataset, reporter: Reporter, options: Options) -> _Sweep:
    project_run = _project_run_id()
    if project_run and options.experiment is not None:
        client = client or open_client(uri)
        project_run = _project_run(client, project_run, options.experiment, reporter)
    tracker = Tracker.open(uri, experiment, project_run, client)
    _reap(tracker, reporter)
    data = DataRef(str(dataset.folder), len(dataset.train), len(dataset.test))
    return _Sweep(tracker, reporter, options, data, dataset.identity, local_state_dir(uri), project_run)


def _reap(tracker: Tracker, reporter: Reporter) -> None:
    """Mark KILLED, and say so, the runs left RUNNING by processes of this host that are gone."""
    reaped = reap_orphans(tracker.client, tracker.experiment_id, spare=_project_run_id())
    if reaped:
        reporter.note(
            f"marked {len(reaped)} run(s) KILLED whose process ended without closing them: {', '.join(reaped)}"
        )


def _project_run(client, project_run: str, experiment: str, reporter: Reporter) -> str | None:
    """`mlflow run`'s project run where the runs go into it (as the sweep's parent, or as `train`'s
    run), else None. An experiment named explicitly (`-P experiment=NAME`) wins over the project run's own
    (where `mlflow run --experiment-name` put it): the runs then go to NAME, and the project run,
    which cannot move, is left a note that points there."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    try:
        own = client.get_experiment(client.get_run(project_run).info.experiment_id).name
        if own == experiment:
            return project_run
        client.set_tag(
            project_run,
            MLFLOW_RUN_NOTE,
            f"This `mlflow run` asked for experiment `{experiment}`: its runs are there, not in `{own}`.",
        )
    except MlflowException as exc:
        raise store_failure(exc, client.tracking_uri) from None
    reporter.note(
        f"experiment {experiment!r}: the runs go there; `mlflow run`'s own run stays in {own!r} "
        f"with a note that points there (`mlflow run --experiment-name {experiment}` keeps them together)"
    )
    return None


def _run_sweep(sweep: _Sweep, spec: GridSpec, planned: list[Planned], executor: Executor) -> SweepResult:
    """Train `planned`; with `repeats: auto`, then one round more at a time until rounds.judge says
    stop; then close the parent, record the comparison and print the summary."""
    tracker, reporter = sweep.tracker, sweep.reporter
    parent = _Parent(sweep, spec)
    finished = _Finished(sweep)
    outcomes: list[Outcome] = []
    batch, reached, stopped = planned, spec.repeats, ""
    try:
        with interrupts.handled(), interrupts.last_resort(parent.end_quickly):
            while True:
                latest = _train(sweep, spec, batch, executor, parent, finished)
                outcomes += latest
                if not spec.auto_repeats:
                    break
                stopped = _rounds_stop(sweep, spec, parent.run_id, latest, outcomes, reached, finished)
                if stopped:
                    break
                reached += 1
                batch = _round(planned, spec, reached)
    except KeyboardInterrupt:
        parent.cancelled()
        raise
    except BaseException as exc:  # one the sweep did not plan for: the parent ends FAILED, not RUNNING
        parent.crashed(exc)
        raise
    parent_id = parent.run_id
    result = SweepResult(outcomes, tracker.experiment_id, parent_id, tracker.uri, stopped=stopped)
    store_down = any(o.store_down for o in outcomes)
    if store_down:
        why = next(o.reason for o in outcomes if o.store_down)
        reporter.tracking_down(results.path_in(sweep.state_dir), why, any(o.no_room for o in outcomes))
        if parent_id and not parent.adopted:  # one try: a store whose artifacts' disk filled still answers
            tracker.end_run(parent_id, FAILED, quick=True, reason=f"the sweep stopped: {why}")
    comparison = None
    if parent_id and not store_down:
        if stopped:
            _log_rounds(tracker, parent_id, reporter, stopped, reached)
        comparison = _log_comparison(tracker, parent_id, reporter, spec, result.outcomes, reached)
        _log_sweep_summary(tracker, parent_id, reporter, result.outcomes, comparison)
        if not parent.adopted:  # `mlflow run` ends its own run from our exit code
            if result.exit_code:
                tracker.log_tags(parent_id, {TAG_ERROR: _why_failed(result)})
            tracker.end_run(parent_id, FAILED if result.exit_code else FINISHED)
    elif parent.done and not store_down:  # every point DONE: their comparison, and nothing written
        try:
            comparison = _judged_comparison(sweep, spec, None, outcomes, finished, reached)
        except Exception as exc:  # like the report: a comparison must never cost the user their sweep
            reporter.note(f"could not compare the DONE runs ({exc.__class__.__name__}: {exc})")
    result.comparison = comparison
    _summary(reporter, spec.axes, result, tracker, comparison)
    return result


def _train(
    sweep: _Sweep, spec: GridSpec, batch: list[Planned], executor: Executor, parent: _Parent, finished: _Finished
) -> list[Outcome]:
    """Train `batch` (the sweep's planned runs, or one more round of them) under the parent, opened
    by the first run that trains; the DONE ones and those waiting for relog are skipped. Each point
    is claimed first (tracking/claims.py): one that another live process holds is waited for and
    counted DONE once it finishes, or trained here if that process ends without finishing it. One
    outcome per planned run, in order."""
    _assign_run_keys(batch, sweep.identity, spec.stop_at)
    outcomes = _already_done(sweep, batch, finished.by_key)
    todo = [p for p in batch if p.device is not None and p.point.index not in outcomes]
    parent.count_done([o.run_id for o in outcomes.values() if o.status == DONE and o.run_id])
    waiting: list[tuple[Planned, claims.Holder]] = []
    said = False  # the waiting note, once
    while todo or waiting:
        if todo:
            if parent.run_id is None:  # before the sweep's first run exists
                location = _artifact_location(sweep.tracker)
                _check_artifact_folder(location)
                _check_free_space(sweep.tracker.uri, location, len(todo))
            ours, held = _claim(sweep, spec, parent.open(), todo, finished)
            outcomes.update(ours.done)
            parent.count_done([o.run_id for o in ours.done.values() if o.run_id])
            if ours.jobs:
                ran = executor.run(ours.jobs, lambda job, outcome: _keep(sweep, job, outcome))
                outcomes.update({job.point.index: outcome for job, outcome in zip(ours.jobs, ran)})
            waiting, todo = held, []
            continue
        if not said:
            holders = ", ".join(sorted({str(holder) for _, holder in waiting}))
            sweep.reporter.note(
                f"{len(waiting)} point(s) are being trained by another process ({holders}): waiting for them, "
                "to count their runs here (a point that process leaves unfinished is trained here); "
                "Ctrl-C stops waiting"
            )
            said = True
        time.sleep(CLAIM_POLL_S)
        _reap(sweep.tracker, sweep.reporter)  # a holder that died leaves its runs RUNNING
        finished.refresh()
        done = _finished_outcomes(sweep.tracker.client, [item for item, _ in waiting], finished.by_key)
        outcomes.update(done)
        parent.count_done([o.run_id for o in done.values() if o.run_id])
        todo, waiting = [item for item, _ in waiting if item.point.index not in done], []  # claimed again
    for item in batch:
        if item.device is None:
            outcomes[item.point.index] = Outcome(item.point, SKIPPED, reason=item.reason)
    return [outcomes[p.point.index] for p in batch]


@dataclass
class _Claimed:
    jobs: list[PointJob]  # the points this process now holds, to train
    done: dict[int, Outcome]  # points claimed again that another process FINISHED meanwhile


def _claim(
    sweep: _Sweep, spec: GridSpec, parent_id: str, todo: list[Planned], finished: _Finished
) -> tuple[_Claimed, list[tuple[Planned, claims.Holder]]]:
    """Claim each point of `todo` for this sweep: the jobs of those it now holds, and the points
    another live process holds with that process. A point claimed at a later attempt (an earlier
    one's process or run has ended) may have FINISHED since this sweep looked: it is DONE then."""
    client, experiment_id = sweep.tracker.client, sweep.tracker.experiment_id
    ours: list[tuple[Planned, int]] = []
    held: list[tuple[Planned, claims.Holder]] = []
    for item in todo:
        got = claims.claim(client, experiment_id, item.run_key, parent_id)
        if isinstance(got, claims.Holder):
            held.append((item, got))
        else:
            ours.append((item, got))
    done: dict[int, Outcome] = {}
    if any(attempt > 1 for _, attempt in ours):
        finished.refresh()
        done = _finished_outcomes(client, [item for item, _ in ours], finished.by_key)
    mine = [(item, attempt) for item, attempt in ours if item.point.index not in done]
    jobs = [
        with_position(sweep.job(item, parent_id, target=spec.target, stop_at=spec.stop_at, claim=attempt), n, len(mine))
        for n, (item, attempt) in enumerate(mine, start=1)
    ]
    return _Claimed(jobs, done), held


class _Finished:
    """The experiment's runs FINISHED before this sweep (none with --rerun), by run key: read at the
    start, and again where another process may have finished a point (claims). `repeats: auto`
    judges the DONE ones with the rest, each read back once (`record`)."""

    def __init__(self, sweep: _Sweep) -> None:
        self.client = sweep.tracker.client
        self.experiment_id, self.rerun = sweep.tracker.experiment_id, sweep.options.rerun
        self._by_id: dict = {}
        self._records: dict = {}
        self.refresh()

    def refresh(self) -> None:
        self.by_key = {} if self.rerun else finished_by_key(self.client, self.experiment_id)
        self._by_id.update({run.info.run_id: run for run in self.by_key.values()})

    def record(self, run_id: str) -> RunRecord:
        """A DONE run as the comparison reads it, its histories read back the first time it is asked for."""
        from pipeline.analysis.compare import HISTORIES  # pandas, scipy (seconds): after the inputs are checked

        if run_id not in self._records:
            self._records[run_id] = record(self.client, self._by_id[run_id], HISTORIES)
        return self._records[run_id]


def _already_done(sweep: _Sweep, planned: list[Planned], finished: dict) -> dict[int, Outcome]:
    """Outcomes of the points not to train: FINISHED before with the same run key (DONE; `finished`
    is empty with --rerun), or trained during an outage and waiting in the results file for
    `pipeline relog`."""
    waiting = results.unlogged_keys(sweep.state_dir, sweep.tracker.uri)
    done = _finished_outcomes(sweep.tracker.client, [p for p in planned if p.run_key not in waiting], finished)
    for item in planned:
        if item.device is not None and item.run_key in waiting:
            done[item.point.index] = Outcome(
                item.point,
                UNLOGGED,
                reason=f"trained before, waiting in {results.path_in(sweep.state_dir)}: run `pipeline relog`",
            )
    count = sum(o.status == DONE for o in done.values())
    if count:
        sweep.reporter.note(
            f"{count} of {len(planned)} points already have a FINISHED run here "
            "(same settings, data, host and hardware): skipped; --rerun trains them again"
        )
    return done


# --- repeats: auto ------------------------------------------------------------------------------------


def _round(planned: list[Planned], spec: GridSpec, repeat: int) -> list[Planned]:
    """Round `repeat` of the sweep, planned as its first round was (the same devices, or the same
    reasons to skip), each run to get its own run key."""
    first = planned[: grid_size(spec)]
    return [replace(item, point=point, run_key="") for item, point in zip(first, round_points(spec, repeat))]


def _rounds_stop(
    sweep: _Sweep,
    spec: GridSpec,
    parent_id: str | None,
    latest: list[Outcome],
    outcomes: list[Outcome],
    reached: int,
    finished: _Finished,
) -> str:
    """`repeats: auto` after round `reached` (`latest`: its outcomes, the first rounds' together):
    why the rounds stop, as the sweep's end says it, or '' to train one more round (its line printed).
    A round that was cut short (--fail-fast, a store outage) or in which no run finished stops them,
    so that failing runs never loop."""
    from pipeline.analysis import rounds  # pandas, scipy (seconds): after the inputs are checked
    from pipeline.present.sentences import round_progress, rounds_stopped, stop_reason

    if any(o.store_down for o in latest):
        full = any(o.no_room for o in latest)
        return rounds_stopped(
            reached, "a disk the sweep writes to is full" if full else "the tracking store stopped answering"
        )
    halted = next((o.reason for o in latest if o.status == NOT_RUN), "")
    if halted:
        return rounds_stopped(reached, halted)
    if not any(o.status in (FINISHED, DONE) for o in latest):
        which = f"round {reached}" if reached > spec.repeats else f"rounds 1-{reached}"
        return rounds_stopped(reached, f"no run of {which} finished")
    try:
        comparison = _judged_comparison(sweep, spec, parent_id, outcomes, finished, reached)
        judgement = rounds.judge(comparison, spec.axes, spec.half_width)
    except Exception as exc:  # like the comparison's report: judging must never cost the user their sweep
        return rounds_stopped(reached, f"could not judge the speedups ({exc.__class__.__name__}: {exc})")
    reason = stop_reason(judgement, reached, spec)
    if reason:
        return rounds_stopped(reached, reason)
    sweep.reporter.round_done(round_progress(judgement, reached, spec))
    return ""


def _judged_comparison(
    sweep: _Sweep, spec: GridSpec, parent_id: str | None, outcomes: list[Outcome], finished: _Finished, reached: int
) -> Comparison:
    """The sweep's comparison after round `reached`, as `repeats: auto` judges it: the parent's runs
    (those it trained and the DONE ones it counts), built as _log_comparison builds it (the epochs
    this process logged, not read back, and the design's confidence at that round), so that a rerun
    reaches the rounds the first sweep did. Where every run so far was DONE (no parent), those runs."""
    from pipeline.analysis.compare import build  # pandas, scipy (seconds): after the inputs are checked

    tracker = sweep.tracker
    if parent_id is None:  # every run so far was DONE: no parent yet
        done = [finished.record(o.run_id) for o in outcomes if o.status == DONE and o.run_id]
        earlier = sweep_names(tracker.client, {run.parent_run_id for run in done})
        return build(
            SweepRecord("", spec.path.stem, tracker.experiment_id, tracker.experiment_name, done, earlier=earlier),
            _compare_options(spec, reached),
        )
    return _own_comparison(tracker, parent_id, outcomes, spec, reached)


def _own_comparison(
    tracker: Tracker, parent_id: str, outcomes, spec: GridSpec, reached: int, charted: tuple[str, ...] = ()
) -> Comparison:
    """The sweep's comparison as the sweep itself builds it, while its parent is still open: its runs
    read back (those it trained and the DONE ones it counts) with the epochs this process logged
    (`charted`: the histories a chart draws), at round `reached`'s confidence, and whole: the sweep
    is judging or publishing itself, not still running."""
    from pipeline.analysis.compare import HISTORIES, build  # pandas, scipy (seconds): after the inputs are checked

    wanted = charted or HISTORIES
    known = {o.run_id: histories_of(o.epochs, wanted) for o in outcomes if o.status == FINISHED and o.run_id}
    counted = read_sweep(tracker.client, parent_run_id=parent_id, histories=HISTORIES, known=known, charted=charted)
    return build(replace(counted, status=FINISHED), _compare_options(spec, reached))


def _compare_options(spec: GridSpec, reached: int) -> CompareOptions:
    """How a sweep compares its own runs: against its grid's target and quality margin, and with
    `repeats: auto` at its sequential design's confidence for round `reached`."""
    from pipeline.analysis.compare import CompareOptions  # pandas, scipy (seconds): after the inputs are checked

    return CompareOptions(
        target=str(spec.target) if spec.target else None,
        quality_margin=spec.quality_margin,
        rounds=(reached, spec.most_repeats) if spec.auto_repeats else None,
    )


def _log_rounds(tracker: Tracker, parent_id: str, reporter: Reporter, stopped: str, reached: int) -> None:
    """Why a `repeats: auto` sweep stopped (names.TAG_REPEATS_STOPPED) and the rounds it reached
    (names.ROUNDS), on its parent run."""
    try:
        tracker.log_epochs(parent_id, [], run_metrics={ROUNDS: reached}, tags={TAG_REPEATS_STOPPED: stopped[:5000]})
    except Exception as exc:  # like the summary: a record must never cost the user their sweep
        reporter.note(f"could not record why the rounds stopped on the parent run ({exc.__class__.__name__}: {exc})")


class _Parent:
    """The sweep's parent run, opened when the first run is about to train (a sweep whose runs are
    all DONE has none): `mlflow run`'s project run when there is one (adopted), else a new run."""

    def __init__(self, sweep: _Sweep, spec: GridSpec) -> None:
        self.sweep, self.spec = sweep, spec
        self.run_id: str | None = None
        self.adopted = False
        self.done: list[str] = []  # the DONE runs it counts for the points it skips (records.done_tags)
        self._recorded: dict[str, str] = {}  # the done tags on the parent so far: only a changed one is written

    def count_done(self, run_ids: list[str]) -> None:
        """Count the DONE runs `run_ids` as the sweep's own in its comparison: recorded on the parent
        (names.TAG_DONE_RUNS) once it is open, so that every later read of the sweep finds them."""
        self.done += [run_id for run_id in run_ids if run_id not in self.done]
        self._record_done()

    def _record_done(self) -> None:
        """The parent's done tags, once it is open: only those that changed (the last chunk grows)."""
        wanted = done_tags(self.done)
        changed = {key: value for key, value in wanted.items() if self._recorded.get(key) != value}
        if self.run_id is not None and changed:
            self.sweep.tracker.log_tags(self.run_id, changed)
            self._recorded.update(changed)

    def open(self) -> str:
        """The parent's id, opening it first when it is not open yet."""
        if self.run_id is not None:
            return self.run_id
        sweep, spec = self.sweep, self.spec
        tracker = sweep.tracker
        name = f"{spec.path.stem} {datetime.now():%Y-%m-%d %H:%M:%S}"
        tags = {
            TAG_ROLE: "sweep",
            TAG_GRID_FILE: str(spec.path) if spec.from_file else "(a mapping: pipeline.api)",
            TAG_GRID_SIZE: str(run_count(spec)),
            TAG_OPTIONS: sweep.options.flags() or "none",
        }
        if spec.target is not None:
            tags[TAG_TARGET] = str(spec.target)
        if spec.overrides:
            tags[TAG_OVERRIDES] = " ".join(f"--set {shlex.quote(item)}" for item in spec.overrides)
        project_run = sweep.project_run
        self.adopted = bool(project_run)
        # Kept as soon as the run exists, so that a Ctrl-C while it is filled in still closes it.
        self.run_id = tracker.adopt(project_run, name, tags) if project_run else tracker.start_run(name, tags=tags)
        tracker.log_params(self.run_id, sweep_params(spec), new_run=not project_run)
        files = {}
        if spec.from_file:
            with contextlib.suppress(OSError):
                files[f"{ARTIFACT_GRID_DIR}/{spec.path.name}"] = spec.path.read_text(encoding="utf-8")
        # The grid it trains, after any --set: what the report's "run it again" commands download.
        files[ARTIFACT_EFFECTIVE_GRID] = effective_yaml(spec)
        tracker.log_files(self.run_id, files)
        self._record_done()
        sweep.reporter.sweep_start(tracker.experiment_name, tracker.experiment_id, tracker.uri, self.run_id, spec)
        return self.run_id

    def end_quickly(self) -> None:
        """A second Ctrl-C: one quick attempt to mark the parent KILLED."""
        if self.run_id is not None:
            self.sweep.tracker.end_run(self.run_id, KILLED, quick=True)

    def crashed(self, exc: BaseException) -> None:
        """An error nothing planned for (a bug, an output that cannot be written): one quick try to
        mark the children still running KILLED and the parent FAILED with it, before it goes on up."""
        if self.run_id is None:
            return
        tracker = self.sweep.tracker
        reason = f"the sweep stopped on {type(exc).__name__}: {first_line(exc)}"[:5000]  # a tag holds 8000
        with contextlib.suppress(Exception):
            kill_running_children(tracker.client.once, tracker.experiment_id, self.run_id, reason)
        if not self.adopted:  # `mlflow run` ends its own run FAILED when the command fails
            tracker.end_run(self.run_id, FAILED, quick=True, reason=reason)

    def cancelled(self) -> None:
        """Ctrl-C: the children still running and the parent are KILLED."""
        if self.run_id is None:
            return

        tracker = self.sweep.tracker
        kill_running_children(tracker.client, tracker.experiment_id, self.run_id, "cancelled by Ctrl-C on the driver")
        tracker.end_run(self.run_id, KILLED)


def sweep_params(spec: GridSpec) -> dict[str, str]:
    """A parent run's params: each grid key's values as its children log them, comma-separated
    ("1000,10000"), the repeats (after --repeats) and the target when there is one."""
    params = {key: ",".join(param_str(v) for v in values) for key, values in spec.axes}
    params = {key: _fit_param(value) for key, value in params.items()}
    params["repeats"] = AUTO if spec.auto_repeats else str(spec.repeats)
    if spec.auto_repeats:
        params["max_repeats"] = str(spec.max_repeats)
        if spec.half_width is not None:
            params["half_width"] = f"{spec.half_width:g}"
    params["quality_margin"] = f"{spec.quality_margin:g}"
    if spec.target is not None:
        params["target"] = str(spec.target)
    return params


MAX_PARAM_CHARS = 6000  # MLflow's limit on a param's value


def _fit_param(value: str) -> str:
    """A grid key's values within MLflow's limit: a key with thousands of values keeps its first ones."""
    return value if len(value) <= MAX_PARAM_CHARS else value[: MAX_PARAM_CHARS - 20].rsplit(",", 1)[0] + ",... (cut)"


def _log_sweep_summary(
    tracker: Tracker, parent_id: str, reporter: Reporter, outcomes: Sequence[Outcome], comparison: Comparison | None
) -> None:
    """The parent's answer at a glance, over the children it trained that FINISHED: the best steady
    epoch and the best final test accuracy among its settings (the comparison's medians, the figures
    the verdict gives; each run's own where there is no comparison), how many finished
    (names.BEST_*), and the model the sweep offers (compare.offered: the best setting's run, or the
    most accurate's where every run is contended; what the verdict, `pipeline register` and the UI's
    first row name) linked as the sweep's output (MLflow 3.17's UI lists a run without a model
    output under "Evaluation runs" in GenAI experiments; with one it is a training run); its run id
    is the parent's TAG_BEST_RUN, which publishing the comparison wrote (sweep/publish.py)."""
    from pipeline.analysis.compare import offered  # pandas, scipy (seconds): after the inputs are checked

    finished = [o for o in outcomes if o.status == FINISHED and o.run_id]
    if comparison is not None and not comparison.table.empty:  # the settings' figures, as every view shows them
        epochs = comparison.table[STEADY_EPOCH].dropna().tolist()
        accurate = comparison.table[FINAL_ACCURACY].dropna().tolist()
    else:
        epochs = [o.figures[STEADY_EPOCH] for o in finished if STEADY_EPOCH in o.figures]
        accurate = [o.figures[FINAL_ACCURACY] for o in finished if FINAL_ACCURACY in o.figures]
    metrics: dict[str, float | None] = {FINISHED_RUNS: len(finished)}
    if epochs:
        metrics[BEST_STEADY_EPOCH] = min(epochs)
    if accurate:
        metrics[BEST_FINAL_ACCURACY] = max(accurate)
    try:
        best = offered(comparison) if comparison is not None else None
        if best is not None:
            tracker.link_model(parent_id, best.run_id)
        tracker.log_epochs(parent_id, [], run_metrics=metrics)
    except Exception as exc:  # like the comparison: a summary must never cost the user their sweep
        reporter.note(f"could not record the sweep's summary on its parent run ({exc.__class__.__name__}: {exc})")


def _keep(sweep: _Sweep, job: PointJob, outcome: Outcome) -> str:
    """After each outcome: its line in the results file; returns why the sweep stops ('' to go on)."""
    if outcome.trained:
        try:
            _append_result(sweep, job, outcome)
        except OSError as exc:  # a full disk: no line at all (never half of one), and the sweep stops here
            where, full = results.path_in(sweep.state_dir), exc.errno in NO_ROOM_ERRNOS
            why = "disk full" if full else exc.strerror or str(exc)
            if outcome.status == UNLOGGED:  # in neither place: lost, and said so
                outcome.status = FAILED
                outcome.reason = f"{why}: not recorded, neither the store nor {where} could be written"
            outcome.store_down, outcome.no_room = True, outcome.no_room or full
            return f"the results file could not be written ({why})"
    if outcome.store_down:
        return "a disk the sweep writes to is full" if outcome.no_room else "the tracking store stopped answering"
    if outcome.status == FAILED and sweep.options.fail_fast:
        return f"--fail-fast after #{job.point.index} failed"
    return ""


def _append_result(sweep: _Sweep, job: PointJob, outcome: Outcome) -> None:
    """The point's line in the results file (and, for a run the store could not take, its weights)."""
    results.append(
        sweep.state_dir,
        {
            "logged": outcome.status == FINISHED,
            "tracking_uri": redact(job.tracking_uri),  # relog takes the password from the client's own place
            "experiment": job.experiment_name,
            "parent_run_id": job.parent_run_id,
            "run_id": outcome.run_id,
            "name": job.point.name,
            "run_key": job.run_key,
            "device": outcome.device,
            "params": params_of(job),
            "tags": outcome.tags,
            "run_duration_s": outcome.run_duration_s,
            "one_off": outcome.one_off,
            "metrics": {name: [value, step] for name, (value, step) in outcome.measured.items()},
            "epochs": [asdict(e) for e in outcome.epochs],
        },
        model_state=outcome.model_state,
    )


def _dry_run(spec: GridSpec, planned: list[Planned], reporter: Reporter, options: Options) -> SweepResult:
    """The plan, and which points a real run would skip as DONE (read from the store when it exists;
    nothing is created)."""
    folder, _ = idx.locate(options.data_dir or spec.data.root)
    done = _done_without_writing(spec, planned, options)
    reporter.plan(spec, planned, folder, done, options.max_points)
    return SweepResult([done.get(p.point.index) or Outcome(p.point, SKIPPED, reason="dry run") for p in planned])


def _done_without_writing(spec: GridSpec, planned: list[Planned], options: Options) -> dict[int, Outcome]:
    uri = absolute_store_uri(resolve_tracking_uri(options.tracking_uri))
    path = sqlite_path(uri)
    if options.rerun or (path is not None and not path.exists()):
        return {}
    client = open_client(uri)
    finished = finished_by_key(client, experiment_id_of(client, options.experiment or spec.experiment))
    if not finished:
        return {}
    from pipeline.training import data as data_mod  # torch (seconds): after the inputs are checked

    _assign_run_keys(
        planned,
        data_mod.load(options.data_dir or spec.data.root, spec.data.train_size, spec.data.test_size).identity,
        spec.stop_at,
    )
    return _finished_outcomes(client, planned, finished)


def _log_comparison(tracker: Tracker, parent_id: str, reporter: Reporter, spec: GridSpec, outcomes, reached: int):
    """The sweep published (sweep/publish.py): the comparison table and charts as the parent
    run's artifacts (comparison/), its report (report.html), and what the MLflow UI opens on (view.py):
    saved view, descriptions. The charts' histories are the epochs of `outcomes` as logged, never read
    back; each run's figures are the ones it logged at its end."""
    # pandas, scipy (seconds): after the inputs are checked
    from pipeline.analysis.compare import CHART_HISTORIES
    from pipeline.present.answer import Answer
    from pipeline.sweep.publish import publish

    try:
        comparison = _own_comparison(tracker, parent_id, outcomes, spec, reached, charted=CHART_HISTORIES)
        if comparison.table.empty:
            return comparison
        publish(tracker.client, Answer(comparison), spec.axes)
        return comparison
    except Exception as exc:  # a report must never cost the user their sweep
        reporter.note(f"could not build the comparison charts ({exc.__class__.__name__}: {exc})")
        return None


# --- small helpers -----------------------------------------------------------------------------------


def _project_run_id() -> str | None:
    """The run `mlflow run` made for this process (MLFLOW_RUN_ID), which becomes ours."""
    return os.environ.get("MLFLOW_RUN_ID") or None


def _hardware(item: Planned) -> str:
    from pipeline.training.device import hardware_name  # torch (seconds): after the inputs are checked

    return item.hardware or hardware_name(item.device)


def _why_failed(result: SweepResult) -> str:
    """The parent's reason: which points did not finish, and why."""
    parts = [
        f"#{o.point.index} {o.status}: {o.reason}" for o in result.outcomes if o.status in (FAILED, NOT_RUN, UNLOGGED)
    ]
    return "; ".join(parts)[:5000]


def _require_devices(planned: Sequence[Planned]) -> None:
    missing = [p for p in planned if p.device is None]
    if missing:
        reasons = sorted({p.reason for p in missing})
        raise UserError(
            f"{len(missing)} of {len(planned)} grid points cannot run here: "
            f"{'; '.join(reasons)}. Drop those values from the grid, or run without --require-devices to skip them"
        )


def _assign_run_keys(planned: Sequence[Planned], identity: dict, stop_at: Target | None = None) -> None:
    for item in planned:
        if item.device is not None:
            item.run_key = run_key(item.point.config, identity, _hardware(item), item.point.repeat, stop_at)


def _finished_outcomes(client, planned: Sequence[Planned], finished: dict) -> dict[int, Outcome]:
    """DONE outcomes of the planned points whose run key has a FINISHED run in `finished`."""
    return {
        item.point.index: _outcome_of_finished(client, item, finished[item.run_key])
        for item in planned
        if item.device is not None and item.run_key in finished
    }


def _outcome_of_finished(client, item: Planned, run) -> Outcome:
    """A DONE point as the summary shows it: final metrics, the steady-state epoch time of its history,
    and its steady-state summary as it logged it (worked out from its history for a run older than
    those figures)."""
    from pipeline.training.train import EpochStats  # torch (seconds): after the inputs are checked

    metrics = run.data.metrics
    fields = {name: metrics.get(name, float("nan")) for name in EPOCH_METRICS}
    stats = EpochStats(epoch=item.point.config.epochs, **fields)
    epoch_times = history(client, run.info.run_id, "epoch_duration_s")
    figures = {name: metrics[name] for name in (STEADY_EPOCH, STEADY_IMAGES, FINAL_ACCURACY) if name in metrics}
    if len(figures) < 3:
        figures = summary(epoch_times, history(client, run.info.run_id, "images_per_s"), metrics.get("test_accuracy"))
    said = summary_line(figures)
    return Outcome(
        item.point,
        DONE,
        device=run.data.tags.get(TAG_DEVICE, ""),
        run_id=run.info.run_id,
        reason=f"already FINISHED as run {run.info.run_id}" + (f": {said}" if said else ""),
        epochs=[stats],
        run_duration_s=metrics.get(RUN_DURATION),
        stored_mean_epoch_s=steady_mean(epoch_times),
        stored_figures=figures,
    )
