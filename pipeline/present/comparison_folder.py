"""A comparison's files: its folder (charts.py's PNGs, results.csv and results.md), which `pipeline
compare --out` writes to disk, and its report (html_report.py), which `pipeline compare --html`
writes. A published sweep carries both (sweep/publish.py): the folder as the parent run's
`comparison/`, the report as `report.html`."""

from __future__ import annotations

from pathlib import Path

from pipeline.base.files import atomic_write
from pipeline.present import charts, html_report
from pipeline.present.answer import Answer, markdown
from pipeline.present.tables import render
from pipeline.present.view import markdown_text


def write_report(answer: Answer, folder: Path) -> list[Path]:
    """The answer's charts, results.csv (every column) and results.md (answer.markdown, its charts the
    PNGs beside it) into `folder`."""
    comparison = answer.comparison
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # A one-row sweep has no charts (answer.planned): nothing to compare, and matplotlib costs ~1 s.
    paths = charts.draw(answer.planned, folder)
    atomic_write(folder / "results.csv", render(comparison, "csv"))
    title = f"# {comparison.sweep.name} ({comparison.sweep.experiment_name})\n\n"
    text = markdown(answer, markdown_text, image=lambda name: name)  # the PNGs beside it
    atomic_write(folder / "results.md", title + text)
    return [*paths, folder / "results.csv", folder / "results.md"]


def write_html(answer: Answer, path: Path, source: html_report.Provenance | None = None) -> Path:
    """The sweep's report (html_report.render, with where it came from: `source`) as one file at
    `path`, replaced whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, html_report.render(answer, source))
    return path
