"""The Model Registry: register a run's logged model as a version, point an alias at it.

MLflow 3 keeps models as LoggedModels (`models:/m-...`) linked to the run that logged them;
registry stages are deprecated, so the version is found through an alias (`models:/NAME@champion`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pipeline.errors import UserError
from pipeline.names import TAG_DEVICE, TAG_HARDWARE, TAG_ROLE
from pipeline.records import all_runs, every
from pipeline.store import first_line, fluent_target

KEY_PARAMS = ("device", "lr", "batch_size", "num_workers", "epochs", "seed")
TAG_SOURCE_RUN = "pipeline.source_run"
TAG_METRIC = "pipeline.metric"


@dataclass(frozen=True)
class Registration:
    name: str
    version: str
    alias: str
    run_id: str
    metric: str
    value: float
    created: bool  # False when the run was already registered and no --force was given

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@{self.alias}"


def check_alias(alias: str) -> None:
    """MLflow refuses 'latest' and 'v<digits>' (version references) as aliases; say so up front."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", alias) or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        raise UserError(f"--alias {alias!r}: use letters, digits, '_' or '-', not 'latest' or 'v<number>'; e.g. champion")


def best_run(client, *, experiment: str | None = None, parent_run_id: str | None = None,
             metric: str = "test_accuracy", mode: str = "max"):
    """The best FINISHED training run (not a sweep parent) by `metric`, in an experiment or sweep."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    try:
        if parent_run_id:
            parent = client.get_run(parent_run_id)
            experiment_ids = [parent.info.experiment_id]
            where = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_run_id}'"
            scope = f"sweep {parent_run_id}"
        else:
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise UserError(f"no experiment {experiment!r} in {client.tracking_uri}; check --experiment")
            experiment_ids = [found.experiment_id]
            where = f"tags.`{TAG_ROLE}` != 'sweep'"
            scope = f"experiment {experiment!r}"
        runs = all_runs(client, experiment_ids, f"{where} and attributes.status = 'FINISHED'")
    except MlflowException as exc:
        raise UserError(f"{client.tracking_uri}: {first_line(exc)}") from None
    if not runs:
        raise UserError(f"{scope} has no FINISHED training runs to register; train a grid first")
    scored = [r for r in runs if metric in r.data.metrics and not math.isnan(r.data.metrics[metric])]
    if not scored:
        known = sorted({k for r in runs for k in r.data.metrics if not k.startswith("system/")})
        raise UserError(f"--metric {metric}: no FINISHED run in {scope} has it; choose one of {', '.join(known)}")
    pick = max if mode == "max" else min
    return pick(scored, key=lambda r: r.data.metrics[metric])


def finished_run(client, run_id: str):
    """The run `run_id`, which must exist and be FINISHED to be registered."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise UserError(f"--run-id {run_id}: no such run in {client.tracking_uri}") from None
    if run.info.status != "FINISHED":
        raise UserError(f"--run-id {run_id}: the run is {run.info.status}, not FINISHED; register a finished run")
    return run


def best_of(client, run_ids: list[str], metric: str = "test_accuracy", mode: str = "max"):
    """The best of the given FINISHED runs by `metric` (a sweep's points, trained now or before)."""
    if not run_ids:
        raise UserError("no run of the grid finished (and none was FINISHED before): nothing to register")
    runs = [client.get_run(run_id) for run_id in run_ids]
    scored = [r for r in runs if metric in r.data.metrics and not math.isnan(r.data.metrics[metric])]
    if not scored:
        raise UserError(f"no run of the grid has the metric {metric}: nothing to register")
    return (max if mode == "max" else min)(scored, key=lambda r: r.data.metrics[metric])


def model_id_of(client, run) -> str:
    """The LoggedModel a run produced (its `model`), or UserError when it logged none."""
    outputs = run.outputs.model_outputs if run.outputs else []
    if outputs:
        return max(outputs, key=lambda o: o.step).model_id
    logged = client.search_logged_models(
        experiment_ids=[run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    if not logged:
        raise UserError(f"run {run.info.run_id} has no logged model to register (did it finish training?)")
    return logged[0].model_id


def register(client, run, *, name: str, metric: str, alias: str = "champion", force: bool = False) -> Registration:
    """Register `run`'s model as a new version of `name` (unless it already is one) and alias it."""
    if not name.strip():
        raise UserError("--name: give the registered model a name, e.g. fashion-cnn")
    check_alias(alias)
    model_id = model_id_of(client, run)
    value = run.data.metrics.get(metric, math.nan)
    # MLflow resolves the version's `models:/m-...` source through its fluent tracking URI.
    with fluent_target(client.tracking_uri, run.info.experiment_id):
        return _register(client, run, model_id, name=name, metric=metric, value=value, alias=alias, force=force)


def _register(client, run, model_id: str, *, name: str, metric: str, value: float, alias: str,
              force: bool) -> Registration:
    from mlflow.exceptions import MlflowException

    run_id = run.info.run_id
    try:
        try:
            client.create_registered_model(name, description="Fashion-MNIST CNN trained by `pipeline`")
        except MlflowException as exc:
            if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
                raise
        existing = [v for v in every(client.search_model_versions, f"name = '{name}'") if v.run_id == run_id]
        created = force or not existing
        if created:
            tags: dict[str, Any] = {TAG_SOURCE_RUN: run_id, TAG_METRIC: metric, metric: value,
                                    "hardware": run.data.tags.get(TAG_HARDWARE, "")}
            tags.update({k: run.data.params[k] for k in KEY_PARAMS if k in run.data.params})
            tags["device_used"] = run.data.tags.get(TAG_DEVICE, run.data.params.get("device", ""))
            version = client.create_model_version(name, source=f"models:/{model_id}", run_id=run_id,
                                                  tags={k: str(v) for k, v in tags.items()}, model_id=model_id)
        else:
            version = max(existing, key=lambda v: int(v.version))
        client.set_registered_model_alias(name, alias, version.version)
    except MlflowException as exc:
        raise UserError(f"registering {name!r}: {first_line(exc)}") from None
    return Registration(name, str(version.version), alias, run_id, metric, value, created)


def register_best(tracking_uri: str, run_ids: list[str], name: str, metric: str = "test_accuracy") -> Registration:
    """`pipeline run --register NAME`: the best of a grid's FINISHED points, trained now or before."""
    from pipeline.store import open_client

    client = open_client(tracking_uri)
    return register(client, best_of(client, run_ids, metric), name=name, metric=metric)
