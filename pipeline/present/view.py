"""What the MLflow UI opens on: a saved view of each sweep, its runs' setting figures and verdict,
and markdown descriptions, built here as plain data (tag values, texts, each child's metrics and
tags). sweep/publish.py writes them when a sweep is published (`pipeline run` at its end, `pipeline
compare --publish`) and reads what they depend on; `pipeline compare` alone only reads (publish.link).

MLflow 3.17's runs page loads a saved view from the experiment tag `mlflow.sharedViewState.<id>`
when its URL carries `viewStateShareKey=<id>`: an envelope {name, createdAt, updatedAt, state} whose
state is the runs page's JSON (search facets and UI state), here zlib-deflated and base64-encoded
behind "deflate;" as the UI itself writes it. The view lists the sweep's children (filtered by
parent, in the verdict's order), its first columns each run's setting's figures (names.SETTING_*:
the numbers `pipeline compare` prints for the setting), then the setting's part of the verdict
(names.TAG_VERDICT), then device and the settings that vary; with repeats it folds the runs into one
row per setting (the UI's grouping by names.TAG_SETTING). Its charts open on a comparison section,
speed against accuracy first of all. `mlflow.note.content` on the experiment and on the parent run is
shown as their markdown description.

What the UI does (3.17.2, read in its bundle and tried in a browser): on a first visit to a local UI
its assistant panel opens by itself over the page's right third, and it folds an experiment's
description to its first line (32 px): that line is the verdict in short with the links to the best
model, the view and the report, and the figures are the table's first columns, so both stay in sight
beside the panel. The saved view is applied only when the URL has `viewStateShareKey` and none of
the search parameters (searchFilter, orderByKey, ...). Applying it writes those into the URL, so
after a run page and Back the filter and sort stay but the view's columns and charts are not applied
again: both descriptions link to the view, one click restores it. Run colours are the run tag
`mlflow.runColor`, which the UI reads and writes; each setting gets its own (palette.py), the same
as in the PNG charts. A group row (a setting with repeats) takes the colour the UI derives from its name.

The saved view has no public API: its format is what MLflow's UI bundle writes and reads, checked
on the versions in VERIFIED_UI. On any other MLflow the view is not written and the printed link
filters the runs page to the sweep's children instead (`searchFilter`, a URL parameter the UI has
long read), with a note saying why; never an error.
"""

from __future__ import annotations

import base64
import json
import math
import time
import zlib
from dataclasses import dataclass
from importlib.metadata import version as installed_version
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pipeline.analysis.compare import SUMMARY, model_run, ranks_on_target, run_order
from pipeline.analysis.figures import Figure
from pipeline.analysis.figures import figures as table_figures
from pipeline.base.names import (
    FINAL_ACCURACY,
    RANK,
    SETTING_ACCURACY,
    SETTING_IMAGES,
    SETTING_RUNS,
    SETTING_STEADY_EPOCH,
    SETTING_TO_TARGET,
    STEADY_EPOCH,
    STEADY_IMAGES,
    TAG_IN_SWEEP,
    TAG_SETTING,
    TAG_VERDICT,
)
from pipeline.base.uris import RUNS_PAGE, redact
from pipeline.measures.timing import significant
from pipeline.present.answer import Answer, bold, markdown
from pipeline.present.palette import colours
from pipeline.present.sentences import claims

# MLflow releases (major, minor) whose UI was checked to open the saved view this module writes.
VERIFIED_UI = ((3, 17),)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline.analysis.compare import Comparison

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
NOTE_TAG = "mlflow.note.content"
# Added to a runs page URL (uris.RUNS_PAGE, in Model training mode): the view, as a table (the
# columns side by side); its charts are the chart icon away.
_VIEW_QUERY = "&viewStateShareKey={view}&compareRunsMode=TABLE"
# The view's first columns: each run's setting's figures, the numbers of `pipeline compare`'s row
# for it (setting_figures); the time to target only where the sweep has a target. Then the figure
# table's figures shown in the UI (figures.Figure.in_view) that some setting has, then its run count.
COLUMN_METRICS = (SETTING_STEADY_EPOCH, SETTING_IMAGES, SETTING_ACCURACY, SETTING_TO_TARGET)
SECTION = "pipeline-comparison"
REPORT = "report.html"  # the sweep's shareable report (html_report.py), on the parent run
COMPARISON_FOLDER = "comparison"  # the parent run's charts and tables (comparison_folder.write_report)
DATASET_COLUMN = "attributes.`Dataset`"  # the UI's key for its Datasets column (its default view shows it)
RUN_COLOR_TAG = "mlflow.runColor"  # the UI's own run colour; internal, no public API (VERIFIED_UI)


