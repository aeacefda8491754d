"""What the MLflow UI opens on: a saved view of each sweep, and markdown descriptions.

MLflow 3.17's runs page loads a saved view from the experiment tag `mlflow.sharedViewState.<id>`
when its URL carries `viewStateShareKey=<id>`: an envelope {name, createdAt, updatedAt, state} whose
state is the runs page's JSON (search facets and UI state), here zlib-deflated and base64-encoded
behind "deflate;" as the UI itself writes it. The view lists the sweep's children flat (filtered by
parent, sorted by epoch time: a start-time sort would fold them under the parent), shows device, the
settings that vary and each child's steady-state summary (names.STEADY_EPOCH, STEADY_IMAGES,
FINAL_ACCURACY: the figures the terminal and `pipeline compare` show) as columns, and puts a
comparison section first in the charts, speed against accuracy first of all. `mlflow.note.content`
on the experiment and on the parent run is shown as their markdown description.

What the UI keeps (3.17.2, read in its bundle and tried in a browser): the saved view is applied only
when the URL has `viewStateShareKey` and none of the search parameters (searchFilter, orderByKey,
...). Applying it writes those into the URL, so after a run page and Back the filter and sort stay
but the view's columns and charts are not applied again. Both descriptions therefore link to the
view: one click restores it. Run colours are the run tag `mlflow.runColor`, which the UI reads and
writes; each setting gets its own (COLOURS), the same as in the PNG charts.

The saved view has no public API: its format is what MLflow's UI bundle writes and reads, checked
on the versions in VERIFIED_UI. On any other MLflow the view is not written and the printed link
filters the runs page to the sweep's children instead (`searchFilter`, a URL parameter the UI has
long read), with a note saying why; never an error.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pipeline.names import (FINAL_ACCURACY, RANK, STEADY_EPOCH, STEADY_IMAGES, TAG_GRID_FILE, TAG_GRID_SIZE,
                            TIME_TO_TARGET)

# MLflow releases (major, minor) whose UI was checked to open the saved view this module writes.
VERIFIED_UI = ((3, 17),)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline.compare import Comparison

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
NOTE_TAG = "mlflow.note.content"
# Added to a runs page URL (store.RUNS_PAGE, in Model training mode): the view, as a table (the
# columns side by side); its charts are the chart icon away.
_VIEW_QUERY = "&viewStateShareKey={view}&compareRunsMode=TABLE"
COLUMN_METRICS = (STEADY_EPOCH, STEADY_IMAGES, FINAL_ACCURACY)
SECTION = "pipeline-comparison"
TRADEOFF_CHART = "comparison/accuracy_vs_time.png"  # charts.TRADEOFF_PNG
EPOCH_CHART = "comparison/epoch_duration.png"
DATASET_COLUMN = "attributes.`Dataset`"  # the UI's key for its Datasets column (its default view shows it)
RUN_COLOR_TAG = "mlflow.runColor"  # the UI's own run colour; internal, no public API (VERIFIED_UI)
# One colour per setting, in the UI and in the PNG charts: matplotlib's tab20, strong shades first.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5")


def colours(comparison: "Comparison") -> list[str]:
    """Each setting's colour, one per row of the comparison's table: by the order of their names, so
    that a setting keeps its colour whichever way a table is sorted or a store returns its runs (the
    PNGs of the sweep's end and the UI after a later `pipeline compare` agree). They repeat after 20."""
    labels = [comparison.label(row) for _, row in comparison.table.iterrows()]
    rank = {label: i for i, label in enumerate(sorted(set(labels)))}
    return [COLOURS[rank[label] % len(COLOURS)] for label in labels]


def view_id(parent_run_id: str) -> str:
    return f"sweep-{parent_run_id}"


def _mlflow_version(version: str | None) -> str:
    """`version`, or the installed MLflow's."""
    if version is not None:
        return version
    import mlflow

    return mlflow.__version__


def supported(version: str | None = None) -> bool:
    """Whether this MLflow (or `version`) is one whose UI the saved view was checked on."""
    try:
        major, minor = (int(part) for part in _mlflow_version(version).split(".")[:2])
    except ValueError:
        return False
    return (major, minor) in VERIFIED_UI


def unverified_note(version: str | None = None) -> str:
    """What a user of an unverified MLflow is told instead of getting the saved view."""
    version = _mlflow_version(version)
    checked = ", ".join(f"{major}.{minor}" for major, minor in VERIFIED_UI)
    return (f"MLflow {version}: the sweep's saved view (columns, charts) is written only for MLflow {checked}, "
            "whose UI it was checked on; the link lists the sweep's runs instead")


def relative_page(experiment_id: str, parent_run_id: str) -> str:
    """The view's link as a description carries it: relative to the UI, so it works on any host."""
    from pipeline.store import RUNS_PAGE

    return page(RUNS_PAGE.format(experiment_id=experiment_id), parent_run_id)


def page(runs_page: str, parent_run_id: str) -> str:
    """The link that opens a sweep's view, from the experiment's runs page (store.ui_hint); on an
    unverified MLflow, the runs page filtered to the sweep's children."""
    if not supported():
        return runs_page + "&searchFilter=" + quote(children_filter(parent_run_id), safe="")
    return runs_page + _VIEW_QUERY.format(view=view_id(parent_run_id))


def children_filter(parent_run_id: str) -> str:
    return f"tags.`mlflow.parentRunId` = '{parent_run_id}'"


def latest(client, experiment_id: str) -> str | None:
    """The parent run id of the experiment's most recently written sweep view, if any."""
    views = []
    for key, value in client.get_experiment(experiment_id).tags.items():
        if key.startswith(VIEW_TAG_PREFIX + "sweep-"):
            try:
                views.append((json.loads(value).get("updatedAt", 0), key[len(VIEW_TAG_PREFIX + "sweep-"):]))
            except (ValueError, AttributeError):
                continue
    return max(views)[1] if views else None


def _card(uuid: str, kind: str, **fields: Any) -> dict:
    return {"uuid": uuid, "type": kind, "runsCountToCompare": 100, "metricSectionId": SECTION,
            "deleted": False, "isGenerated": False, **fields}


def state(parent_run_id: str, settings: list[str], categorical: list[str] | None = None,
          target: str | None = None) -> dict:
    """The runs page of one sweep: its children flat and fastest first, the comparison charts first,
    speed against accuracy (time to target against accuracy where the sweep has a target) first of
    all. `settings` are the params shown: device first, then those that vary; `categorical` those of
    them the parallel coordinates take (the UI draws a param whose values all read as numbers as a
    continuous axis, which misplaces batch sizes and worker counts: those are left out). `target`:
    the sweep's target, if any."""
    metric = "METRIC"
    # The settings, the figures, then the data each run trained on (the UI's own Dataset column).
    columns = [f"params.`{k}`" for k in settings] + [f"metrics.`{m}`" for m in COLUMN_METRICS] + [DATASET_COLUMN]
    speed = TIME_TO_TARGET if target else STEADY_EPOCH
    return {
        "searchFilter": children_filter(parent_run_id),
        # The verdict's order (names.RANK): the run whose model the verdict names first, then fastest first.
        "orderByKey": f"metrics.`{RANK}`", "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": columns,  # the settings first: what a run is, then how it did
        "columnWidths": {column: 130 for column in columns},
        "runsHiddenMode": "SHOW_ALL",  # else the charts show the first 10 runs only
        "isAccordionReordered": True,  # keep the comparison section first
        "hideEmptyCharts": True,
        "compareRunSections": [{"uuid": SECTION, "name": "Comparison", "display": True, "isReordered": True,
                                "columns": 2, "deleted": False, "isGenerated": False}],
        "compareRunCharts": [
            _card("speed-vs-accuracy", "SCATTER", xaxis={"key": speed, "type": metric},
                  yaxis={"key": FINAL_ACCURACY, "type": metric}),
            _card("epoch-time", "BAR", metricKey=STEADY_EPOCH),
            _card("test-accuracy", "BAR", metricKey=FINAL_ACCURACY),
            _card("settings", "PARALLEL", selectedParams=categorical if categorical is not None else settings[:1],
                  selectedMetrics=[STEADY_EPOCH, FINAL_ACCURACY], showAllRuns=True),
        ],
    }


def envelope(name: str, view_state: dict) -> str:
    """The tag value the UI reads: a named view whose state is deflated as the UI writes it."""
    text = json.dumps(view_state, separators=(",", ":"))
    now = int(time.time() * 1000)
    packed = "deflate;" + base64.b64encode(zlib.compress(text.encode("utf-8"))).decode("ascii")
    return json.dumps({"name": name, "createdAt": now, "updatedAt": now, "state": packed})


def read_envelope(value: str) -> dict:
    """The state of a view tag (tests, and anyone checking what the UI will load)."""
    packed = json.loads(value)["state"]
    if packed.startswith("deflate;"):
        packed = zlib.decompress(base64.b64decode(packed[len("deflate;"):])).decode("utf-8")
    return json.loads(packed)


def parent_note(comparison: "Comparison", parent_run_id: str, summary: str) -> str:
    """The parent run's description: the verdict first (compare.headline), what happened, the link to
    its children's view, the speed-vs-accuracy and epoch-time charts, a compact results table (one
    row per setting: its steady-state epoch time with the interquartile range, speedups with their
    95% intervals, test accuracy), the speedup lines and notes."""
    import pandas as pd

    from pipeline.compare import headline, markdown, speedup_columns, spread

    t = comparison.table
    lines = [f"**{line}**  " for line in headline(comparison)]
    lines += ["", summary, ""]
    if not t.empty:
        sweep = comparison.sweep
        if supported():
            lines += [f"[Open the children's view]({relative_page(sweep.experiment_id, parent_run_id)}) "
                      "(their columns and charts; the runs page forgets them after a run page and Back).", ""]
        t = t.sort_values("epoch_duration_s", kind="stable")
        settings = ["device"] + comparison.varying
        frame = t[settings].copy()
        frame["n"] = t["n"]
        frame["epoch s [IQR]"] = [spread(m, q1, q3, compact=False) for m, q1, q3 in
                                  zip(t[STEADY_EPOCH], t["epoch_duration_s_q1"], t["epoch_duration_s_q3"])]
        frame = pd.concat([frame, speedup_columns(comparison, t)], axis=1)  # device, precision, compile twins
        frame["test acc"] = t[FINAL_ACCURACY].map(lambda v: f"{v:.4f}")
        if len(t) > 1 and t[STEADY_EPOCH].notna().any():  # the speed charts exist (charts.plan)
            lines += [f"![speed against accuracy]({artifact_url(parent_run_id, TRADEOFF_CHART)})", "",
                      f"![epoch time]({artifact_url(parent_run_id, EPOCH_CHART)})", ""]
        lines += [f"Epoch time: median over each setting's runs, {t['timed'].iloc[0]} (steady state when a run "
                  "had 2+ epochs); speedups with their 95% interval over the runs (none below 2 runs a side), "
                  "(n.s.) where it includes no difference.", "", markdown(frame)]
        lines += [f"- {line}" for line in comparison.speedups + comparison.notes]
    return "\n".join(lines) + "\n"


def artifact_url(run_id: str, path: str) -> str:
    """A run artifact as the UI fetches it; relative to the UI's base, so it works on any host."""
    return f"get-artifact?path={quote(path, safe='')}&run_uuid={quote(run_id, safe='')}"


def experiment_note(grid_file: str, axes: list[tuple[str, tuple]], view_link: str | None = None) -> str:
    """The experiment's description: the link to its latest sweep's view (`view_link`, where one was
    written), what its grid sweeps and how to run it again."""
    swept = ", ".join(f"`{key}` {list(values)}" for key, values in axes) or "the default settings"
    back = (f"**[Open the latest sweep's comparison view]({view_link})**: its columns and charts, again "
            "after a run page and Back.\n\n") if view_link else ""
    return back + (f"Fashion-MNIST CNN runs made by `pipeline` from `{grid_file}`, sweeping {swept}.\n\n"
            f"One parent run per sweep, one child per grid point. Run again with `pipeline run {grid_file}` "
            "(points already FINISHED on this host and hardware are skipped; `--rerun` trains them again), "
            "and compare with `pipeline compare`.\n")


def link(client, comparison: "Comparison") -> str:
    """The sweep's link, its view written (or rewritten) now so that older sweeps have one too;
    with the command that starts the UI on a local store."""
    from pipeline.store import redact, ui_hint

    try:
        publish(client, comparison)
    except Exception as exc:  # a read-only store still gets its comparison
        return f"(no saved view: {exc.__class__.__name__}: {str(exc).splitlines()[0][:120]})"
    command, url = ui_hint(client.tracking_uri, comparison.sweep.experiment_id)
    note = "" if supported() else f"  ({unverified_note()})"
    shown = page(url, comparison.sweep.run_id) + (f"  (start the UI with: {command})" if command else "") + note
    return redact(shown)  # printed: a password in the store's URI is masked


def publish(client, comparison: "Comparison", axes: "Sequence[tuple[str, tuple]] | None" = None) -> None:
    """Write the sweep's saved view and the parent's description, and with `axes` (a sweep that just
    ran) the experiment's description; an older sweep compared later leaves that one as it is."""
    sweep = comparison.sweep
    tags = client.get_run(sweep.run_id).data.tags
    grid_file = tags.get(TAG_GRID_FILE, "the grid file")
    size = tags.get(TAG_GRID_SIZE, "?")
    summary = (f"Sweep of `{grid_file}`: {len(comparison.table)} of {size} grid points FINISHED "
               f"(`pipeline compare --parent-run {sweep.run_id}` prints the full comparison).")
    settings = ["device"] + comparison.varying
    view_link = None
    if supported():
        categorical = [k for k in settings if not _numeric(comparison.table[k])]
        tag = VIEW_TAG_PREFIX + view_id(sweep.run_id)  # internal: MLflow's UI saved-view format, no public API (VERIFIED_UI)
        client.set_experiment_tag(sweep.experiment_id, tag, envelope(sweep.name, state(
            sweep.run_id, settings, categorical, comparison.target)))
        view_link = relative_page(sweep.experiment_id, sweep.run_id)
        _mark_children(client, comparison)
    client.set_tag(sweep.run_id, NOTE_TAG, parent_note(comparison, sweep.run_id, summary))
    if axes is not None:
        client.set_experiment_tag(sweep.experiment_id, NOTE_TAG, experiment_note(grid_file, list(axes), view_link))


def _numeric(values) -> bool:
    """Whether every value of a setting reads as a number (as the UI's parallel coordinates test it)."""
    try:
        [float(v) for v in values]
    except (TypeError, ValueError):
        return False
    return True


def _mark_children(client, comparison: "Comparison") -> None:
    """What each child needs for the view to show the comparison's figures: its setting's colour
    (RUN_COLOR_TAG), its place in the verdict's order (names.RANK, which the view sorts by: the run
    the verdict names first), and its steady-state summary where the run did not log one (a run made
    before children logged it): the comparison's figures from its history (compare.run_summary), so
    the columns, the sort and the bars are filled for old runs too. Only what differs is written."""
    from mlflow.entities import Metric, RunTag

    from pipeline.compare import SUMMARY, run_order

    now = int(time.time() * 1000)
    children = {run.run_id: run for run in comparison.sweep.children}
    rank = {run_id: place for place, run_id in enumerate(run_order(comparison), start=1)}
    summaries = comparison.runs[list(SUMMARY)].to_dict("index")
    for run_ids, shade in zip(comparison.table["run_ids"], colours(comparison)):
        for run_id in str(run_ids).split(","):
            logged, tags = children[run_id].metrics, children[run_id].tags
            to_log = [Metric(name, float(value), now, 0) for name, value in summaries[run_id].items()
                      if name not in logged and value == value]
            if logged.get(RANK) != rank[run_id]:
                to_log.append(Metric(RANK, float(rank[run_id]), now, 0))
            # internal: the UI's run colour (VERIFIED_UI)
            colour = [RunTag(RUN_COLOR_TAG, shade)] if tags.get(RUN_COLOR_TAG) != shade else []
            if to_log or colour:  # a sweep compared again as it was writes nothing
                client.log_batch(run_id, metrics=to_log, tags=colour)
