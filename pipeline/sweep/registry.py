"""The Model Registry: register a run's logged model as a version, point an alias at it.

Which run: the one the sweep's verdict names (compare.pick: by default the fastest setting within the
quality margin of the most accurate, and that setting's most accurate run), so the verdict, the
parent run's model, `pipeline register` and the UI's first row agree; `--by speed` or `--by
accuracy` name the other rules, `--metric` picks by one metric over runs, `--run-id` names a run.
A version's tags record the setting and the figures it won on.

MLflow 3 keeps models as LoggedModels (`models:/m-...`) linked to the run that logged them;
registry stages are deprecated, so the version is found through an alias (`models:/NAME@champion`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

from pipeline.base.names import (
    FINAL_ACCURACY,
    SETTING_ACCURACY,
    SETTING_RUNS,
    SETTING_STEADY_EPOCH,
    STEADY_EPOCH,
    STEADY_IMAGES,
    TAG_DEVICE,
    TAG_HARDWARE,
    TAG_ROLE,
    TAG_SETTING,
    control_character_problem,
    length_problem,
)
from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.settings.config import KEYS
from pipeline.tracking.records import all_runs, deleted_experiment, every, logged_model_id, sweep_parent
from pipeline.tracking.store import first_line, fluent_target, open_client

TAG_SOURCE_RUN = "pipeline.source_run"
TAG_METRIC = "pipeline.metric"  # a version picked by --metric: which metric
TAG_RULE = "pipeline.rule"  # a version picked by a rule (--by): best, speed or accuracy
TAG_SWEEP = "pipeline.sweep"  # the sweep (parent run id) it was picked from


@dataclass(frozen=True)
class Reason:
    """Why a run is registered: in words for the terminal, and as the version's tags."""

    words: str  # "test_accuracy 0.8123", "best: cpu bs256 (0.412 s/epoch, ...)", "--run-id"
    tags: dict[str, str]


@dataclass(frozen=True)
class Registration:
    name: str
    version: str
    alias: str
    run_id: str
    reason: Reason
    created: bool  # False when the run was already registered and no --force was given

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@{self.alias}"


# MLflow 3.17's limits on a registered model's alias (mlflow/utils/validation.py), checked up front.
MAX_ALIAS_LENGTH = 255