def view_id(parent_run_id: str) -> str:
    return f"sweep-{parent_run_id}"


def _mlflow_version(version: str | None) -> str:
    """`version`, or the installed MLflow's (its distribution's, read without importing it)."""
    if version is not None:
        return version
    return installed_version("mlflow")


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
    return (
        f"MLflow {version}: the sweep's saved view (columns, charts) is written only for MLflow {checked}, "
        "whose UI it was checked on; the link lists the sweep's runs instead"
    )


def relative_page(experiment_id: str, parent_run_id: str) -> str:
    """The view's link as a description carries it: relative to the UI, so it works on any host."""

    return page(RUNS_PAGE.format(experiment_id=experiment_id), parent_run_id)


def report_page(experiment_id: str, parent_run_id: str) -> str:
    """The UI's page that shows the sweep's report in place (its run's artifact view), relative to the
    UI. The artifact's own address downloads it: MLflow serves artifacts as attachments."""
    return f"#/experiments/{experiment_id}/runs/{parent_run_id}/artifactPath/{REPORT}?workflowType=machine_learning"


def page(runs_page: str, parent_run_id: str, published: bool = True) -> str:
    """The link that opens a sweep's view, from the experiment's runs page (store.ui_hint); on an
    unverified MLflow, or for a sweep whose view was never published, the runs page filtered to the
    sweep's children."""
    if not supported() or not published:
        return runs_page + "&searchFilter=" + quote(children_filter(parent_run_id), safe="")
    return runs_page + _VIEW_QUERY.format(view=view_id(parent_run_id))


def children_filter(parent_run_id: str) -> str:
    return f"tags.`mlflow.parentRunId` = '{parent_run_id}'"


def rows_filter(parent_run_id: str) -> str:
    """The saved view's filter: one run a setting of the sweep (names.TAG_IN_SWEEP "setting": its
    model run), DONE points trained by an earlier sweep included, which a filter by parent misses."""
    return f"tags.`{TAG_IN_SWEEP}{parent_run_id}` = 'setting'"


def latest(experiment_tags: dict[str, str]) -> str | None:
    """The parent run id of the experiment's most recently written sweep view, if any, from the
    experiment's tags."""
    views = []
    for key, value in experiment_tags.items():
        if key.startswith(VIEW_TAG_PREFIX + "sweep-"):
            try:
                views.append((json.loads(value).get("updatedAt", 0), key[len(VIEW_TAG_PREFIX + "sweep-") :]))
            except (ValueError, AttributeError):
                continue
    return max(views)[1] if views else None


def _card(uuid: str, kind: str, **fields: Any) -> dict:
    return {
        "uuid": uuid,
        "type": kind,
        "runsCountToCompare": 100,
        "metricSectionId": SECTION,
        "deleted": False,
        "isGenerated": False,
        **fields,
    }


