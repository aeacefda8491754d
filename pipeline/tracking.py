"""Every MLflow call lives here: store, experiment, parent and child runs, params, metrics, model.

Runs are created with explicit ids through MlflowClient rather than the fluent active-run stack, so
the status written is always the one we decide (MLflow itself records Ctrl-C as FAILED) and a child
can name its parent from any thread or process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
import traceback
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.interrupts import critical

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # MLflow's own default since 3.7

# Metric names, defined once. Per-epoch metrics use step = epoch (from 1).
EPOCH_METRICS = (
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "epoch_duration_s", "images_per_s",
    "data_time_s", "transfer_time_s", "compute_time_s",
)
TIME_BUCKETS = ("data_time_s", "transfer_time_s", "compute_time_s")
RUN_DURATION = "run_duration_s"
MODEL_NAME = "model"

# Tags, defined once.
TAG_DEVICE = "pipeline.device"
TAG_HARDWARE = "pipeline.hardware"
TAG_TORCH = "pipeline.torch_version"
TAG_CUDA = "pipeline.cuda_version"
TAG_CONFIG_HASH = "pipeline.config_hash"
TAG_DATA = "pipeline.data"
TAG_ERROR = "pipeline.error"
TAG_PARAM_DEVICES = "pipeline.param_devices"  # where every parameter lives after the move
ARTIFACT_SUMMARY = "summary/model.txt"
ARTIFACT_BATCH = "inputs/train_batch.png"
TAG_GRID_FILE = "pipeline.grid_file"
TAG_GRID_SIZE = "pipeline.grid_size"
TAG_ROLE = "pipeline.role"  # "sweep" (a parent) or "point" (one grid point) or "single"
TAG_RUN_KEY = "pipeline.run_key"  # settings + data + host + hardware: what "already done" means
TAG_HOST = "pipeline.host"
TAG_PID = "pipeline.pid"
TAG_PROCESS_START = "pipeline.process_start"  # with the pid, tells a live process from a reused pid
TAG_RESUMED_FROM = "pipeline.resumed_from_epoch"
TAG_KILLED_REASON = "pipeline.killed_reason"

RESULTS_FILE = "pipeline-results.jsonl"
CHECKPOINT_DIR = ".pipeline-checkpoints"

# MLflow's own HTTP retries (7, backoff 2, 120 s timeout) take minutes to give up; we retry ourselves.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)


class TrackingUnavailable(RuntimeError):
    """The tracking store stopped answering (after retries) in the middle of a sweep."""


def resolve_tracking_uri(cli_value: str | None) -> str:
    """--tracking-uri, then $MLFLOW_TRACKING_URI, then sqlite:///mlflow.db in the working directory."""
    return cli_value or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


class _DropPickleWarning(logging.Filter):
    # Pickle is chosen deliberately (see log_model); the warning would repeat once per run.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Saving pytorch model by Pickle")


def _quiet_mlflow_logs() -> None:
    # A new sqlite store prints a page of alembic migration INFO lines; users need none of them.
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking._tracking_service.client",
                 "mlflow.system_metrics"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mlflow.pytorch").addFilter(_DropPickleWarning())


