"""A published sweep, written to the store: the one place that writes a comparison to MLflow. The
parent run's `comparison/` folder and `report.html`, the sweep's saved view and the descriptions of
the parent and its experiment, the children's setting figures, order, verdict and colours, their
logged models' setting names, and the parent's TAG_BEST_RUN. `pipeline run` publishes each sweep at
its end (with its grid's axes); `pipeline compare --publish` publishes one again.

What is written is built by the presentation layer from the comparison alone (present/view.py,
comparison_folder.py, html_report.py); what it depends on in the store (the parent's tags, the grid
it trained, the best run's model, the experiment's tags) is read here and handed to it as data.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.analysis.compare import offered
from pipeline.base.names import (
    ARTIFACT_EFFECTIVE_GRID,
    TAG_BEST_RUN,
    TAG_GRID_FILE,
    TAG_GRID_SIZE,
    TAG_OPTIONS,
    TAG_OVERRIDES,
    TAG_SETTING,
)
from pipeline.present import view
from pipeline.present.comparison_folder import write_html, write_report
from pipeline.present.html_report import Provenance
from pipeline.tracking.records import every, latest_sweep, logged_model_id
from pipeline.tracking.store import ui_hint

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline.analysis.compare import Comparison
    from pipeline.present.answer import Answer


def publish(client, answer: Answer, axes: Sequence[tuple[str, tuple]] | None = None) -> None:
    """Everything a sweep shows in MLflow, written again from `comparison`: the parent run's
    `comparison/` folder and `report.html`, then the saved view and the descriptions (`publish_view`).
    `axes`: the grid's (a sweep that just ran); else the settings the sweep varies. The parent's
    TAG_BEST_RUN follows the verdict it publishes: the run of the model it offers (compare.offered: the
    best setting's, the most accurate's where every run is contended), so the tag, the descriptions and
    `pipeline register` name one run.
    `answer` (present.answer) is worked out once for the folder, the report and the description."""
    comparison = answer.comparison
    with tempfile.TemporaryDirectory(prefix="pipeline-publish-") as temporary:
        folder = Path(temporary)
        write_report(answer, folder / "comparison")
        write_html(answer, folder / view.REPORT, provenance(client, comparison.sweep.run_id))
        client.log_artifacts(comparison.sweep.run_id, str(folder))
    publish_view(client, answer, axes)
    best = offered(comparison)
    if best is not None:
        client.set_tag(comparison.sweep.run_id, TAG_BEST_RUN, best.run_id)
    elif TAG_BEST_RUN in client.get_run(comparison.sweep.run_id).data.tags:
        client.delete_tag(comparison.sweep.run_id, TAG_BEST_RUN)


def publish_view(client, answer: Answer, axes: Sequence[tuple[str, tuple]] | None = None) -> None:
    """Write what the UI opens on (view.py): the sweep's saved view, its children's colours, order and
    setting figures, the parent's description and, where the sweep is its experiment's latest, the
    experiment's. `axes`: the grid's (a sweep that just ran); else the settings the sweep varies."""
    comparison = answer.comparison
    sweep = comparison.sweep
    tags = client.get_run(sweep.run_id).data.tags
    grid_file = tags.get(TAG_GRID_FILE, "the grid file")
    summary = view.parent_summary(comparison, grid_file, tags.get(TAG_GRID_SIZE, "?"))
    view_link = None
    if view.supported():
        # internal: MLflow's UI saved-view format, no public API (view.VERIFIED_UI)
        client.set_experiment_tag(sweep.experiment_id, *view.view_tag(comparison))
        view_link = view.relative_page(sweep.experiment_id, sweep.run_id)
    _mark_children(client, comparison)
    _tag_models(client, comparison)
    client.set_tag(sweep.run_id, view.NOTE_TAG, view.parent_note(answer, sweep.run_id, summary))
    if axes is None:
        if latest_sweep(client, sweep.experiment_name).info.run_id != sweep.run_id:
            return  # an older sweep published again leaves the experiment's description to the latest
        axes = view.swept_axes(comparison)
    best = offered(comparison)
    model_link = view.model_page(sweep.experiment_id, logged_model_id(client, best.run_id) if best else None)
    client.set_experiment_tag(
        sweep.experiment_id,
        view.NOTE_TAG,
        view.experiment_note(answer, grid_file, list(axes), view_link, model_link),
    )


def _mark_children(client, comparison: Comparison) -> None:
    """Each child's part of the view (view.child_updates: only what differs from what it holds), one
    batch a run: a sweep published again as it was writes nothing."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    for update in view.child_updates(comparison):
        client.log_batch(
            update.run_id,
            metrics=[Metric(name, value, now, 0) for name, value in update.metrics.items()],
            tags=[RunTag(key, value) for key, value in update.tags.items()],
        )


def _tag_models(client, comparison: Comparison, chunk: int = 100) -> None:
    """Each child's logged model gets its setting's name (names.TAG_SETTING, view.run_settings), as
    the run does. Only what differs is written."""
    setting = view.run_settings(comparison)
    run_ids = list(setting)
    for start in range(0, len(run_ids), chunk):
        quoted = ", ".join(f"'{run_id}'" for run_id in run_ids[start : start + chunk])
        for model in every(
            client.search_logged_models, [comparison.sweep.experiment_id], filter_string=f"source_run_id IN ({quoted})"
        ):
            wanted = setting[model.source_run_id]
            if model.tags.get(TAG_SETTING) != wanted:
                client.set_logged_model_tags(model.model_id, {TAG_SETTING: wanted})


def provenance(client, parent_run_id: str) -> Provenance:
    """Where the sweep came from, as its report says it (html_report.Provenance): its grid, options and
    store, from its parent run's tags and its grid artifact."""
    tags = client.get_run(parent_run_id).data.tags
    options = tags.get(TAG_OPTIONS, "")
    found = Provenance(
        client.tracking_uri,
        tags.get(TAG_GRID_FILE, ""),
        tags.get(TAG_OVERRIDES, ""),
        "" if options == "none" else options,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="pipeline-report-") as folder:
            path = client.download_artifacts(parent_run_id, ARTIFACT_EFFECTIVE_GRID, folder)
            found.grid_text = Path(path).read_text(encoding="utf-8")
    except Exception as exc:  # an old sweep without it, or an artifact store this machine cannot read
        found.notes.append(f"its grid could not be read from the parent run ({exc.__class__.__name__})")
    return found


def link(client, comparison: Comparison) -> str:
    """The sweep's link as printed (view.link), with the command that starts the UI on a local store:
    its saved view where one is published, else its runs. Reads only: `publish` writes the view."""
    sweep = comparison.sweep
    hint = ui_hint(client.tracking_uri, sweep.experiment_id)
    shown = view.supported() and view.published(comparison, client.get_experiment(sweep.experiment_id).tags)
    return view.link(comparison, hint, shown)