def state(
    parent_run_id: str,
    settings: list[str],
    categorical: list[str] | None = None,
    target: str | None = None,
    more: tuple[str, ...] = (),
) -> dict:
    """The runs page of one sweep: one row a setting (rows_filter: the run that stands for it, its
    model run, named by the settings that vary) in the verdict's order, its figures first, the
    comparison charts first,
    speed against accuracy first of all. The figures are the setting's (names.SETTING_*: the numbers
    `pipeline compare` prints for it), so every row and chart point is a setting's, with no UI
    aggregate ("(min)") over its repeats, and every setting is one point on the speed chart (its
    steady epoch time: every setting has one, where time to target leaves out those that missed it).
    `settings` are the params shown after the figures: device first, then those that vary;
    `categorical` those of them the parallel coordinates take (the UI draws a param whose values all
    read as numbers as a continuous axis, which misplaces batch sizes and worker counts: those are
    left out). `target`: the sweep's target, if any (its time-to-target column). `more`: the setting
    figures of the figure table's that some setting has (setting_figures), shown before its count."""
    metric = "METRIC"
    leading = [m for m in COLUMN_METRICS if target or m != SETTING_TO_TARGET]
    figures = [*leading, *more, SETTING_RUNS]
    # The figures first (MLflow's assistant panel, open on a first visit, covers the table's right
    # side), then the settings, then the data each run trained on (the UI's own Dataset column).
    columns = (
        [f"metrics.`{m}`" for m in figures]
        + [f"tags.`{TAG_VERDICT}`"]
        + [f"params.`{k}`" for k in settings]
        + [DATASET_COLUMN]
    )
    return {
        "searchFilter": rows_filter(parent_run_id),
        # The verdict's order (names.RANK): the run whose model the verdict names first, then fastest first.
        "orderByKey": f"metrics.`{RANK}`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": {column: 110 if column.startswith("metrics.") else 120 for column in columns}
        | {f"tags.`{TAG_VERDICT}`": 360},
        "runsHiddenMode": "SHOW_ALL",  # else the charts show the first 10 runs only
        "isAccordionReordered": True,  # keep the comparison section first
        "hideEmptyCharts": True,
        "compareRunSections": [
            {
                "uuid": SECTION,
                "name": "Comparison",
                "display": True,
                "isReordered": True,
                "columns": 2,
                "deleted": False,
                "isGenerated": False,
            }
        ],
        "compareRunCharts": [
            _card(
                "speed-vs-accuracy",
                "SCATTER",
                xaxis={"key": SETTING_STEADY_EPOCH, "type": metric},
                yaxis={"key": SETTING_ACCURACY, "type": metric},
            ),
            _card("epoch-time", "BAR", metricKey=SETTING_STEADY_EPOCH),
            _card("test-accuracy", "BAR", metricKey=SETTING_ACCURACY),
            _card(
                "settings",
                "PARALLEL",
                selectedParams=categorical if categorical is not None else settings[:1],
                selectedMetrics=[SETTING_STEADY_EPOCH, SETTING_ACCURACY],
                showAllRuns=True,
            ),
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
        packed = zlib.decompress(base64.b64decode(packed[len("deflate;") :])).decode("utf-8")
    return json.loads(packed)


def markdown_text(text: str) -> str:
    """Our words as MLflow's markdown (showdown) renders them as written: brackets and emphasis marks
    backslash-escaped (showdown's own escapes), so that "1.19x faster [0.66-1.72] (n.s.)" is not
    turned into a link to "n.s." and "num_workers=0 ... batch_size" into italics; "<" as an HTML
    entity (showdown has no backslash escape for it: "test_loss <= 0.3"). Code spans (`...`) are
    left whole."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = "".join("\\" + c if c in _MARKDOWN_SPECIAL else "&lt;" if c == "<" else c for c in parts[i])
    return "`".join(parts)


_MARKDOWN_SPECIAL = set("\\[]*_>|")


def parent_note(answer: Answer, parent_run_id: str, summary: str) -> str:
    """The parent run's description: its answer (answer.markdown: the verdict, the decision table, the
    speedup lines and notes, and the charts from its `comparison/` artifacts), with what the sweep
    did (`summary`) and the links to its view and report after the verdict."""
    comparison = answer.comparison
    sweep = comparison.sweep
    lines = [summary, ""]
    if not comparison.table.empty:
        links = [
            f"{_report_link(sweep.experiment_id, parent_run_id, 'Open the report')}: the verdict, "
            "the table and the charts in one file, to share"
        ]
        if supported():
            links.insert(
                0,
                f"[Open the children's view]({relative_page(sweep.experiment_id, parent_run_id)}) "
                "(their columns and charts; the runs page forgets them after a run page and Back)",
            )
        lines += [f"{link}  " for link in links] + [""]
    image = lambda name: artifact_url(parent_run_id, f"{COMPARISON_FOLDER}/{name}")  # noqa: E731
    return markdown(answer, markdown_text, image, after_verdict=lines)


def artifact_url(run_id: str, path: str) -> str:
    """A run artifact as the UI fetches it; relative to the UI's base, so it works on any host."""
    return f"get-artifact?path={quote(path, safe='')}&run_uuid={quote(run_id, safe='')}"


def experiment_note(
    answer: Answer,
    grid_file: str,
    axes: Sequence[tuple[str, tuple]],
    view_link: str | None = None,
    model_link: str | None = None,
) -> str:
    """The experiment's description, which the UI shows above its runs folded to its first line: that
    line is the links to the best setting's model (`model_link`), the sweep's view (`view_link`,
    where one was written) and its report, then its latest sweep's verdict whole in a few words
    (Answer.short); then the answer's verdict, a claim a line in bold as answer.markdown
    writes it, what the grid sweeps and how to run it again."""
    comparison = answer.comparison
    sweep = comparison.sweep
    swept = ", ".join(f"`{key}` {list(values)}" for key, values in axes) or "the default settings"
    links = [f"[its model]({model_link})"] if model_link and supported() else []
    links += [f"[comparison view]({view_link})"] if view_link else []
    links.append(_report_link(sweep.experiment_id, sweep.run_id, "report"))
    said = answer.short
    lines = [
        # The links first: a 1024-pixel window with MLflow's assistant panel open shows some 55
        # characters of this line before it folds, and the links must stay in sight.
        " · ".join(links) + (f" · **{markdown_text(said)}**" if said else ""),
        "",
        f"The latest sweep, {markdown_text(sweep.name)}:  ",
        *[bold(line, markdown_text) for line in answer.verdict],
        "",
    ]
    if view_link:
        lines.append(
            f"[Open its comparison view]({view_link}): its columns and charts, again after a run page and Back.  "
        )
    lines += [
        f"{_report_link(sweep.experiment_id, sweep.run_id, 'Open its report')}: the verdict, the table and the "
        "charts in one file, to share.",
        "",
    ]
    return "\n".join(lines) + (
        f"\nFashion-MNIST CNN runs made by `pipeline` from `{grid_file}`, sweeping {swept}.\n\n"
        f"One parent run per sweep, one child per grid point. Run again with `pipeline run {grid_file}` "
        "(points already FINISHED on this host and hardware are skipped; `--rerun` trains them again), "
        "and compare with `pipeline compare`.\n"
    )


def _report_link(experiment_id: str, parent_run_id: str, words: str) -> str:
    """The report as a description links it: to the UI's page that shows it, on a verified MLflow (a
    route of its UI); elsewhere named in words."""
    if supported():
        return f"[{words}]({report_page(experiment_id, parent_run_id)})"
    return f"`{REPORT}` in the artifacts of run {parent_run_id}"


def model_page(experiment_id: str, model_id: str | None) -> str | None:
    """The UI's page of the best setting's model (`model_id`: compare.pick's run's logged model),
    relative to the UI; None where there is none (no best: speed withheld; or its run logged no model)."""
    if model_id is None:
        return None
    return f"#/experiments/{experiment_id}/models/{model_id}?workflowType=machine_learning"


def published(comparison: Comparison, experiment_tags: dict[str, str]) -> bool:
    """Whether the sweep's saved view is among its experiment's tags (written by `pipeline run` at its
    end, or by `pipeline compare --publish`)."""
    return VIEW_TAG_PREFIX + view_id(comparison.sweep.run_id) in experiment_tags


def link(comparison: Comparison, hint: tuple[str, str], shown: bool) -> str:
    """The sweep's link as printed, with the command that starts the UI on a local store (`hint`:
    store.ui_hint's command and runs page): its saved view where one is `shown` (published, on a
    verified MLflow), else its runs."""
    command, url = hint
    if not supported():
        note = f"  ({unverified_note()})"
    elif not shown:
        note = "  (no saved view yet: `pipeline compare --publish` writes it)"
    else:
        note = ""
    text = page(url, comparison.sweep.run_id, shown) + (f"  (start the UI with: {command})" if command else "") + note
    return redact(text)  # printed: a password in the store's URI is masked


def parent_summary(comparison: Comparison, grid_file: str, size: str) -> str:
    """What the sweep did, as the parent's description says it (parent_note's `summary`): its grid
    file and settings, and how many of its `size` planned runs (the parent's names.TAG_GRID_SIZE)
    FINISHED."""
    sweep = comparison.sweep
    runs = len(comparison.runs)
    return (
        f"Sweep of `{grid_file}`: {len(comparison.table)} setting{'s' if len(comparison.table) != 1 else ''}, "
        f"{runs} of {size} planned runs FINISHED "
        f"(`pipeline compare --parent-run {sweep.run_id}` prints the full comparison)."
    )


def view_tag(comparison: Comparison) -> tuple[str, str]:
    """The experiment tag that holds the sweep's saved view, and its value (`envelope` of `state`):
    device and the settings that vary as its columns, those that do not read as numbers on its
    parallel coordinates, its runs folded per setting where some setting has repeats. Written only on
    a verified MLflow (`supported`): the format is the UI's, with no public API (VERIFIED_UI)."""
    sweep = comparison.sweep
    settings = ["device"] + comparison.varying
    categorical = [k for k in settings if not _numeric(comparison.table[k])]
    return VIEW_TAG_PREFIX + view_id(sweep.run_id), envelope(
        sweep.name, state(sweep.run_id, settings, categorical, comparison.target, _in_view(comparison))
    )


def swept_axes(comparison: Comparison) -> list[tuple[str, tuple]]:
    """Device and the settings the sweep varies, each with its values: the experiment description's
    axes where the grid's are not at hand (a sweep published again by `pipeline compare --publish`)."""
    return [(k, tuple(dict.fromkeys(comparison.table[k]))) for k in ["device"] + comparison.varying]


def run_settings(comparison: Comparison) -> dict[str, str]:
    """Each child's setting name (setting_names, names.TAG_SETTING), by run id: what its run and its
    logged model carry. The experiment's Models tab can then be searched by setting (`tags.`pipeline.
    setting` = 'cpu bs128 w0'`); the model itself keeps the name `model`, so that `runs:/RUN_ID/model`
    stays its URI (MLflow resolves that path by the logged model's name)."""
    return {
        run_id: label
        for run_ids, label in zip(comparison.table["run_ids"], setting_names(comparison))
        for run_id in str(run_ids).split(",")
    }


def setting_names(comparison: Comparison) -> list[str]:
    """Each setting's name as its runs carry it (names.TAG_SETTING), one per row of the comparison's
    table: its label ("cpu bs128 w0"), made unique where rows share one (other hardware, other data
    sizes) by what tells them apart, since the view folds runs of one name into one row."""
    labels = comparison.labels()
    if len(set(labels)) == len(labels):
        return labels
    t = comparison.table
    apart = [k for k in ("hardware", "train_size", "test_size", "host") if k in t and t[k].nunique() > 1]
    names = [" ".join([label, *(f"{k}={t.at[i, k]}" for k in apart)]) for i, label in zip(t.index, labels)]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):  # still the same: numbered
        seen[name] = seen.get(name, 0) + 1
        names[i] = name if seen[name] == 1 else f"{name} #{seen[name]}"
    return names


