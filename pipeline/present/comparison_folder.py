"""A comparison's files: its folder (charts.py's PNGs, results.csv and results.md), which `pipeline
compare --out` writes to disk, and what a published sweep carries: that folder as the parent run's
`comparison/`, its report (html_report.py) as `report.html`, and what the MLflow UI opens on
(view.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.analysis.compare import BEST, Comparison, pick
from pipeline.base.files import atomic_write
from pipeline.base.names import TAG_BEST_RUN
from pipeline.present import charts, html_report, view
from pipeline.present.sentences import notes, speedup_lines
from pipeline.present.tables import render

if TYPE_CHECKING:
    from collections.abc import Sequence


def write_report(comparison: Comparison, folder: Path) -> list[Path]:
    """Charts, results.csv and results.md (with the speedup lines and notes) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # Charts compare rows; a one-row sweep has nothing to compare (and matplotlib costs ~1 s).
    paths = charts.write_all(comparison, folder) if len(comparison.table) > 1 else []
    atomic_write(folder / "results.csv", render(comparison, "csv"))
    speedups = "".join(f"- {line}\n" for line in speedup_lines(comparison) + notes(comparison))
    title = f"# {comparison.sweep.name} ({comparison.sweep.experiment_name})\n\n"
    atomic_write(folder / "results.md", title + render(comparison, "markdown") + ("\n" + speedups if speedups else ""))
    return [*paths, folder / "results.csv", folder / "results.md"]


def write_html(client, comparison: Comparison, path: Path) -> Path:
    """The sweep's report (html_report.render) as one file at `path`, replaced whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, html_report.render(comparison, html_report.provenance(client, comparison.sweep.run_id)))
    return path


def publish(client, comparison: Comparison, axes: Sequence[tuple[str, tuple]] | None = None) -> None:
    """Everything a sweep shows in MLflow, written again from `comparison`: the parent run's
    `comparison/` folder and `report.html`, then the saved view and the descriptions (view.publish).
    `pipeline run` publishes each sweep at its end (with its grid's `axes`); `pipeline compare
    --publish` publishes one again, with that call's options. The parent's TAG_BEST_RUN follows the
    verdict it publishes: the best setting's run, or no tag where there is none (every run
    contended), so the tag, the descriptions and `pipeline register` name one run."""
    with tempfile.TemporaryDirectory(prefix="pipeline-publish-") as temporary:
        folder = Path(temporary)
        write_report(comparison, folder / "comparison")
        write_html(client, comparison, folder / view.REPORT)
        client.log_artifacts(comparison.sweep.run_id, str(folder))
    view.publish(client, comparison, axes)
    best = pick(comparison, BEST)
    if best is not None:
        client.set_tag(comparison.sweep.run_id, TAG_BEST_RUN, best.run_id)
    elif TAG_BEST_RUN in client.get_run(comparison.sweep.run_id).data.tags:
        client.delete_tag(comparison.sweep.run_id, TAG_BEST_RUN)
