"""The pipeline from Python (a notebook, a script): run a grid, get the comparison as a DataFrame.

    from pipeline import api
    sweep = api.run({"grid": {"batch_size": [100, 1000], "device": ["cpu"], "epochs": [2]}},
                    experiment="notebook", tracking_uri="sqlite:///mlflow.db")
    sweep.comparison          # one row per setting, as `pipeline compare` shows it
    api.compare(experiment="notebook")

A grid is a file or a mapping of the same shape, checked by the same code (`config.load_grid`); bad
input raises `pipeline.errors.UserError` with the one-line message the CLI prints, before anything
is written. What runs is what `pipeline run` runs (`runner.run_grid`), so the store holds the same
runs either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import UserError
from pipeline.present.report import Reporter
from pipeline.settings.config import check_repeats, load_grid
from pipeline.sweep.comparing import comparison_of
from pipeline.sweep.runner import Options, run_grid
from pipeline.tracking.store import absolute_store_uri, open_client, process_settings, resolve_tracking_uri

if TYPE_CHECKING:
    import pandas

    from pipeline.execution.outcomes import Outcome


@dataclass(frozen=True)
class SweepRun:
    """What `run` did: where the runs are, each point's outcome (grid order) and the comparison."""

    parent_run_id: str | None
    """The sweep's parent run; None when every point was already done (nothing new to group)."""
    experiment_id: str | None
    """The experiment the runs went to."""
    tracking_uri: str | None
    """The store the runs went to, as an absolute URI (a sqlite path resolved against the working folder)."""
    outcomes: list[Outcome]
    """One per grid point, in grid order: its `status` (FINISHED, DONE, SKIPPED, FAILED, NOT RUN,
    UNLOGGED, KILLED), `reason`, `run_id`, the `device` used, and `point.config`, its settings."""
    comparison: pandas.DataFrame
    """One row per setting, as `pipeline compare` shows it; empty when no run finished."""
    exit_code: int
    """What `pipeline run` would exit with: 0 every runnable point finished, 1 some run failed."""
    stopped: str = ""
    """With `repeats: auto`: why its rounds stopped, as `pipeline run` prints it."""


def run(
    grid: str | Path | Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    data_dir: str | None = None,
    repeats: int | str | None = None,
    rerun: bool = False,
    overrides: Sequence[str] = (),
    checkpoint: bool = False,
    fail_fast: bool = False,
    system_metrics: bool = False,
    quiet: bool = True,
) -> SweepRun:
    """Train every point of `grid` (a grid file, or a mapping shaped like one) under one parent run,
    as `pipeline run` does, and return the outcome with the comparison table.

    Args:
        grid: a grid file's path, or a mapping of the same shape (`{"grid": {"batch_size": [100]}}`).
        tracking_uri: the store; default `$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` here.
        experiment: the experiment; default the grid's `experiment:`, else the file's name (`notebook`
            for a mapping).
        data_dir: the Fashion-MNIST folder; default the search `pipeline data` describes.
        repeats: overrides the grid's `repeats:` (a count, or `"auto"`).
        rerun: train every point again, those with a FINISHED run too (`--rerun`).
        overrides: the `--set KEY=VALUE` items, as a list of strings.
        checkpoint: save each epoch so an interrupted point resumes (`--checkpoint`).
        fail_fast: stop at the first failed run (`--fail-fast`).
        system_metrics: log MLflow's system metrics (`--system-metrics`).
        quiet: `False` prints the progress and the results table.

    Raises:
        pipeline.errors.UserError: bad input (the grid, an override, the store, the data), with the
            one-line message the CLI prints, before anything is written.
    """
    _check_overrides(overrides)
    spec = load_grid(grid, overrides, name=experiment or "notebook")
    options = Options(
        tracking_uri=tracking_uri,
        experiment=experiment,
        data_dir=data_dir,
        rerun=rerun,
        checkpoint=checkpoint,
        fail_fast=fail_fast,
        system_metrics=system_metrics,
        repeats=None if repeats is None else check_repeats(repeats),
    )
    with process_settings():  # as the CLI runs a sweep; put back when the call returns
        result = run_grid(spec, Reporter(quiet=quiet), options)
    comparison = (
        _table(result.tracking_uri, parent_run=result.parent_run_id)
        if result.parent_run_id and result.tracking_uri
        else _empty()
    )
    return SweepRun(
        result.parent_run_id,
        result.experiment_id,
        result.tracking_uri,
        result.outcomes,
        comparison,
        result.exit_code,
        result.stopped,
    )


def _check_overrides(overrides: Any) -> None:
    """`overrides` is a list or tuple of "KEY=VALUE" strings: a bare string would be read one
    character at a time, so it is refused by name (UserError), like any other type."""
    if isinstance(overrides, (str, bytes)):
        text = overrides.decode(errors="replace") if isinstance(overrides, bytes) else overrides
        raise UserError(f"overrides: got a string {text!r}; pass a list, e.g. overrides=[{text!r}]")
    if not isinstance(overrides, (list, tuple)):
        raise UserError(
            f'overrides: got {type(overrides).__name__} {overrides!r}; pass a list of "KEY=VALUE" '
            "strings, e.g. overrides=['epochs=2']"
        )
    for index, item in enumerate(overrides):
        if not isinstance(item, str):
            raise UserError(f"overrides[{index}]: got {item!r}; each item is a \"KEY=VALUE\" string, e.g. 'epochs=2'")


def compare(
    experiment: str | None = None, parent_run: str | None = None, tracking_uri: str | None = None
) -> pandas.DataFrame:
    """The comparison of a sweep's finished runs, one row per setting (`pipeline compare`'s data):
    the sweep `parent_run`, else the latest sweep of `experiment`, else the latest sweep.

    It only reads: a store that does not exist yet is an error, not a new empty store.

    Args:
        experiment: the experiment whose latest sweep to compare.
        parent_run: the sweep's parent run id; wins over `experiment`.
        tracking_uri: the store; default `$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` here.

    Raises:
        pipeline.errors.UserError: no such store, experiment or sweep, with the CLI's message.
    """
    return _table(absolute_store_uri(resolve_tracking_uri(tracking_uri)), experiment, parent_run)


def _table(uri: str, experiment: str | None = None, parent_run: str | None = None) -> pandas.DataFrame:
    with process_settings():  # the retries and timeouts `pipeline compare` reads under
        return comparison_of(open_client(uri, must_exist=True), experiment, parent_run).table


def _empty() -> pandas.DataFrame:
    import pandas

    return pandas.DataFrame()