def setting_figures(comparison: Comparison) -> list[dict[str, float]]:
    """Each setting's figures as its runs carry them (names.SETTING_*), one dict per row of the
    comparison's table: the table's own numbers, so the UI's rows equal `pipeline compare`'s. A figure
    the setting lacks (speed withheld, a target missed) is left out."""
    rows = []
    for _, row in comparison.table.iterrows():
        figures = {
            SETTING_STEADY_EPOCH: row[STEADY_EPOCH],
            SETTING_IMAGES: row[STEADY_IMAGES],
            SETTING_ACCURACY: row[FINAL_ACCURACY],
            SETTING_RUNS: row["n"],
        }
        # Rounded as the terminal shows them (the UI prints a metric whole: 0.0020334774824236792).
        if comparison.target is not None and ranks_on_target(row):
            figures[SETTING_TO_TARGET] = significant(row["time_to_target_s"], 4)
        for figure in in_view():
            if figure.name in row and row[figure.name] == row[figure.name]:
                figures[setting_metric(figure)] = round(row[figure.name], 4)
        rows.append({name: float(value) for name, value in figures.items() if value == value})
    return rows


def in_view() -> list[Figure]:
    """The figure table's figures the UI's view shows (figures.Figure.in_view)."""
    return [f for f in table_figures() if f.in_view]


