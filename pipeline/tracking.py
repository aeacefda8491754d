"""The run logger: the MLflow calls that record one experiment's runs, with explicit run ids.

Runs are created through MlflowClient rather than the fluent active-run stack, so the status written
is always the one we decide (MLflow itself records Ctrl-C as FAILED) and a child can name its parent
from any thread or process. Which store and how it answers is `store`'s concern; the names of what
a run holds are `names`'; reading runs back is `records`'.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.interrupts import critical
from pipeline.liveness import process_tags
from pipeline.names import EPOCH_METRICS, MODEL_NAME, TAG_ERROR, ARTIFACT_TRACEBACK
from pipeline.store import (TrackingUnavailable, artifact_store, first_line, is_transient, open_client,
                            ui_hint)


class Tracker:
    """One experiment in one store. Methods take explicit run ids."""

    def __init__(self, uri: str, client, experiment_id: str, experiment_name: str) -> None:
        self.uri, self.client = uri, client
        self.experiment_id, self.experiment_name = experiment_id, experiment_name
        self._artifact_uris: dict[str, str] = {}  # of the runs this tracker created, until they end
        self._waiting = _Waiting()

    @classmethod
    def open(cls, uri: str, experiment: str, project_run_id: str | None = None, client=None) -> "Tracker":
        """The experiment named `experiment` (created when missing), or, under `mlflow run`, the
        experiment of the project run `project_run_id`. `client`: one already open on `uri`."""
        from mlflow.exceptions import MlflowException

        client = client or open_client(uri)
        try:
            if project_run_id:
                experiment_id = client.get_run(project_run_id).info.experiment_id
            else:
                experiment_id = _experiment_id(client, uri, experiment)
            name = client.get_experiment(experiment_id).name
        except MlflowException as exc:
            raise UserError(f"tracking store {uri}: {first_line(exc)}") from None
        return cls(uri, client, experiment_id, name)

    @staticmethod
    @lru_cache(maxsize=8)
    def attach(uri: str, experiment_id: str, experiment_name: str) -> "Tracker":
        """A tracker on an experiment that exists (a point job's); one client per process and store."""
        return Tracker(uri, open_client(uri), experiment_id, experiment_name)

    # --- runs ---------------------------------------------------------------------------------------

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        """Create a run (nested under `parent_id` when given) and return its id."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        tags = {**context_tags(), **process_tags(), **(tags or {})}
        if parent_id:
            tags[MLFLOW_PARENT_RUN_ID] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self._artifact_uris[run.info.run_id] = run.info.artifact_uri
        return run.info.run_id

    def adopt(self, run_id: str, name: str, tags: dict[str, str]) -> str:
        """Take over a run someone else created (`mlflow run`'s project run): our name (for MLflow's
        random one: the UI reads the same either way) and tags on it. Its status is its creator's."""
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        self.log_tags(run_id, {**process_tags(), **tags, MLFLOW_RUN_NAME: name})
        return run_id

    def end_run(self, run_id: str, status: str, quick: bool = False) -> None:
        """FINISHED, FAILED or KILLED, after what still waits. `quick`: the status alone, one attempt,
        no retries, errors ignored (for a second Ctrl-C, or a store already known to be down)."""
        self._artifact_uris.pop(run_id, None)
        if not quick:
            with contextlib.suppress(Exception):  # best effort: nothing may keep the run from ending
                self.log_epochs(run_id, [])  # what still waits (no call when nothing does)
            self._waiting.sent(run_id)
            self.client.set_terminated(run_id, status)
            return
        self._waiting.sent(run_id)
        with contextlib.suppress(Exception):
            self.client.once.set_terminated(run_id, status)

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

    def wait(self, run_id: str, epochs: list[Any] = (), run_metrics: dict[str, float | None] | None = None,
             tags: dict[str, Any] | None = None) -> None:
        """Epochs' metrics, run-level ones and tags, stamped now, for the run's next write: log_epochs,
        log_model (which links the epochs at its step to the model), log_failure or end_run."""
        self._waiting.add(run_id, as_metrics(list(epochs), run_metrics or {}), tags or {})

    def log_epochs(self, run_id: str, epochs: list[Any], run_metrics: dict[str, float | None] | None = None,
                   tags: dict[str, Any] | None = None) -> None:
        """Epochs' metrics, run-level ones (step 0) and tags, with what waits, in one batch call."""
        from mlflow.entities import RunTag

        waiting, waiting_tags = self._waiting.of(run_id)
        metrics = [*waiting, *as_metrics(epochs, run_metrics or {})]
        run_tags = [RunTag(k, v) for k, v in {**waiting_tags, **{k: str(v) for k, v in (tags or {}).items()}}.items()]
        if metrics or run_tags:
            self.client.log_batch(run_id, metrics=metrics, tags=run_tags)
        self._waiting.sent(run_id)

    def log_files(self, run_id: str, files: dict[str, bytes | str]) -> None:
        """Files (contents by artifact path) into the run's artifacts, in one upload."""
        with tempfile.TemporaryDirectory() as tmp:
            for path, content in files.items():
                target = Path(tmp, path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content if isinstance(content, bytes) else content.encode())
            if run_id in self._artifact_uris:
                artifact_store(self._artifact_uris[run_id], self.uri).log_artifacts(tmp)
            else:  # a run this tracker did not create (`mlflow run`'s): the client finds its store
                self.client.log_artifacts(run_id, tmp)

    def log_artifacts(self, run_id: str, folder: Path, artifact_path: str) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    def log_failure(self, run_id: str, exc: BaseException, reason: str | None = None) -> None:
        """The reason as a tag (error class and message, or a hint), the traceback as an artifact."""
        reason = (reason or f"{exc.__class__.__name__}: {exc}")[:5000]
        self.log_epochs(run_id, [], tags={TAG_ERROR: reason})  # with what waits
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.log_files(run_id, {ARTIFACT_TRACEBACK: text})

    def log_model(self, run_id: str, model: Any, example: Any, step: int = 0, *, params: dict[str, Any] | None = None,
                  logged: list[Any] = ()) -> str:
        """Log a CPU copy of `model` as the run's LoggedModel `model`, its output at `step` (the final
        epoch), with what waits (the final epoch's metrics: linked to it); returns the URI. `params`:
        the run's, copied onto it; `logged`: metrics at `step` already in the store, linked too."""
        waiting, tags = self._waiting.of(run_id)
        try:
            uri = log_pytorch_model(self.client, self.experiment_id, run_id, model, example, step,
                                    params or {}, [*logged, *waiting], tags)
        except Exception as exc:
            if is_transient(exc):
                raise TrackingUnavailable.of(self.uri, exc) from exc
            raise
        self._waiting.sent(run_id)
        return uri

    def system_metrics(self, run_id: str, enabled: bool):
        """MLflow's CPU, memory, disk, network (and GPU, via nvidia-ml-py) sampling for one run."""
        return sample_system_metrics(self.uri, run_id) if enabled else contextlib.nullcontext()

    def ui(self, parent_run_id: str | None = None) -> tuple[str, str]:
        """The command that starts the UI on this store, and the page to open: the sweep's saved
        view when `parent_run_id` has one, else the experiment's runs."""
        from pipeline import view

        command, url = ui_hint(self.uri, self.experiment_id)
        return command, view.page(url, parent_run_id) if parent_run_id else url


class _Waiting:
    """By run: MLflow metrics (stamped when handed over) and tags that ride the run's next write
    rather than a call of their own (each call is 4-20 ms on sqlite). Dropped only once sent, and
    sent again as stamped: a write that fails after the store took them leaves one point per step."""

    def __init__(self) -> None:
        self._by_run: dict[str, tuple[list[Any], dict[str, str]]] = {}

    def add(self, run_id: str, metrics: list[Any], tags: dict[str, Any]) -> None:
        waiting, waiting_tags = self._by_run.setdefault(run_id, ([], {}))
        waiting += metrics
        waiting_tags.update({k: str(v) for k, v in tags.items()})

    def of(self, run_id: str) -> tuple[list[Any], dict[str, str]]:
        return self._by_run.get(run_id, ([], {}))

    def sent(self, run_id: str) -> None:
        self._by_run.pop(run_id, None)


def log_pytorch_model(client, experiment_id: str, run_id: str, model: Any, example: Any, step: int,
                      params: dict[str, Any], metrics: list[Any], tags: dict[str, str]) -> str:
    """Log a CPU copy of `model` as run `run_id`'s LoggedModel `model`; returns its URI.

    The steps of MLflow's `mlflow.pytorch.log_model` (3.17), through its public client API: create
    the LoggedModel, save the flavor into it, record it as the run's output at `step`, link that
    step's metrics, mark it READY (FAILED when a step fails). What MLflow reads back from the store
    on every call to learn what the caller already knows (the run's params, its experiment, every
    metric's full history to find the final step's values) is passed in instead: about 0.06 s a
    run on sqlite, a third of the call. `metrics` and `tags` go in the linking call, the per-epoch
    metrics at `step` linked: MLflow links metrics it logged earlier, which here would be a call
    more and its recovery from inserting them twice (a failed insert, a lookup and a retry).

    Pickle serialization keeps the Network class (pt2 would load back as a GraphModule, and its
    CUDA exports do not load on CPU-only machines); explicit pip requirements avoid MLflow's
    seconds-long requirement inference in a subprocess for every run, and MLflow's check of them
    against this environment is skipped (_without_self_checks).
    """
    import copy
    import shutil

    import cloudpickle
    import mlflow
    import torch
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric, RunTag
    from mlflow.models import Model, infer_signature

    from pipeline import model as model_module

    cpu_model = copy.deepcopy(model).to("cpu").eval()
    with torch.no_grad():
        output = cpu_model(torch.from_numpy(example)).numpy()
    with critical():
        # Calls that are not idempotent go through the bare client, as in MLflow's own log_model (its
        # HTTP layer retries a refused connection): a retry after a lost reply would add a model.
        logged = client.once.create_logged_model(experiment_id, name=MODEL_NAME, source_run_id=run_id,
                                            params={k: param_str(v) for k, v in params.items()}, tags=context_tags())
        try:
            with tempfile.TemporaryDirectory() as tmp, _without_self_checks():
                # The pickle names pipeline.model.Network: ship that one module with the model so it
                # loads where this package is not installed (MLflow puts code/ on sys.path on load).
                package = Path(tmp) / "pipeline"
                package.mkdir()
                (package / "__init__.py").write_text("")
                shutil.copy(model_module.__file__, package / "model.py")
                local = Path(tmp) / MODEL_NAME
                mlflow.pytorch.save_model(
                    cpu_model,
                    str(local),
                    mlflow_model=Model(artifact_path=logged.artifact_location, model_uuid=logged.model_id,
                                       run_id=run_id, model_id=logged.model_id),
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
                artifact_store(logged.artifact_location, client.once.tracking_uri).log_artifacts(str(local))
            client.once.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=step)])
            # With the model's id, the store records them for the model too (a metric already in the
            # run's history, same value, timestamp and step, keeps its single point).
            linked = [Metric(m.key, m.value, m.timestamp, m.step, model_id=logged.model_id)
                      if m.step == step and m.key in EPOCH_METRICS else m for m in metrics]
            if linked or tags:
                client.log_batch(run_id, metrics=linked, tags=[RunTag(k, v) for k, v in tags.items()])
            client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        except BaseException:
            with contextlib.suppress(Exception):
                client.once.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
            raise
    return f"models:/{logged.model_id}"


