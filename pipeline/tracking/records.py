"""What a store holds, read back as plain data (`base.runs`' RunRecord and SweepRecord): a sweep and
its runs, and the runs already done.

`compare`, `report` and the runner work on these records, so they need no MLflow types of their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pipeline.base.names import TAG_COMPLETE, TAG_DONE_RUNS, TAG_GRID_SIZE, TAG_ROLE, TAG_RUN_KEY
from pipeline.base.runs import RunRecord, SweepRecord
from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.measures.timing import has_end_figures
from pipeline.tracking.store import first_line

if TYPE_CHECKING:
    from mlflow.entities import Run

# Runs per store read. MLflow's search calls return one page (search_runs: 1000 by default, 50000 at
# most) and a token for the next; every read here follows the tokens to the end (`every`).
PAGE_SIZE = 1000
NAMES_SHOWN = 20  # experiment names an error message lists; it counts the rest
_RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id, as `--baseline` tells one from an experiment name


def every(search: Callable[..., Any], *args: Any, page_size: int = PAGE_SIZE, **kwargs: Any) -> Iterator[Any]:
    """Each result of one of MLflow's paged searches (`client.search_runs`, `search_experiments`,
    `search_model_versions`, ...), page after page until the store returns no next-page token: a
    read of many runs never stops silently at the first page."""
    token = None
    while True:
        page = search(*args, max_results=page_size, page_token=token, **kwargs)
        yield from page
        token = page.token
        if not token:
            return


def all_runs(
    client,
    experiment_ids: list[str],
    filter_string: str = "",
    order_by: list[str] | None = None,
    page_size: int = PAGE_SIZE,
) -> list:
    """Every run of `experiment_ids` that matches `filter_string`, in `order_by`'s order: all pages."""
    return list(every(client.search_runs, experiment_ids, filter_string, order_by=order_by, page_size=page_size))


def record(
    client,
    run,
    histories: tuple[str, ...] = (),
    known: dict[str, list[float]] | None = None,
    charted: tuple[str, ...] = (),
) -> RunRecord:
    """One MLflow run as a RunRecord, with per-epoch histories: of each metric in `charted` (what a
    chart draws), and of each in `histories` only where the run did not log its end figures
    (timing.has_end_figures: a run made before children logged them, whose figures are worked out
    from these). Each is read from the store, or taken from `known` (what this process logged, see
    timing.histories_of)."""
    result = RunRecord(
        run.info.run_id, run.info.run_name, dict(run.data.params), dict(run.data.metrics), dict(run.data.tags)
    )
    wanted = charted if has_end_figures(result.metrics) else (*charted, *(h for h in histories if h not in charted))
    for name in wanted:
        if known is not None and name in known:
            result.histories[name] = known[name]
            continue
        if name not in result.metrics:  # never logged (energy on most CPUs): its history is empty, no read
            result.histories[name] = []
            continue
        result.histories[name] = history(client, run.info.run_id, name)
    return result


def history(client, run_id: str, metric: str) -> list[float]:
    """A run's values of `metric`, by step. One read per run and metric: MLflow 3.17's client has
    no public bulk history read."""
    return [m.value for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)]


def finished_by_key(client, experiment_id: str | None) -> dict[str, Run]:
    """Complete runs of an experiment by run key (the newest per key): FINISHED with their summary and
    model logged (`complete`); none when the experiment does not exist yet."""
    if experiment_id is None:
        return {}
    runs = all_runs(
        client,
        [experiment_id],
        f"tags.`{TAG_RUN_KEY}` LIKE '%' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time ASC"],
    )
    return {run.data.tags[TAG_RUN_KEY]: run for run in runs if complete(run)}  # oldest first: the newest per key stays


def complete(run) -> bool:
    """Whether a FINISHED run is done: it carries the completion tag, set once its summary and model
    were logged, or (a run written before that tag) it has a logged model. A run that ended in
    between (MLflow's FINISHED before the model) is trained again."""
    if run.data.tags.get(TAG_COMPLETE) == "true":
        return True
    return bool(run.outputs and run.outputs.model_outputs)


def experiment_id_of(client, name: str) -> str | None:
    """The id of a live experiment, or None when there is none by that name (nothing is created)."""
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None and found.lifecycle_stage != "deleted" else None