def setting_metric(figure: Figure) -> str:
    """The metric a child carries its setting's value of `figure` as (setting_figures)."""
    return f"setting_{figure.name}"


def _in_view(comparison: Comparison) -> tuple[str, ...]:
    """The view's columns of in_view figures that some setting of the sweep has (runs made before a
    figure was logged have none)."""
    t = comparison.table
    return tuple(setting_metric(f) for f in in_view() if f.name in t and bool(t[f.name].notna().any()))


def _numeric(values) -> bool:
    """Whether every value of a setting reads as a number (as the UI's parallel coordinates test it)."""
    try:
        [float(v) for v in values]
    except (TypeError, ValueError):
        return False
    return True


def _known(value) -> bool:
    return value is not None and value == value


def _same(logged, value: float) -> bool:
    """Whether a logged metric already holds `value` (NaN holds NaN)."""
    return logged is not None and (logged == value or (logged != logged and value != value))


@dataclass(frozen=True)
class ChildUpdate:
    """What one child run needs written for the view to show the comparison: the metrics and tags
    whose values differ from those it holds (sweep/publish.py logs them in one batch)."""

    run_id: str
    metrics: dict[str, float]
    tags: dict[str, str]


def child_updates(comparison: Comparison) -> list[ChildUpdate]:
    """What each child needs for the view to show the comparison's figures: its setting's figures
    (setting_figures: the same numbers as `pipeline compare`'s row), its place in the verdict's order
    (names.RANK, which the view sorts by: the run the verdict names first), its steady-state summary
    where the run did not log one (a run made before children logged it: the comparison's figures
    from its history, compare.run_summary), and on a verified MLflow its setting's colour
    (RUN_COLOR_TAG). Only what differs from what the run holds (the sweep's records): a sweep
    published again as it was needs nothing, and no child is listed."""
    children = {run.run_id: run for run in comparison.sweep.children}
    rank = {run_id: place for place, run_id in enumerate(run_order(comparison), start=1)}
    member = TAG_IN_SWEEP + comparison.sweep.run_id
    summaries = comparison.runs[list(SUMMARY)].to_dict("index")
    shades = colours(comparison) if supported() else [None] * len(comparison.table)
    updates = []
    for run_ids, stands, shade, figures, label, said in zip(
        comparison.table["run_ids"],
        [model_run(comparison, row) for _, row in comparison.table.iterrows()],
        shades,
        setting_figures(comparison),
        setting_names(comparison),
        claims(comparison),
    ):
        for run_id in str(run_ids).split(","):
            logged, tags = children[run_id].metrics, children[run_id].tags
            wanted = {
                name: float(value) for name, value in summaries[run_id].items() if name not in logged and value == value
            }
            wanted.update({RANK: float(rank[run_id]), **figures})
            # A figure the setting no longer has (speed withheld now): NaN over the old value (MLflow
            # has no public way to delete a metric), so no row shows a number no surface gives.
            wanted.update(
                {name: math.nan for name in COLUMN_METRICS if name not in figures and _known(logged.get(name))}
            )
            to_log = {name: value for name, value in wanted.items() if not _same(logged.get(name), value)}
            # internal: the UI's run colour (VERIFIED_UI)
            new_tags = {
                TAG_SETTING: label,
                TAG_VERDICT: said or "-",
                member: "setting" if run_id == stands else "repeat",
                **({RUN_COLOR_TAG: shade} if shade is not None else {}),
            }
            to_tag = {key: value for key, value in new_tags.items() if tags.get(key) != value}
            if to_log or to_tag:
                updates.append(ChildUpdate(run_id, to_log, to_tag))
    return updates
