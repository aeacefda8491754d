"""A comparison's folder: its charts (charts.py), results.csv and results.md. The sweep logs it as
the parent run's `comparison/`; `pipeline compare --out` writes it to disk."""

from __future__ import annotations

from pathlib import Path

from pipeline import charts
from pipeline.compare import Comparison, render
from pipeline.files import atomic_write


def write_report(comparison: Comparison, folder: Path) -> list[Path]:
    """Charts, results.csv and results.md (with the speedup lines and notes) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # Charts compare rows; a one-row sweep has nothing to compare (and matplotlib costs ~1 s).
    paths = charts.write_all(comparison, folder) if len(comparison.table) > 1 else []
    atomic_write(folder / "results.csv", render(comparison, "csv"))
    speedups = "".join(f"- {line}\n" for line in comparison.speedups + comparison.notes)
    title = f"# {comparison.sweep.name} ({comparison.sweep.experiment_name})\n\n"
    atomic_write(folder / "results.md", title + render(comparison, "markdown") + ("\n" + speedups if speedups else ""))
    return [*paths, folder / "results.csv", folder / "results.md"]
