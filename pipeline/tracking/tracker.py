"""The run logger: the MLflow calls that record one experiment's runs, with explicit run ids.

Runs are created through MlflowClient rather than the fluent active-run stack, so the status written
is always the one we decide (MLflow itself records Ctrl-C as FAILED) and a child can name its parent
from any thread or process. Which store and how it answers is `store`'s concern; the names of what
a run holds are `names`'; reading runs back is `records`'.
"""

from __future__ import annotations

import contextlib
import getpass
import inspect
import subprocess
import sys
import tempfile
import time
import traceback
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.base.files import check_writable
from pipeline.base.names import (
    ARTIFACT_TRACEBACK,
    EPOCH_METRICS,
    FAILED,
    FINISHED,
    KILLED,
    MODEL_NAME,
    TAG_ERROR,
    experiment_name_problem,
)
from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.tracking.liveness import process_tags
from pipeline.tracking.records import deleted_experiment
from pipeline.tracking.store import (
    ARTIFACT_ERRNOS,
    TrackingUnavailable,
    fluent_target,
    is_transient,
    open_client,
    os_errno,
    sqlite_code,
    sqlite_path,
    store_failure,
    ui_hint,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pipeline.training.data import Dataset


class Tracker:
    """One experiment in one store. Methods take explicit run ids."""

    def __init__(self, uri: str, client, experiment_id: str, experiment_name: str) -> None:
        self.uri, self.client = uri, client
        self.experiment_id, self.experiment_name = experiment_id, experiment_name
        # The runs this tracker started: their start (epoch ms) and time.monotonic() then. A run's
        # end is its start plus the monotonic time since, so that a wall clock stepped back (NTP,
        # a VM resumed) never records a run that ends before it starts.
        self._started: dict[str, tuple[int, float]] = {}

    @classmethod
    def open(cls, uri: str, experiment: str, project_run_id: str | None = None, client=None) -> Tracker:
        """The experiment named `experiment` (created when missing), or, under `mlflow run`, the
        experiment of the project run `project_run_id`. `client`: one already open on `uri`."""
        from mlflow.exceptions import MlflowException

        if not project_run_id and experiment_name_problem(experiment):  # before the store is created
            raise UserError(f"--experiment: {experiment_name_problem(experiment)}")
        client = client or open_client(uri)
        try:
            if project_run_id:
                experiment_id = client.get_run(project_run_id).info.experiment_id
            else:
                experiment_id = _experiment_id(client, uri, experiment)
            name = client.get_experiment(experiment_id).name
        except MlflowException as exc:
            raise store_failure(exc, uri) from None
        return cls(uri, client, experiment_id, name)

    @staticmethod
    @lru_cache(maxsize=8)
    def attach(uri: str, experiment_id: str, experiment_name: str) -> Tracker:
        """A tracker on an experiment that exists (a point job's); one client per process and store."""
        return Tracker(uri, open_client(uri), experiment_id, experiment_name)

    # --- runs ---------------------------------------------------------------------------------------

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        """Create a run (nested under `parent_id` when given) and return its id."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        tags = {**source_tags(), **process_tags(), **(tags or {})}
        if parent_id:
            tags[MLFLOW_PARENT_RUN_ID] = parent_id
        start, ticks = int(time.time() * 1000), time.monotonic()
        run_id = self.client.create_run(self.experiment_id, start_time=start, run_name=name, tags=tags).info.run_id
        self._started[run_id] = (start, ticks)
        return run_id

    def adopt(self, run_id: str, name: str, tags: dict[str, str]) -> str:
        """Take over a run someone else created (`mlflow run`'s project run): our name (for MLflow's
        random one: the UI reads the same either way) and tags on it. Its status is its creator's."""
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        self.log_tags(run_id, {**process_tags(), **tags, MLFLOW_RUN_NAME: name})
        return run_id

    def end_run(self, run_id: str, status: str, quick: bool = False, reason: str = "") -> None:
        """FINISHED, FAILED or KILLED. `quick`: one attempt, no retries, errors ignored (for a second
        Ctrl-C, or a store already known to be down), with the `reason` tagged first where given.
        A run this tracker started ends at its start plus the monotonic time since; another (adopted)
        at MLflow's now."""
        end = None
        if run_id in self._started:
            start, ticks = self._started[run_id]
            end = start + int((time.monotonic() - ticks) * 1000)
        if not quick:
            self.client.set_terminated(run_id, status, end_time=end)
            return
        if reason:
            with contextlib.suppress(Exception):
                self.client.once.set_tag(run_id, TAG_ERROR, reason)
        with contextlib.suppress(Exception):
            self.client.once.set_terminated(run_id, status, end_time=end)

    # --- what a run holds ---------------------------------------------------------------------------

    def log_params(self, run_id: str, params: dict[str, Any], new_run: bool = False) -> dict[str, str]:
        """Log params in one batch; keys the run already has (`mlflow run -P`) are kept. `new_run`: one
        just created, which has none (no read of the run). Returns all its params as now stored."""
        from mlflow.entities import Param

        existing = {} if new_run else self.client.get_run(run_id).data.params
        new = [Param(k, param_str(v)) for k, v in params.items() if k not in existing]
        if new:
            self.client.log_batch(run_id, params=new)
        return {**existing, **{p.key: p.value for p in new}}

    def log_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self.log_epochs(run_id, [], tags=tags)

    def log_epochs(
        self,
        run_id: str,
        epochs: list[Any],
        run_metrics: dict[str, float | None] | None = None,
        tags: dict[str, Any] | None = None,
        steps: dict[str, int] | None = None,
    ) -> None:
        """Epochs' metrics (step = epoch), run-level ones (step 0, or their entry in `steps`: the
        time to target is logged at the epoch that reached it) and tags, in one batch call."""
        from mlflow.entities import RunTag

        metrics = as_metrics(epochs, run_metrics or {}, steps or {})
        run_tags = [RunTag(k, redact(str(v))) for k, v in (tags or {}).items()]  # no password in a tag
        if metrics or run_tags:
            self.client.log_batch(run_id, metrics=metrics, tags=run_tags)

    def log_files(self, run_id: str, files: Mapping[str, bytes | str]) -> None:
        """Files (contents by artifact path) into the run's artifacts, in one upload."""
        with tempfile.TemporaryDirectory() as tmp, self._writing_artifacts(run_id):
            for path, content in files.items():
                target = Path(tmp, path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content if isinstance(content, bytes) else content.encode())
            self.client.log_artifacts(run_id, tmp)

    def log_artifacts(self, run_id: str, folder: Path, artifact_path: str) -> None:
        with self._writing_artifacts(run_id):
            self.client.log_artifacts(run_id, str(folder), artifact_path)

    @contextlib.contextmanager
    def _writing_artifacts(self, run_id: str):
        """A file the artifact location (or the temporary folder on its way there) refuses, full or
        not writable, as TrackingUnavailable naming that location, not the store."""
        try:
            yield
        except TrackingUnavailable:
            raise
        except Exception as exc:
            if _refused_by_artifacts(exc):
                raise TrackingUnavailable.of_artifacts(self.client.get_run(run_id).info.artifact_uri, exc) from exc
            raise

    def log_data(self, run_id: str, dataset: Dataset) -> None:
        """The run's training and test splits as MLflow datasets (the UI's Datasets column, lineage):
        source the IDX folder, the split's digest (its files' checksums and size, Dataset.digest),
        shape and dtype in the profile and schema. Only that description is stored, never the images."""
        from mlflow.entities import Dataset as DatasetEntity
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        inputs = [
            DatasetInput(DatasetEntity(**description), [InputTag(MLFLOW_DATASET_CONTEXT, context)])
            for context, description in dataset_descriptions(dataset).items()
        ]
        self.client.log_inputs(run_id, datasets=inputs)

    def link_model(self, run_id: str, from_run_id: str) -> None:
        """Record the model `from_run_id` logged as an output of `run_id` too (a sweep's best child's
        model as the sweep's output); nothing when that run has none."""
        from mlflow.entities import LoggedModelOutput

        outputs = self.client.get_run(from_run_id).outputs
        models = [LoggedModelOutput(m.model_id, m.step) for m in (outputs.model_outputs if outputs else [])]
        if models:
            self.client.log_outputs(run_id, models)

    def log_failure(self, run_id: str, exc: BaseException, reason: str | None = None) -> None:
        """The reason as a tag (error class and message, or a hint), the traceback as an artifact."""
        reason = (reason or f"{exc.__class__.__name__}: {exc}")[:5000]
        self.log_tags(run_id, {TAG_ERROR: reason})
        text = redact("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        self.log_files(run_id, {ARTIFACT_TRACEBACK: text})

    def log_model(
        self, run_id: str, model: Any, example: Any, step: int = 0, *, params: dict[str, Any] | None = None
    ) -> str:
        """Log a CPU copy of `model` as the run's model `model` with `mlflow.pytorch.log_model`, as
        the output of `step` (the final epoch: MLflow links that epoch's metrics to the model), with
        `params` copied onto it. Returns the model's URI. Inside `system_metrics`' block the run is
        MLflow's active run already, and stays so."""
        import mlflow

        with self._writing_artifacts(run_id):
            try:
                active = mlflow.active_run()
                if active is not None and active.info.run_id == run_id:
                    return log_network(model, example, step, params or {})
                with fluent_target(self.uri, self.experiment_id), _active(run_id):
                    return log_network(model, example, step, params or {})
            except Exception as exc:
                if is_transient(exc) and not _refused_by_artifacts(exc):
                    raise TrackingUnavailable.of(self.uri, exc) from exc
                raise

    @contextlib.contextmanager
    def system_metrics(self, run_id: str, enabled: bool):
        """MLflow's CPU, memory, disk, network (and GPU, via nvidia-ml-py) sampling of one run for the
        block, every store.SYSTEM_METRICS_INTERVAL_S seconds (process_settings sets the interval, unless
        the user did): MLflow samples the run it makes active.

        MLflow ends its active run when the block ends (FINISHED, or FAILED on an exception), so the
        block must span everything the run logs, its summary and model included (point.run_point):
        a run is never FINISHED before its model exists. The caller's end_run then sets the status
        the pipeline decides; a store that stopped answering by then is the caller's to tell."""
        if not enabled:
            yield
            return
        import mlflow

        with fluent_target(self.uri, self.experiment_id):
            mlflow.start_run(run_id=run_id, log_system_metrics=True)
            try:
                yield
            except KeyboardInterrupt:
                _end_active(KILLED)
                raise
            except BaseException:
                _end_active(FAILED)
                raise
            _end_active(FINISHED)

    def ui(self) -> tuple[str, str]:
        """The command that starts the UI on this store, and the experiment's runs page, as printed
        (masked); the reporter turns the page into a sweep's saved view (view.page)."""
        command, url = ui_hint(self.uri, self.experiment_id)
        return redact(command), redact(url)


@contextlib.contextmanager
def _active(run_id: str):
    """Run `run_id` as MLflow's active run for the block: its fluent calls (log_model) log to it.
    MLflow marks the run ended when the block ends; the caller's end_run then sets the status the
    pipeline decides (FINISHED, FAILED or KILLED)."""
    import mlflow

    with mlflow.start_run(run_id=run_id):
        yield


def _end_active(status: str) -> None:
    """End MLflow's active run (and its system metrics monitor). A store that stopped answering is not
    raised here: the run's own end (Tracker.end_run, or the results file) is what tells it."""
    import mlflow

    try:
        mlflow.end_run(status)
    except Exception as exc:
        if not is_transient(exc):
            raise


DATASET_CONTEXTS = {"train": "training", "test": "testing"}  # MLflow's context tag for each split


def dataset_descriptions(dataset: Dataset) -> dict[str, dict[str, str]]:
    """Each split as MLflow describes a dataset (mlflow.data.from_numpy's name, digest, source,
    schema and profile), by its context. from_numpy is given the digest, so it reads shapes and
    dtypes and hashes nothing: about a millisecond for the full Fashion-MNIST."""
    import warnings

    import mlflow.data

    name = "fashion-mnist" if dataset.verified else dataset.folder.name
    descriptions = {}
    for split, context in DATASET_CONTEXTS.items():
        data = dataset.train if split == "train" else dataset.test
        with warnings.catch_warnings():
            # MLflow registers its local-file source twice and says it picked one: nothing to act on.
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            described = mlflow.data.from_numpy(
                data.images.numpy(),
                source=str(dataset.folder),
                targets=data.labels.numpy(),
                name=f"{name}-{split}",
                digest=dataset.digest(split),
            )
        descriptions[context] = described.to_dict()
    return descriptions


def log_network(model: Any, example: Any, step: int, params: dict[str, Any]) -> str:
    """`mlflow.pytorch.log_model` of a CPU copy of `model` into the active run; returns its URI.

    Pickle serialization keeps the Network class where MLflow offers the choice (3.14 and later
    default to pt2, which loads back as a GraphModule and whose CUDA exports do not load on CPU-only
    machines); earlier versions pickle anyway. The pip requirements are given, so MLflow does not
    infer them in a subprocess for every run (seconds each). The pickle names pipeline.model.Network:
    that one module ships with the model (code_paths), so it loads where this package is not installed.
    """
    import copy
    import shutil

    import cloudpickle
    import mlflow
    import torch
    from mlflow.models import infer_signature

    from pipeline import model as model_module

    cpu_model = copy.deepcopy(model).to("cpu").eval()
    with torch.no_grad():
        output = cpu_model(torch.from_numpy(example)).numpy()
    options = {"serialization_format": "pickle"} if _offers_serialization_format() else {}
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "pipeline"
        package.mkdir()
        (package / "__init__.py").write_text("")
        shutil.copy(model_module.__file__, package / "model.py")
        info = mlflow.pytorch.log_model(
            cpu_model,
            name=MODEL_NAME,
            step=step,
            params={k: param_str(v) for k, v in params.items()},
            signature=infer_signature(example, output),
            input_example=example,
            code_paths=[str(package)],
            pip_requirements=[
                f"torch=={torch.__version__.split('+')[0]}",
                f"mlflow=={mlflow.__version__}",
                f"cloudpickle=={cloudpickle.__version__}",
            ],
            **options,
        )
    return info.model_uri


@lru_cache(maxsize=1)
def _offers_serialization_format() -> bool:
    import mlflow.pytorch

    return "serialization_format" in inspect.signature(mlflow.pytorch.log_model).parameters


def as_metrics(
    epochs: list[Any], run_metrics: dict[str, float | None], steps: dict[str, int] | None = None
) -> list[Any]:
    """MLflow Metrics, stamped now: each epoch's per-epoch metrics at step = epoch, and run-level ones
    at step 0 (or at `steps[name]`). A value that is None (peak memory where it cannot be told) is
    left out, never zero."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    steps = steps or {}
    values = [(name, getattr(stats, name), stats.epoch) for stats in epochs for name in EPOCH_METRICS]
    values += [(name, value, steps.get(name, 0)) for name, value in run_metrics.items()]
    return [Metric(name, float(value), now, step) for name, value, step in values if value is not None]


@lru_cache(maxsize=1)
def source_tags() -> dict[str, str]:
    """Where a run comes from, under MLflow's own tag names: the user, the command, and the git
    commit of the working directory when it is a checkout. The same for every run of a process."""
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

    tags = {MLFLOW_SOURCE_NAME: " ".join([Path(sys.argv[0]).name, *sys.argv[1:2]]), MLFLOW_SOURCE_TYPE: "LOCAL"}
    with contextlib.suppress(Exception):  # no passwd entry for this uid (some containers)
        tags[MLFLOW_USER] = getpass.getuser()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode == 0 and commit.stdout.strip():
            tags[MLFLOW_GIT_COMMIT] = commit.stdout.strip()
    return tags


def _experiment_id(client, uri: str, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise deleted_experiment(uri, name, found.experiment_id)
        return found.experiment_id
    if sqlite_path(uri) is not None:  # MLflow puts a local store's new experiment in ./mlruns/ID: before it exists
        check_new_artifact_folder()
    try:
        return client.create_experiment(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id  # created by someone else meanwhile


def check_new_artifact_folder() -> None:
    """UserError where a new experiment in a local (sqlite) store could keep no artifacts: MLflow puts
    them in ./mlruns under the working folder."""
    check_writable(
        Path.cwd() / "mlruns",
        "a new experiment's artifact folder",
        "MLflow keeps a new experiment's models and charts in ./mlruns under the folder the command "
        "runs in: run it from a folder you can write in",
    )


def param_str(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _refused_by_artifacts(exc: BaseException) -> bool:
    """A file refused (full, read-only, not permitted), not the sqlite store: by its errno and code."""
    return sqlite_code(exc) is None and os_errno(exc) in ARTIFACT_ERRNOS