def as_metrics(epochs: list[Any], run_metrics: dict[str, float | None]) -> list[Any]:
    """MLflow Metrics, stamped now: each epoch's per-epoch metrics at step = epoch, and run-level ones
    at step 0. A value that is None (peak memory where it cannot be told) is left out, never zero."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    values = [(name, getattr(stats, name), stats.epoch) for stats in epochs for name in EPOCH_METRICS]
    values += [(name, value, 0) for name, value in run_metrics.items()]
    return [Metric(name, float(value), now, step) for name, value, step in values if value is not None]


@lru_cache(maxsize=1)
def context_tags() -> dict[str, str]:
    """MLflow's tags for where a run comes from (source, user, git commit), the same for every run of
    a process: resolved once (MLflow resolves them on every run)."""
    from mlflow.tracking.context.registry import resolve_tags

    return resolve_tags({})


# MLflow checks, on every saved model, that its pip requirements match this environment: it maps every
# installed package to its modules by reading each one's file list (~3 s in a process's first run).
# Ours are the installed versions themselves, so the check is skipped. (MLflow's log_model also loads
# the model back to serve its input example, ~0.4 s a run; log_pytorch_model does not take that step:
# tests/test_registry.py loads and serves the logged model for real.)
_SELF_CHECKS = (("mlflow.utils.environment", "warn_dependency_requirement_mismatches"),)


@contextlib.contextmanager
def _without_self_checks():
    """MLflow's check above replaced by a no-op for one model's saving. Where a later MLflow no
    longer has it, nothing is replaced."""
    import importlib

    replaced = []
    for module_name, name in _SELF_CHECKS:
        module = importlib.import_module(module_name)
        if callable(getattr(module, name, None)):
            replaced.append((module, name, getattr(module, name)))
            setattr(module, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for module, name, original in replaced:
            setattr(module, name, original)


@contextlib.contextmanager
def sample_system_metrics(uri: str, run_id: str, interval_s: float = 2.0):
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, tracking_uri=uri)
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


def _experiment_id(client, uri: str, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise UserError(
                f"experiment {name!r} is deleted in {uri}; restore it "
                f"(mlflow experiments restore --experiment-id {found.experiment_id}) or choose another name"
            )
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # created by someone else meanwhile
        return client.get_experiment_by_name(name).experiment_id


def param_str(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
