"""A sweep's report as one HTML file that anyone can open offline: `pipeline compare --html FILE`
writes it, and every published sweep carries it as its parent run's `report.html` (MLflow's artifact
view shows it in place).

It holds the comparison's answer (answer.Answer: the verdict, the decision table with its intervals,
the speedup lines and notes), the charts (speed
against accuracy with the best trade-offs, epoch time by setting with its spread, where each epoch's
time goes), the hardware and software of every host, and the commands that run the sweep again.
Everything is inside the file: the charts are PNGs in data URIs, the style is inline, nothing is
fetched. Its numbers are the comparison's: the file also carries `pipeline compare --format json`'s
records, as they are, in a `<script type="application/json" id="comparison">` block.
"""

from __future__ import annotations

import base64
import io
import shlex
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

from pipeline.base.names import ARTIFACT_EFFECTIVE_GRID, TAG_CUDA, TAG_DEVICE, TAG_HARDWARE, TAG_HOST, TAG_TORCH
from pipeline.base.uris import redact
from pipeline.present import charts
from pipeline.present.answer import Answer
from pipeline.present.tables import render as render_data

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.analysis.compare import Comparison

# Smaller than the PNGs of comparison/: the report is read on a screen, side by side with its table.
DPI = 80

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 2em; }
.verdict { background: #f3f7fb; border-left: 4px solid #1f77b4; padding: 0.6em 1em; }
.verdict p { margin: 0.25em 0; font-weight: 600; }
table { border-collapse: collapse; margin: 0.5em 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; vertical-align: top; }
th { background: #f0f0f0; text-align: left; } td.number { text-align: right; white-space: nowrap; }
td .interval { color: #555; font-size: 0.9em; display: block; }
figure { margin: 1em 0; } figure img { max-width: 100%; }
pre { background: #f6f6f6; padding: 0.6em 1em; overflow-x: auto; }
.scroll { overflow-x: auto; }
.muted { color: #666; }
"""


@dataclass
class Provenance:
    """What the report says about where a sweep came from: read from its parent run by the caller
    (sweep/publish.py's `provenance`)."""

    tracking_uri: str = ""  # shown masked (uris.redact)
    grid_file: str = ""
    overrides: str = ""  # "--set epochs=1 --set device=cpu"
    options: str = ""  # "--system-metrics --register fashion-cnn"
    grid_text: str = ""  # the grid it trained (grid/effective.yaml), where it could be read
    notes: list[str] = field(default_factory=list)


def render(answer: Answer, source: Provenance | None = None) -> str:
    """The whole report of a comparison's answer, as text."""

    source = source or Provenance()
    comparison = answer.comparison
    sweep = comparison.sweep
    title = f"{sweep.name} ({sweep.experiment_name})"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}: pipeline report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="muted">{len(comparison.table)} settings, {len(comparison.runs)} finished runs; parent run '
        f"<code>{escape(sweep.run_id)}</code></p>",
        '<section class="verdict" id="verdict">',
        *(f"<p>{escape(line)}</p>" for line in answer.verdict),
        "</section>",
        "<h2>Settings</h2>",
        f'<p class="muted">{escape(answer.title)}</p>',
        _table(answer.stacked, _settings_text(answer), "settings"),
        *(f"<p>{escape(line)}</p>" for line in answer.speedups),
        *(f'<p class="muted">{escape(line)}</p>' for line in answer.notes),
        *_every_figure(answer),
        *_utilisation(answer),
        "<h2>Charts</h2>",
        *_figures(answer),
        "<h2>Hardware and software</h2>",
        _hosts(comparison),
        "<h2>Run it again</h2>",
        _commands(comparison, source),
        # The numbers, as `pipeline compare --format json` prints them; "<" only in strings, written
        # as JSON's \u003c so that no name can end or open anything in the page.
        '<script type="application/json" id="comparison">',
        render_data(comparison, "json").replace("<", "\\u003c"),
        "</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _table(frame: pd.DataFrame, text: set[str], table_id: str) -> str:
    """`frame` as an HTML table: `text` columns as text, the rest as numbers, each cell's second line
    (an interval under its figure) in a smaller line of its own."""
    head = "".join(f"<th>{escape(str(column).replace('_', ' '))}</th>" for column in frame.columns)
    rows = []
    for values in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, values):
            first, *rest = str(value).split("\n")
            inner = escape(first) + "".join(f'<span class="interval">{escape(line)}</span>' for line in rest)
            cells.append(f"<td>{inner}</td>" if column in text else f'<td class="number">{inner}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>' + "\n".join(rows) + "</tbody></table>"


def _settings_text(answer: Answer, *more: str) -> set[str]:
    """The columns of a comparison's tables that are text, not numbers: the device, the settings that vary."""
    return {"device", *more} | set(answer.comparison.varying)


def _utilisation(answer: Answer) -> list[str]:
    """How far from the hardware's limit (answer.utilisation): a heading, a line on what the figures
    are, and one row per setting; nothing for runs made before they were logged."""

    frame = answer.utilisation
    if frame.empty:
        return []
    return [
        "<h2>How far from the hardware's limit</h2>",
        '<p class="muted">FLOPs of a training epoch as torch counts them (forward, loss, backward); achieved: '
        "over the median steady-state epoch; peak: the device's measured matrix-multiplication peak at the "
        "run's precision (`pipeline devices --peak`); MFU: achieved over peak, median over the runs. Bytes: "
        "what the eager step's kernels read and write, counted unfused and as if no cache kept anything (an "
        "upper bound); BW: those bytes per second over the device's measured copy bandwidth, only on CUDA "
        "with compile off (elsewhere each run's pipeline.bandwidth tag says why not).</p>",
        _table(frame, _settings_text(answer, "hardware"), "utilisation"),
    ]


def _every_figure(answer: Answer) -> list[str]:
    """Every figure of every setting (answer.wide: `pipeline compare --wide`'s table), folded."""
    return [
        "<details><summary>Every figure of every setting (<code>pipeline compare --wide</code>)</summary>",
        '<div class="scroll">' + _table(answer.wide, _settings_text(answer, "timed", "contended"), "every-figure"),
        "</div></details>",
    ]


def _figures(answer: Answer) -> list[str]:
    """The charts as inline PNGs (answer.planned's data, charts.figure's drawing)."""
    if len(answer.comparison.table) < 2:
        return ['<p class="muted">One setting: nothing to chart.</p>']
    planned = answer.planned
    out = []
    if charts.TEST_ACCURACY_PNG in planned and charts.EPOCH_DURATION_PNG not in planned:
        out.append(
            '<p class="muted">No speed chart: every run was contended, so no speed figure counts '
            "(see the notes above).</p>"
        )
    for chart in planned.values():
        buffer = io.BytesIO()
        charts.figure(chart).savefig(buffer, dpi=DPI, bbox_inches="tight", format="png")
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        caption = chart["title"].split("\n")[0]
        out.append(
            f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>"
        )
    return out


def _hosts(comparison: Comparison) -> str:
    """One row per host and hardware the runs trained on: torch, CUDA, and how many runs."""

    seen: dict[tuple[str, ...], int] = {}
    for run in comparison.sweep.children:
        key = tuple(run.tags.get(tag, "") or "-" for tag in (TAG_HOST, TAG_DEVICE, TAG_HARDWARE, TAG_TORCH, TAG_CUDA))
        seen[key] = seen.get(key, 0) + 1
    head = "".join(f"<th>{name}</th>" for name in ("host", "device", "hardware", "torch", "CUDA", "runs"))
    rows = [
        "<tr>" + "".join(f"<td>{escape(value)}</td>" for value in key) + f'<td class="number">{count}</td></tr>'
        for key, count in sorted(seen.items())
    ]
    return f'<table id="hosts"><thead><tr>{head}</tr></thead><tbody>' + "\n".join(rows) + "</tbody></table>"


def _commands(comparison: Comparison, source: Provenance) -> str:
    """The commands that fetch the grid this sweep trained and run it again, then compare."""

    sweep = comparison.sweep
    lines = [f"export MLFLOW_TRACKING_URI={shlex.quote(redact(source.tracking_uri))}"] if source.tracking_uri else []
    # The download keeps the artifact's path: ./grid/effective.yaml
    lines += [
        f"mlflow artifacts download --run-id {sweep.run_id} --artifact-path {ARTIFACT_EFFECTIVE_GRID} --dst-path .",
        " ".join(part for part in (f"pipeline run {ARTIFACT_EFFECTIVE_GRID}", source.options) if part),
        f"pipeline compare --experiment {shlex.quote(sweep.experiment_name)}",
    ]
    said = [f"<pre>{escape(chr(10).join(lines))}</pre>"]
    if source.grid_file:
        as_run = " ".join(
            part for part in (f"pipeline run {source.grid_file}", source.overrides, source.options) if part
        )
        said.append(f'<p class="muted">As it was run: <code>{escape(as_run)}</code></p>')
    if source.grid_text:
        said.append(
            f"<p>The grid it trained ({escape(ARTIFACT_EFFECTIVE_GRID)}):</p><pre>{escape(source.grid_text)}</pre>"
        )
    said += [f'<p class="muted">Note: {escape(note)}</p>' for note in source.notes]
    return "\n".join(said)