def check_reachable(uri: str, timeout_s: float = 3.0) -> None:
    """Fail fast (UserError) when a tracking server cannot be reached; MLflow's own retries take minutes."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("http", "https"):
        host = parsed.hostname or "localhost"
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError as exc:
            raise UserError(
                f"tracking server {redact(uri)} is unreachable ({exc.__class__.__name__}: {exc}); "
                "start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or pass another --tracking-uri"
            ) from None
    elif parsed.scheme == "sqlite":
        path = sqlite_path(uri)
        if path is not None and not path.parent.exists():
            raise UserError(f"tracking store {uri}: folder {path.parent} does not exist; create it or pass another --tracking-uri")


def absolute_store_uri(uri: str) -> str:
    """A relative sqlite URI made absolute, so it names the same store from any directory."""
    path = sqlite_path(uri)
    return f"sqlite:///{path.resolve()}" if path is not None else uri


def ui_hint(uri: str, experiment_id: str) -> tuple[str, str]:
    """The command that opens the MLflow UI on this store, and the experiment's training-runs page."""
    uri = absolute_store_uri(uri)
    if uri.startswith(("http://", "https://")):
        return "", f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return (f"{_mlflow_executable()} ui --backend-store-uri {uri} --port 5000",
            f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs")


def _mlflow_executable() -> str:
    """`mlflow` of this environment, spelled so it runs from the user's shell without activation."""
    candidate = Path(sys.executable).parent / "mlflow"
    if not candidate.exists():
        return "mlflow"
    try:
        return str(candidate.relative_to(Path.cwd()))
    except ValueError:
        return str(candidate)


class Tracker:
    """One experiment in one store. Methods take explicit run ids."""

    def __init__(self, uri: str, experiment: str | None) -> None:
        import mlflow
        from mlflow.exceptions import MlflowException

        self.uri = uri
        self.resumed_run_id = os.environ.get("MLFLOW_RUN_ID") or None  # set by `mlflow run`
        self.client = open_client(uri)
        try:
            if self.resumed_run_id:
                # Under `mlflow run` the project run already exists: its experiment is ours.
                run = self.client.get_run(self.resumed_run_id)
                self.experiment_id = run.info.experiment_id
            else:
                self.experiment_id = self._experiment_id(experiment or "Default")
        except MlflowException as exc:
            raise UserError(f"tracking store {uri}: {first_line(exc)}") from None
        mlflow.set_experiment(experiment_id=self.experiment_id)  # LoggedModels land here too
        self.experiment_name = self.client.get_experiment(self.experiment_id).name

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                raise UserError(
                    f"experiment {name!r} is deleted in {self.uri}; restore it "
                    f"(mlflow experiments restore --experiment-id {found.experiment_id}) or choose another name"
                )
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # created by someone else meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    # --- runs ---------------------------------------------------------------------------------------

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        """Create a run (nested under `parent_id` when given) and return its id."""
        from mlflow.tracking.context.registry import resolve_tags
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        tags = {**process_tags(), **(tags or {})}
        if parent_id:
            tags[MLFLOW_PARENT_RUN_ID] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=resolve_tags(tags))
        return run.info.run_id

    def finished_runs(self) -> dict[str, Any]:
        """FINISHED runs of this experiment by run key (the newest per key)."""
        runs = self.client.search_runs(
            [self.experiment_id], f"tags.`{TAG_RUN_KEY}` LIKE '%' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time ASC"], max_results=50000,
        )
        return {run.data.tags[TAG_RUN_KEY]: run for run in runs}

    def kill_running_children(self, parent_id: str) -> list[str]:
        """Mark KILLED every RUNNING child of a sweep (Ray tasks cancelled from the driver)."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        runs = self.client.search_runs(
            [self.experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_id}' and attributes.status = 'RUNNING'")
        for run in runs:
            self.client.set_tag(run.info.run_id, TAG_KILLED_REASON, "cancelled by Ctrl-C on the driver")
            self.client.set_terminated(run.info.run_id, "KILLED")
        return [r.info.run_id for r in runs]

    def reap_orphans(self) -> list[str]:
        """Mark KILLED the RUNNING runs of this experiment left by dead processes on this host."""
        host = socket.gethostname()
        runs = self.client.search_runs(
            [self.experiment_id], f"attributes.status = 'RUNNING' and tags.`{TAG_HOST}` = '{host}'",
            max_results=50000,
        )
        reaped = []
        for run in runs:
            tags = run.data.tags
            if run.info.run_id == self.resumed_run_id or not tags.get(TAG_PID, "").isdigit():
                continue
            if not _process_alive(int(tags[TAG_PID]), tags.get(TAG_PROCESS_START)):
                self.client.set_tag(run.info.run_id, TAG_KILLED_REASON,
                                    f"process {tags[TAG_PID]} on {host} ended without closing the run")
                self.client.set_terminated(run.info.run_id, "KILLED")
                reaped.append(run.info.run_id)
        return reaped

    def adopt_or_start(self, name: str, tags: dict[str, str]) -> tuple[str, bool]:
        """The run given by `mlflow run` (MLFLOW_RUN_ID) if any, else a new top-level run.

        Returns (run_id, adopted). An adopted run's status is left to `mlflow run`.
        """
        if self.resumed_run_id:
            from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

            # Replace MLflow's random project-run name with ours, so the UI reads the same either way.
            self.log_tags(self.resumed_run_id, {**process_tags(), **tags, MLFLOW_RUN_NAME: name})
            return self.resumed_run_id, True
        return self.start_run(name, tags=tags), False

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Log params in one batch; keys the run already has (e.g. from `mlflow run -P`) are kept."""
        from mlflow.entities import Param

        existing = self.client.get_run(run_id).data.params
        new = [Param(k, _param_str(v)) for k, v in params.items() if k not in existing]
        if new:
            self.client.log_batch(run_id, params=new)

    def log_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_epoch(self, run_id: str, stats: Any) -> None:
        """One batch call per epoch with every per-epoch metric at step = epoch."""
        from mlflow.entities import Metric

        values = asdict(stats)
        now = int(time.time() * 1000)
        metrics = [Metric(name, float(values[name]), now, stats.epoch) for name in EPOCH_METRICS]
        self.client.log_batch(run_id, metrics=metrics)

    def log_network(self, run_id: str, model: Any, images: Any) -> None:
        """The tutorial's TensorBoard extras: a grid of training images, the model summary with
        every parameter's shape and device, and a tag listing the parameters' devices."""
        from pipeline.data import image_grid
        from pipeline.model import summary

        self.client.log_image(run_id, image_grid(images), ARTIFACT_BATCH)
        self.client.log_text(run_id, summary(model), ARTIFACT_SUMMARY)
        devices = sorted({str(p.device) for p in model.parameters()})
        self.client.set_tag(run_id, TAG_PARAM_DEVICES, ",".join(devices))

    def log_run_duration(self, run_id: str, seconds: float) -> None:
        self.client.log_metric(run_id, RUN_DURATION, seconds)

    def log_model(self, run_id: str, model: Any, example: Any) -> str:
        """Log a CPU copy of `model` with a signature; returns the model URI.

        Pickle serialization keeps the Network class (pt2 would load back as a GraphModule, and its
        CUDA exports do not load on CPU-only machines); explicit pip requirements avoid MLflow's
        seconds-long requirement inference in a subprocess for every run.
        """
        import copy
        import shutil
        import tempfile

        import cloudpickle
        import mlflow
        import torch
        from mlflow.models import infer_signature

        from pipeline import model as model_module

        cpu_model = copy.deepcopy(model).to("cpu").eval()
        with torch.no_grad():
            output = cpu_model(torch.from_numpy(example)).numpy()
        with tempfile.TemporaryDirectory() as tmp, critical():
            # The pickle names pipeline.model.Network: ship that one module with the model so it
            # loads where this package is not installed (MLflow puts code/ on sys.path on load).
            package = Path(tmp) / "pipeline"
            package.mkdir()
            (package / "__init__.py").write_text("")
            shutil.copy(model_module.__file__, package / "model.py")
            info = mlflow.pytorch.log_model(
                cpu_model,
                name=MODEL_NAME,
                run_id=run_id,
                signature=infer_signature(example, output),
                input_example=example,
                serialization_format="pickle",
                code_paths=[str(package)],
                pip_requirements=[
                    f"torch=={torch.__version__.split('+')[0]}",
                    f"mlflow=={mlflow.__version__}",
                    f"cloudpickle=={cloudpickle.__version__}",
                ],
            )
        return info.model_uri

    def log_artifacts(self, run_id: str, folder: Path, artifact_path: str) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    @contextlib.contextmanager
    def system_metrics(self, run_id: str, enabled: bool, interval_s: float = 2.0):
        """MLflow's CPU, memory, disk, network (and GPU, via nvidia-ml-py) sampling for one run."""
        if not enabled:
            yield
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, tracking_uri=self.uri)
        monitor.start()
        try:
            yield
        finally:
            monitor.finish()
            if monitor._logging_step == 0:  # a run shorter than one interval still gets a sample
                with contextlib.suppress(Exception):
                    monitor.collect_metrics()
                    monitor.publish_metrics(monitor.aggregate_metrics())
                    monitor.mlflow_logger.flush()

    def log_failure(self, run_id: str, exc: BaseException, reason: str | None = None) -> None:
        """The reason as a tag (error class and message, or a hint), the traceback as an artifact."""
        reason = (reason or f"{exc.__class__.__name__}: {exc}")[:5000]
        self.client.set_tag(run_id, TAG_ERROR, reason)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.client.log_text(run_id, text, "error/traceback.txt")

    def end_run(self, run_id: str, status: str, quick: bool = False) -> None:
        """FINISHED, FAILED or KILLED. `quick`: one attempt, no retries, errors ignored (for a
        second Ctrl-C, or a store that is already known to be down)."""
        if not quick:
            self.client.set_terminated(run_id, status)
            return
        with contextlib.suppress(Exception):
            self.client._client.set_terminated(run_id, status)

    def ui(self) -> tuple[str, str]:
        return ui_hint(self.uri, self.experiment_id)


