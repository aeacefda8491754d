"""One colour per setting, the same in the PNG charts (charts.py) and in the MLflow UI (view.py):
matplotlib's tab20, strong shades first. Its own module so that both read it and neither imports
the other."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.analysis.compare import Comparison

COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)


def colours(comparison: Comparison) -> list[str]:
    """Each setting's colour, one per row of the comparison's table: by the order of their names, so
    that a setting keeps its colour whichever way a table is sorted or a store returns its runs (the
    PNGs of the sweep's end and the UI after a later `pipeline compare` agree). They repeat after 20."""
    labels = comparison.labels()
    rank = {label: i for i, label in enumerate(sorted(set(labels)))}
    return [COLOURS[rank[label] % len(COLOURS)] for label in labels]
