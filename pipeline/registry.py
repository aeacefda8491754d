"""The Model Registry: register a run's logged model as a version, point an alias at it.

MLflow 3 keeps models as LoggedModels (`models:/m-...`) linked to the run that logged them;
registry stages are deprecated, so the version is found through an alias (`models:/NAME@champion`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pipeline import tracking
from pipeline.errors import UserError

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
            where = f"tags.`{tracking.TAG_ROLE}` != 'sweep'"
            scope = f"experiment {experiment!r}"
        runs = client.search_runs(experiment_ids, f"{where} and attributes.status = 'FINISHED'", max_results=5000)
    except MlflowException as exc:
        raise UserError(f"{client.tracking_uri}: {tracking.first_line(exc)}") from None
    if not runs:
        raise UserError(f"{scope} has no FINISHED training runs to register; train a grid first")
    scored = [r for r in runs if metric in r.data.metrics and not math.isnan(r.data.metrics[metric])]
    if not scored:
        known = sorted({k for r in runs for k in r.data.metrics if not k.startswith("system/")})
        raise UserError(f"--metric {metric}: no FINISHED run in {scope} has it; choose one of {', '.join(known)}")
    pick = max if mode == "max" else min
    return pick(scored, key=lambda r: r.data.metrics[metric])


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
    from mlflow.exceptions import MlflowException

    if not name.strip():
        raise UserError("--name: give the registered model a name, e.g. fashion-cnn")
    check_alias(alias)
    model_id = model_id_of(client, run)
    run_id = run.info.run_id
    value = run.data.metrics.get(metric, math.nan)
    try:
        try:
            client.create_registered_model(name, description="Fashion-MNIST CNN trained by `pipeline`")
        except MlflowException as exc:
            if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
                raise
        existing = [v for v in client.search_model_versions(f"name = '{name}'") if v.run_id == run_id]
        created = force or not existing
        if created:
            tags: dict[str, Any] = {TAG_SOURCE_RUN: run_id, TAG_METRIC: metric, metric: value,
                                    "hardware": run.data.tags.get(tracking.TAG_HARDWARE, "")}
            tags.update({k: run.data.params[k] for k in KEY_PARAMS if k in run.data.params})
            tags["device_used"] = run.data.tags.get(tracking.TAG_DEVICE, run.data.params.get("device", ""))
            version = client.create_model_version(name, source=f"models:/{model_id}", run_id=run_id,
                                                  tags={k: str(v) for k, v in tags.items()}, model_id=model_id)
        else:
            version = max(existing, key=lambda v: int(v.version))
        client.set_registered_model_alias(name, alias, version.version)
    except MlflowException as exc:
        raise UserError(f"registering {name!r}: {tracking.first_line(exc)}") from None
    return Registration(name, str(version.version), alias, run_id, metric, value, created)