def _param_str(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


# --- reading a sweep back ---------------------------------------------------------------------------


@dataclass
class RunRecord:
    """A finished run as plain data: what `compare` needs, with no MLflow types."""

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


def open_client(uri: str, must_exist: bool = False):
    """An MlflowClient on `uri` that retries transient failures, after a fast reachability check.

    With `must_exist`, a local sqlite store that is not there is an error rather than created. A new
    sqlite store is created under a file lock: processes creating the tables at once break it.
    """
    _quiet_mlflow_logs()
    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import mlflow

    check_reachable(uri)
    path = sqlite_path(uri)
    if must_exist and path is not None and not path.exists():
        raise UserError(f"no tracking store at {path} ({uri}); run a grid first, or pass --tracking-uri")
    lock = _file_lock(path.with_name(path.name + ".lock")) if path is not None else contextlib.nullcontext()
    try:
        with lock:
            mlflow.MlflowClient(uri).search_experiments(max_results=1)  # creates/upgrades a new store once
    except Exception as exc:  # a bad scheme, a missing driver, a file store: say so in one line
        hint = ""
        if isinstance(exc, ModuleNotFoundError):
            hint = f"; install the {exc.name} package for this store"
        elif "MLFLOW_ALLOW_FILE_STORE" in str(exc):
            hint = "; MLflow 3 retired file stores: use sqlite:///mlflow.db or a tracking server"
        raise UserError(f"tracking store {redact(uri)} cannot be opened ({exc.__class__.__name__}: "
                        f"{first_line(exc)[:300]}){hint}") from None
    mlflow.set_tracking_uri(uri)
    return _Retrying(mlflow.MlflowClient(uri))


def redact(uri: str) -> str:
    """The URI with any password replaced, for messages."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.password:
        return uri.replace(f":{parsed.password}@", ":***@", 1)
    return uri


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _transient(exc: BaseException) -> bool:
    """Worth retrying: a busy sqlite file, a dropped connection, a 5xx or 429 from a server."""
    text = f"{exc.__class__.__name__}: {exc}".lower()
    return any(s in text for s in ("database is locked", "connection", "timed out", "timeout",
                                   "max retries", "temporarily", "503", "502", "504", "429", "500 "))


class _Retrying:
    """Wraps an MlflowClient: each call retries transient failures with backoff, then raises
    TrackingUnavailable. Everything else passes through unchanged."""

    def __init__(self, client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            for delay in (*_RETRY_DELAYS_S, None):
                try:
                    with critical():  # a Ctrl-C waits for the call: never a half-done write
                        return attribute(*args, **kwargs)
                except Exception as exc:
                    if not _transient(exc):
                        raise
                    if delay is None:
                        raise TrackingUnavailable(f"{self._client.tracking_uri}: {first_line(exc)}") from exc
                    time.sleep(delay)

        return call


def local_state_dir(uri: str) -> Path:
    """Where local results and checkpoints live: beside a sqlite store, else the working directory."""
    path = sqlite_path(uri)
    return path.resolve().parent if path is not None else Path.cwd()


def process_tags() -> dict[str, str]:
    """Host, pid and process start time: enough to tell later whether this process is gone."""
    import psutil

    return {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid()),
            TAG_PROCESS_START: f"{psutil.Process().create_time():.2f}"}


def _process_alive(pid: int, started: str | None) -> bool:
    import psutil

    try:
        process = psutil.Process(pid)
        return started is None or abs(process.create_time() - float(started)) < 1.0
    except (psutil.NoSuchProcess, ValueError):
        return False


def sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///") and uri[len("sqlite:///"):] not in ("", ":memory:"):
        return Path(uri[len("sqlite:///"):])
    return None


def read_sweep(client, experiment: str | None = None, parent_run_id: str | None = None,
               histories: tuple[str, ...] = ()) -> SweepRecord:
    """A sweep's parent and its FINISHED children; by default the latest sweep (of `experiment`).

    Raises UserError when there is nothing to read.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    try:
        if parent_run_id:
            parent = client.get_run(parent_run_id)
        else:
            if experiment:
                found = client.get_experiment_by_name(experiment)
                if found is None:
                    names = [e.name for e in client.search_experiments()]
                    raise UserError(f"no experiment {experiment!r} in {client.tracking_uri}; "
                                    f"experiments there: {', '.join(names) or 'none'}")
                experiment_ids = [found.experiment_id]
            else:
                experiment_ids = [e.experiment_id for e in client.search_experiments()]
            sweeps = client.search_runs(experiment_ids, f"tags.{TAG_ROLE} = 'sweep'",
                                        order_by=["attributes.start_time DESC"], max_results=1)
            if not sweeps:
                where = f"experiment {experiment!r}" if experiment else client.tracking_uri
                raise UserError(f"no sweep (a `pipeline run` parent run) in {where}; run a grid first")
            parent = sweeps[0]
        runs = client.search_runs(
            [parent.info.experiment_id],
            f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time ASC"],
        )
    except MlflowException as exc:
        raise UserError(f"{client.tracking_uri}: {first_line(exc)}") from None
    children = []
    for run in runs:
        record = RunRecord(run.info.run_id, run.info.run_name, dict(run.data.params),
                           dict(run.data.metrics), dict(run.data.tags))
        for name in histories:
            steps = client.get_metric_history(run.info.run_id, name)
            record.histories[name] = [m.value for m in sorted(steps, key=lambda m: m.step)]
        children.append(record)
    experiment_name = client.get_experiment(parent.info.experiment_id).name
    return SweepRecord(parent.info.run_id, parent.info.run_name, parent.info.experiment_id, experiment_name, children)


def relog(client, results_file: Path) -> list[str]:
    """Log the runs that a tracking outage kept only in the local results file; returns new run ids.

    Each becomes a FINISHED run in its experiment with its params, per-epoch metrics and tags (the
    model itself was not kept), and its line is marked logged.
    """
    from mlflow.entities import Metric, Param, RunTag

    if not results_file.exists():
        raise UserError(f"{results_file}: no results file here; pass the one the sweep named")
    lines = [json.loads(line) for line in results_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    created = []
    for entry in lines:
        if entry.get("logged", True):
            continue
        found = client.get_experiment_by_name(entry["experiment"])
        experiment_id = found.experiment_id if found else client.create_experiment(entry["experiment"])
        tags = {TAG_RUN_KEY: entry["run_key"], TAG_DEVICE: entry["device"], "pipeline.relogged_from": entry["run_id"]}
        run = client.create_run(experiment_id, run_name=entry["name"], tags=tags)
        metrics = [Metric(name, float(value), 0, epoch["epoch"]) for epoch in entry["epochs"]
                   for name, value in epoch.items() if name in EPOCH_METRICS]
        if entry.get("run_duration_s") is not None:
            metrics.append(Metric(RUN_DURATION, float(entry["run_duration_s"]), 0, 0))
        params = [Param(k, _param_str(v)) for k, v in entry["params"].items()]
        client.log_batch(run.info.run_id, metrics=metrics, params=params, tags=[RunTag(TAG_ROLE, "point")])
        client.set_terminated(run.info.run_id, "FINISHED")
        entry["logged"], entry["relogged_as"] = True, run.info.run_id
        created.append(run.info.run_id)
    temporary = results_file.with_suffix(".tmp")
    temporary.write_text("".join(json.dumps(entry) + "\n" for entry in lines), encoding="utf-8")
    os.replace(temporary, results_file)
    return created