def deleted_experiment(uri: str, name: str, experiment_id: str) -> UserError:
    """The error for an experiment that was deleted (client.delete_experiment, the UI's delete): its
    runs are hidden, not gone, so say how to restore it rather than to run a grid first."""
    return UserError(
        f"experiment {name!r} (id {experiment_id}) is deleted in {redact(uri)}; restore it with "
        f"`MLFLOW_TRACKING_URI={redact(uri)} mlflow experiments restore --experiment-id {experiment_id}`,"
        " or use another experiment name"
    )


def sweep_parent(client, run_id: str, option: str = "--parent-run"):
    """The run `run_id`, which should be a sweep's parent run; UserError naming the sweep when it is
    one of a sweep's grid points (a child run), with the id to pass to `option` instead."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    run = client.get_run(run_id)
    parent_id = run.data.tags.get(MLFLOW_PARENT_RUN_ID)
    if parent_id and run.data.tags.get(TAG_ROLE) != "sweep":
        try:
            name = repr(client.get_run(parent_id).info.run_name) + " "
        except MlflowException:  # the parent was deleted for good: its id is still the one to name
            name = ""
        raise UserError(f"run {run_id} is a grid point of sweep {name}({parent_id}); pass {option} {parent_id}")
    return run


def read_sweep(
    client,
    experiment: str | None = None,
    parent_run_id: str | None = None,
    histories: tuple[str, ...] = (),
    known: dict[str, dict[str, list[float]]] | None = None,
    charted: tuple[str, ...] = (),
    option: str = "--parent-run",
) -> SweepRecord:
    """A sweep's parent and its FINISHED runs; by default the latest sweep (of `experiment`). Its runs
    are the children it trained and the DONE runs of earlier sweeps it counted for the grid points it
    skipped (done_tags), those first: the sweep's comparison covers its whole grid.

    The children come from paged searches, each with the last value of every metric: the figures a
    child logged at its end. Per-epoch histories cost one read per run and metric, so they are read
    only as `record` says: `charted` for every child, `histories` for a child without end figures.
    `known`: histories by run id that the caller logged itself, not read back (a sweep's own runs).

    Raises UserError when there is nothing to read, when `parent_run_id` is a grid point (naming its
    sweep, and `option` as the way to pass it) and when the sweep's experiment is deleted.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    try:
        parent = sweep_parent(client, parent_run_id, option) if parent_run_id else latest_sweep(client, experiment)
        found = client.get_experiment(parent.info.experiment_id)
        if found.lifecycle_stage == "deleted":
            raise deleted_experiment(client.tracking_uri, found.name, found.experiment_id)
        runs = all_runs(
            client,
            [parent.info.experiment_id],
            f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time ASC"],
        )
        own = {run.info.run_id for run in runs}
        done = finished_runs(client, parent.info.experiment_id, done_run_ids(parent.data.tags))
        runs = [run for run in done if run.info.run_id not in own] + runs
        children = [record(client, run, histories, (known or {}).get(run.info.run_id), charted) for run in runs]
        earlier = sweep_names(client, {run.data.tags.get(MLFLOW_PARENT_RUN_ID, "") for run in done})
        experiment_name = found.name
    except MlflowException as exc:
        raise UserError(f"{redact(client.tracking_uri)}: {first_line(exc)}") from None
    planned = parent.data.tags.get(TAG_GRID_SIZE, "")
    return SweepRecord(
        parent.info.run_id,
        parent.info.run_name,
        parent.info.experiment_id,
        experiment_name,
        children,
        status=parent.info.status,
        planned=int(planned) if planned.isdigit() else None,
        earlier=earlier,
    )


# MLflow's limit on a tag's value (mlflow/utils/validation.py MAX_TAG_VAL_LENGTH): a sweep's DONE
# run ids go in as many tags as they need.
MAX_TAG_CHARS = 8000
IDS_PER_SEARCH = 100  # run ids in one `attributes.run_id IN (...)` filter


def done_tags(run_ids: list[str]) -> dict[str, str]:
    """A parent's tags naming the DONE runs its sweep counts (names.TAG_DONE_RUNS): 32-character ids,
    comma-separated, as many to a tag as fit."""
    per_tag = MAX_TAG_CHARS // 33
    chunks = [run_ids[start : start + per_tag] for start in range(0, len(run_ids), per_tag)]
    return {_done_key(n): ",".join(chunk) for n, chunk in enumerate(chunks, start=1)}


def done_run_ids(tags: dict[str, str]) -> list[str]:
    """The DONE runs a parent's tags name (done_tags), in order."""
    ids, n = [], 1
    while (value := tags.get(_done_key(n))) is not None:
        ids += [run_id for run_id in value.split(",") if run_id]
        n += 1
    return ids


def _done_key(n: int) -> str:
    """The `n`th done tag: "pipeline.done_runs", then "pipeline.done_runs.2", ..."""
    return TAG_DONE_RUNS + (f".{n}" if n > 1 else "")


def finished_runs(client, experiment_id: str, run_ids: list[str]) -> list:
    """The FINISHED runs among `run_ids` (a deleted or failed one is left out), oldest first."""
    found = []
    for start in range(0, len(run_ids), IDS_PER_SEARCH):
        quoted = ", ".join(f"'{run_id}'" for run_id in run_ids[start : start + IDS_PER_SEARCH])
        where = f"attributes.run_id IN ({quoted}) and attributes.status = 'FINISHED'"
        found += all_runs(client, [experiment_id], where)
    return sorted(found, key=lambda run: run.info.start_time or 0)


def sweep_names(client, parent_ids: set[str]) -> dict[str, str]:
    """The run names of the sweeps `parent_ids` ('' for a run of no sweep; a parent deleted for good is
    named by its id)."""
    from mlflow.exceptions import MlflowException

    names = {}
    for parent_id in sorted(parent_ids - {""}):
        try:
            names[parent_id] = client.get_run(parent_id).info.run_name
        except MlflowException:
            names[parent_id] = parent_id[:8]
    return names


def baseline_sweep(client, baseline: str, histories: tuple[str, ...], current: SweepRecord) -> SweepRecord:
    """`pipeline compare --baseline`'s sweep, which the regression gate (gate.check) compares `current`
    against: a parent run id, or an experiment name for its latest sweep; never `current` itself."""
    by_id = bool(_RUN_ID.fullmatch(baseline))
    try:
        sweep = read_sweep(
            client, None if by_id else baseline, baseline if by_id else None, histories=histories, option="--baseline"
        )
    except UserError as exc:
        raise UserError(f"--baseline {baseline}: {exc}") from None
    if sweep.run_id == current.run_id:
        raise UserError(
            f"--baseline {baseline}: that is the sweep being compared ({sweep.name}); a sweep against "
            "itself shows no change by construction; name an earlier sweep (its parent run id)"
        )
    if not sweep.children:
        raise UserError(f"--baseline {baseline}: sweep {sweep.name!r} has no FINISHED runs")
    return sweep


def latest_sweep(client, experiment: str | None):
    if experiment:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            names = [e.name for e in every(client.search_experiments)]
            more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
            raise UserError(
                f"no experiment {experiment!r} in {redact(client.tracking_uri)}; "
                f"experiments there: {', '.join(names[:NAMES_SHOWN]) or 'none'}{more}"
            )
        if found.lifecycle_stage == "deleted":
            raise deleted_experiment(client.tracking_uri, found.name, found.experiment_id)
        experiment_ids = [found.experiment_id]
    else:
        experiment_ids = [e.experiment_id for e in every(client.search_experiments)]
    sweeps = client.search_runs(
        experiment_ids, f"tags.{TAG_ROLE} = 'sweep'", order_by=["attributes.start_time DESC"], max_results=1
    )
    if not sweeps:
        where = f"experiment {experiment!r}" if experiment else redact(client.tracking_uri)
        raise UserError(f"no sweep (a `pipeline run` parent run) in {where}; run a grid first")
    return sweeps[0]


def logged_model_id(client, run) -> str | None:
    """The model `run` (a Run, or its id) logged whole, its latest; None where it logged none. A
    model whose files never arrived (a disk that filled or a store that went away mid-log) stays
    among the run's outputs, FAILED or PENDING: never this one."""
    from mlflow.entities import LoggedModelStatus

    if isinstance(run, str):
        run = client.get_run(run)
    outputs = run.outputs.model_outputs if run.outputs is not None else []
    for output in sorted(outputs, key=lambda o: o.step, reverse=True):
        if client.get_logged_model(output.model_id).status == LoggedModelStatus.READY:
            return str(output.model_id)
    return None


def latest_experiment_id(client) -> str | None:
    """The experiment of the store's latest sweep, or None when it holds none yet."""
    try:
        return latest_sweep(client, None).info.experiment_id
    except UserError:
        return None
