"""A comparison's answer, built once, and its markdown writer.

Every surface that shows a comparison renders the same sections in the same order: the verdict
(sentences.headline; `short` says it in one line, for where one line is all a reader sees), the
decision table (tables.decision_frame, in the verdict's order: the best setting first, then fastest
first), the utilisation table where the runs measured it, the speedup lines, the notes, and the
charts. The terminal prints them (verdict.py), html_report writes them as report.html, and
`markdown` here writes them for the parent run's description and results.md; the experiment's
description opens with `short`, then the verdict (view.experiment_note). What a surface adds around
them (the descriptions' links, the report's hosts and commands, a sweep's run table) is its own;
the answer is not.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from pipeline.present import charts
from pipeline.present.sentences import headline, notes, short_verdict, speedup_lines
from pipeline.present.tables import caption, decision_frame, display_frame, timed_title, utilisation_frame
from pipeline.present.tables import markdown as markdown_table

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.analysis.compare import Comparison

# The charts, in the order every surface shows them (charts.plan leaves out those a sweep cannot draw).
CHARTS = (
    charts.TRADEOFF_PNG,
    charts.EPOCH_DURATION_PNG,
    charts.TEST_ACCURACY_PNG,
    charts.TIME_BREAKDOWN_PNG,
    charts.SPEEDUP_PNG,
    charts.ROOFLINE_PNG,
)


class Answer:
    """The sections of a comparison's answer, each worked out once, when first read."""

    def __init__(self, comparison: Comparison) -> None:
        self.comparison = comparison

    @cached_property
    def verdict(self) -> list[str]:
        return headline(self.comparison)

    @cached_property
    def short(self) -> str:
        return short_verdict(self.comparison)

    @cached_property
    def table(self) -> pd.DataFrame:
        """The decision table, one line a cell ("0.400 [0.398-0.403]"): for markdown."""
        return decision_frame(self.comparison, stacked=False)

    @cached_property
    def stacked(self) -> pd.DataFrame:
        """The same table with each interval on its cell's next line: for a terminal and the report."""
        return decision_frame(self.comparison)

    @cached_property
    def title(self) -> str:
        """What the table's epoch times are, and the settings every row shares."""
        shared = caption(self.comparison)
        return timed_title(self.comparison) + (f"; {shared}" if shared else "")

    @cached_property
    def wide(self) -> pd.DataFrame:
        """Every figure of every setting (tables.display_frame, as `pipeline compare --wide`)."""
        return display_frame(self.comparison)

    @cached_property
    def utilisation(self) -> pd.DataFrame:
        """How far each setting ran from its device's peak (empty where no run measured it)."""
        return utilisation_frame(self.comparison)

    @cached_property
    def speedups(self) -> list[str]:
        return speedup_lines(self.comparison)

    @cached_property
    def notes(self) -> list[str]:
        return notes(self.comparison)

    @cached_property
    def planned(self) -> dict[str, dict]:
        """The charts' data (charts.plan), in CHARTS' order; none for a one-setting sweep."""
        if len(self.comparison.table) < 2:
            return {}
        found = charts.plan(self.comparison)
        return {name: found[name] for name in CHARTS if name in found}


def bold(line: str, text: Callable[[str], str] = str) -> str:
    """A verdict line in markdown: bold, ending the line (two trailing spaces)."""
    return f"**{text(line)}**  "


def markdown(
    answer: Answer,
    text: Callable[[str], str] = str,
    image: Callable[[str], str] | None = None,
    after_verdict: list[str] | None = None,
) -> str:
    """The answer as markdown: the verdict in bold (then the surface's own `after_verdict` lines), the
    table under its title, the utilisation table, the speedup lines and notes as a list, then the
    charts (`image`: a chart file's URL; none, no charts). `text` escapes our words for the markdown
    that reads them (view.markdown_text for MLflow's)."""
    lines = [bold(line, text) for line in answer.verdict]
    lines += ["", *after_verdict] if after_verdict else []
    if answer.comparison.table.empty:
        return "\n".join(lines) + "\n"
    frame = answer.table.rename(columns=text).map(lambda value: text(str(value)))
    lines += ["", text(answer.title), "", markdown_table(frame)]
    if not answer.utilisation.empty:
        shares = answer.utilisation.rename(columns=text).map(lambda value: text(str(value)))
        lines += [text("MFU: the FLOP/s of its steady epochs over the device's measured peak at its precision."), ""]
        lines += [markdown_table(shares)]
    lines += [f"- {text(line)}" for line in answer.speedups + answer.notes]
    if image is not None:
        for name, chart in answer.planned.items():
            lines += ["", f"![{text(chart['title'].split(chr(10))[0])}]({image(name)})"]
    return "\n".join(lines) + "\n"