def check_alias(alias: str) -> None:
    """MLflow refuses 'latest' and 'v<digits>' (version references) as aliases; say so up front."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", alias) or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        raise UserError(
            f"--alias {alias!r}: use letters, digits, '_' or '-', not 'latest' or 'v<number>'; e.g. champion"
        )
    if len(alias) > MAX_ALIAS_LENGTH:
        raise UserError(f"--alias: {len(alias)} characters, more than MLflow's {MAX_ALIAS_LENGTH}; use a shorter alias")


def check_name(name: str, option: str = "--name") -> None:
    """What a store refuses in a registered model's name, before a model or version is created: '/'
    and ':' (they separate a models:/ URI's parts), '.' and '..', and control characters."""
    bad = sorted({c for c in name if c in "/:"})
    if bad:
        raise UserError(
            f"{option} {name!r}: a registered model's name may not hold {' or '.join(map(repr, bad))}; e.g. fashion-cnn"
        )
    if name in (".", ".."):
        raise UserError(f"{option} {name!r}: MLflow refuses '.' and '..' as a model's name; e.g. fashion-cnn")
    problem = length_problem(name) or control_character_problem(name)
    if problem:
        shown = name if len(name) <= 60 else f"{name[:57]}..."
        raise UserError(f"{option} {shown!r}: {problem}")


def picked_run(client, comparison, rule: str = "best"):
    """The run `rule` picks (compare.pick) in `comparison` (a sweep's, as its verdict reads it: every
    point of its grid), with the Reason to record. Where every run is contended, the default rule has
    no speed figure to go on: it registers the most accurate setting instead and says why; `--by
    speed` refuses. UserError when the sweep has no FINISHED run."""
    # pandas: the CLI imports registry at its start, and --help stays quick
    from pipeline.analysis.compare import ACCURACY, BEST, RULES, offered, pick
    from pipeline.present.sentences import pick_words

    sweep = comparison.sweep
    if not sweep.children:
        raise UserError(f"sweep {sweep.name!r} ({sweep.run_id}) has no FINISHED runs to register; train a grid first")
    chosen, why = pick(comparison, rule), f"{rule} ({RULES[rule]})"
    if chosen is None and rule == BEST:  # the model the sweep offers, as its parent links it
        chosen = offered(comparison)
        why = (
            f"{ACCURACY} ({RULES[ACCURACY]}), as every run is contended (other processes took the cores) and "
            "no speed figure counts (--include-contended counts them)"
        )
    if chosen is None:
        raise UserError(
            f"sweep {sweep.name!r}: no {rule} setting: every run is contended (other processes took the "
            "cores), so no speed figure counts; rerun on a quiet machine, --by accuracy, "
            "--include-contended, or --run-id ID"
        )
    # A figure withheld (NaN: no timed run) is no tag: "nan" would read as a value.
    tags = {
        TAG_RULE: chosen.rule,
        TAG_SETTING: chosen.label,
        TAG_SWEEP: sweep.run_id,
        **{name: f"{value:g}" for name, value in chosen.figures.items() if not math.isnan(value)},
    }
    return client.get_run(chosen.run_id), Reason(f"{why}: {pick_words(chosen)}", tags)


def metric_reason(run, metric: str) -> Reason:
    value = run.data.metrics.get(metric, math.nan)
    return Reason(f"{metric} {value:.4f}", {TAG_METRIC: metric, metric: str(value)})


def best_run(
    client,
    *,
    experiment: str | None = None,
    parent_run_id: str | None = None,
    metric: str = "test_accuracy",
    mode: str = "max",
):
    """The best FINISHED training run (not a sweep parent) by `metric`, in an experiment or sweep."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    try:
        if parent_run_id:
            parent = sweep_parent(client, parent_run_id)
            experiment_ids = [parent.info.experiment_id]
            where = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_run_id}'"
            scope = f"sweep {parent_run_id}"
        else:
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise UserError(f"no experiment {experiment!r} in {redact(client.tracking_uri)}; check --experiment")
            if found.lifecycle_stage == "deleted":
                raise deleted_experiment(client.tracking_uri, found.name, found.experiment_id)
            experiment_ids = [found.experiment_id]
            where = f"tags.`{TAG_ROLE}` != 'sweep'"
            scope = f"experiment {experiment!r}"
        runs = all_runs(client, experiment_ids, f"{where} and attributes.status = 'FINISHED'")
    except MlflowException as exc:
        raise UserError(f"{redact(client.tracking_uri)}: {first_line(exc)}") from None
    if not runs:
        raise UserError(f"{scope} has no FINISHED training runs to register; train a grid first")
    scored = [r for r in runs if metric in r.data.metrics and not math.isnan(r.data.metrics[metric])]
    if not scored:
        known = sorted({k for r in runs for k in r.data.metrics if not k.startswith("system/")})
        # Runs log some thirty metrics: the closest names first, then the ones that usually decide.
        close = difflib.get_close_matches(metric, known, n=3, cutoff=0.5)
        usual = [k for k in (FINAL_ACCURACY, STEADY_EPOCH, STEADY_IMAGES, "mfu") if k in known and k not in close]
        raise UserError(
            f"--metric {metric}: no FINISHED run in {scope} has it; try {', '.join(close + usual)} "
            f"(one of {len(known)} metrics; a run's page in the MLflow UI lists them)"
        )
    pick = max if mode == "max" else min
    return pick(scored, key=lambda r: r.data.metrics[metric])


def finished_run(client, run_id: str):
    """The run `run_id`, which must exist and be FINISHED to be registered."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        # The verdict names runs by their first 8 characters; MLflow finds a run by its whole id only.
        whole = (
            (
                "; give the whole 32-character id (the UI's run page shows it, and `pipeline compare "
                "--format json` lists each setting's run_ids)"
            )
            if len(run_id) < 32
            else ""
        )
        raise UserError(f"--run-id {run_id}: no such run in {redact(client.tracking_uri)}{whole}") from None
    if run.info.status != "FINISHED":
        raise UserError(f"--run-id {run_id}: the run is {run.info.status}, not FINISHED; register a finished run")
    return run


def model_id_of(client, run) -> str:
    """The LoggedModel a run produced whole (its `model`), or UserError when it logged none."""
    if run.outputs and run.outputs.model_outputs:
        whole = logged_model_id(client, run)
        if whole is None:
            raise UserError(
                f"run {run.info.run_id}'s model never reached the store whole (its logging failed); "
                "`pipeline relog` logs it again from the results file"
            )
        return whole
    logged = client.search_logged_models(
        experiment_ids=[run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    if not logged:
        raise UserError(f"run {run.info.run_id} has no logged model to register (did it finish training?)")
    return logged[0].model_id


def register(client, run, *, name: str, reason: Reason, alias: str = "champion", force: bool = False) -> Registration:
    """Register `run`'s model as a new version of `name` (unless it already is one) and alias it;
    the version's tags say why (`reason`)."""
    if not name.strip():
        raise UserError("--name: give the registered model a name, e.g. fashion-cnn")
    check_alias(alias)
    model_id = model_id_of(client, run)
    # MLflow resolves the version's `models:/m-...` source through its fluent tracking URI.
    with fluent_target(client.tracking_uri, run.info.experiment_id):
        return _register(client, run, model_id, name=name, reason=reason, alias=alias, force=force)


def _register(client, run, model_id: str, *, name: str, reason: Reason, alias: str, force: bool) -> Registration:
    import mlflow
    from mlflow.exceptions import MlflowException

    run_id = run.info.run_id
    try:
        if not force:
            _check_not_worse(client, run, name, alias)
        # By run id (hex), not by name: a name with a quote in it ("o'brien") breaks a filter string.
        existing = [v for v in every(client.search_model_versions, f"run_id = '{run_id}'") if v.name == name]
        created = force or not existing
        if created:
            # MLflow's register_model, not the client's create_model_version: it creates the registered
            # model where there is none, and links the version on its logged model, so that the
            # model's page in the UI shows it registered.
            version = mlflow.register_model(f"models:/{model_id}", name, tags=version_tags(run, reason))
            client.update_model_version(name, version.version, description=version_description(run, reason))
            if not client.get_registered_model(name).description:
                client.update_registered_model(name, description="Fashion-MNIST CNN trained by `pipeline`")
        else:
            version = max(existing, key=lambda v: int(v.version))
        client.set_registered_model_alias(name, alias, version.version)
    except MlflowException as exc:
        raise UserError(f"registering {name!r}: {first_line(exc)}") from None
    return Registration(name, str(version.version), alias, run_id, reason, created)


def _check_not_worse(client, run, name: str, alias: str) -> None:
    """UserError when `alias` holds a model of another run that is more accurate than `run`'s (their
    final test accuracy): moving it there takes --force."""
    from mlflow.exceptions import MlflowException

    try:
        held = client.get_registered_model(name).aliases.get(alias)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return  # a new name: no alias to move
    if held is None:
        return
    version = client.get_model_version(name, held)
    if version.run_id == run.info.run_id:
        return
    try:
        before = client.get_run(version.run_id).data.metrics.get(FINAL_ACCURACY)
    except MlflowException:  # its run deleted for good: the version's own tag says what it scored
        before = None
    if before is None:
        before = float(version.tags.get(FINAL_ACCURACY, "nan"))
    after = run.data.metrics.get(FINAL_ACCURACY, math.nan)
    if after < before:
        raise UserError(
            f"{name}@{alias} is version {held} (run {version.run_id[:8]}, test acc {before:.4f}); run "
            f"{run.info.run_id[:8]}'s model is less accurate ({after:.4f}), so the alias stays: "
            f"`pipeline register --name {name} --run-id {run.info.run_id} --alias {alias} --force` moves it"
        )


def version_tags(run, reason: Reason) -> dict[str, str]:
    """A new version's tags: the run it came from, why it was picked, and its setting: every grid key
    the run logged as a param (config.KEYS), the hardware and device it used, and its figures."""
    tags: dict[str, Any] = {
        TAG_SOURCE_RUN: run.info.run_id,
        **reason.tags,
        "hardware": run.data.tags.get(TAG_HARDWARE, ""),
    }
    tags.update({k: run.data.params[k] for k in KEYS if k in run.data.params})
    tags.update(
        {k: run.data.metrics[k] for k in (STEADY_EPOCH, FINAL_ACCURACY) if k in run.data.metrics and k not in tags}
    )
    tags["device_used"] = run.data.tags.get(TAG_DEVICE, run.data.params.get("device", ""))
    return {k: str(v) for k, v in tags.items()}


def version_description(run, reason: Reason) -> str:
    """A registered version's description: its setting (names.TAG_SETTING, as the sweep's view names
    it; else the run's name) with the setting's figures where the sweep was published (the figures
    `pipeline compare` gives it), else the run's own; its run; and why it was registered."""
    metrics = run.data.metrics
    setting = run.data.tags.get(TAG_SETTING) or run.info.run_name
    if SETTING_ACCURACY in metrics:  # the setting's figures, all of them (speed may be withheld)
        epoch, accuracy, runs = metrics.get(SETTING_STEADY_EPOCH), metrics[SETTING_ACCURACY], metrics.get(SETTING_RUNS)
        whose = f"the setting's, over its {int(runs)} runs" if runs and runs > 1 else "the setting's"
    else:
        epoch, accuracy, whose = metrics.get(STEADY_EPOCH), metrics.get(FINAL_ACCURACY), "the run's own"
    speed = "speed withheld" if epoch is None or epoch != epoch else f"{epoch:.3f} s/epoch"
    figures = f": {speed}, test acc {accuracy:.4f} ({whose})" if accuracy is not None else ""
    return (
        f"Setting {setting}{figures}. Model of run {run.info.run_id} ({run.info.run_name}); "
        f"registered for {reason.words}."
    )


def register_best(tracking_uri: str, comparison, name: str) -> Registration:
    """`pipeline run --register NAME`: the run the sweep's verdict names (picked_run on the comparison
    it was built from, which covers the grid's DONE points too), never another grid's sweep."""
    if comparison is None or not comparison.sweep.children:
        raise UserError("the grid has no FINISHED run to register; its failures are listed above")
    client = open_client(tracking_uri)
    run, reason = picked_run(client, comparison)
    return register(client, run, name=name, reason=reason)
