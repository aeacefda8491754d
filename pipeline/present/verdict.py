"""What a person reads after training: the verdict and the tables behind it.

`pipeline compare` prints a comparison and the gate through a Verdict; a sweep's end prints its
summary: the headline, one row per run, what failed and why, the speedup lines and the UI's link.
The Reporter (report.py) shows the sweep while it runs; this module reads only the analysis' results
and a sweep's outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from pipeline.base.names import FINAL_ACCURACY, STEADY_EPOCH, STEADY_IMAGES
from pipeline.base.uris import redact
from pipeline.present import sentences, view
from pipeline.present.answer import Answer
from pipeline.present.report import make_console, plural, status_cell
from pipeline.present.tables import SPEEDUP_LABELS, caption, display_frame, gate_display_frame, gate_title, timed_title
from pipeline.settings.grid import format_value

if TYPE_CHECKING:
    from pipeline.analysis.compare import Comparison
    from pipeline.analysis.gate import GateResult
    from pipeline.execution.outcomes import SweepResult


class Verdict:
    """The terminal's side of a finished comparison: `pipeline compare`'s verdict, table and speedup
    lines, the gate's, and a sweep's summary at its end."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or make_console()

    def comparison(self, answer: Answer, wide: bool = False) -> None:
        """`pipeline compare --format table`: the verdict (sentences.headline), then one row per setting,
        its decision columns only (`wide`: every column; in several tables where the terminal is too
        narrow for one), then one line per speedup group."""
        self.headline(answer)
        for table in comparison_tables(answer.comparison, wide, self.console.width):
            self.console.print(table)
        self.speedups(answer)

    def headline(self, answer: Answer) -> None:
        for line in answer.verdict:
            self.console.print(line, markup=False, style="bold")

    def gate(self, result: GateResult) -> None:
        """`pipeline compare --baseline`: one row per point, then the verdict."""
        for table in frame_tables(gate_title(result), gate_display_frame(result), self.console.width, keys=["point"]):
            self.console.print(table)
        self.console.print(sentences.gate_verdict(result), markup=False)

    def speedups(self, answer: Answer) -> None:
        for line in answer.speedups:
            self.console.print(f"speedup  {line}", markup=False)
        for line in answer.notes:
            self.console.print(f"note     {line}", markup=False)

    def summary(
        self,
        axes: Sequence[tuple[str, tuple]],
        result: SweepResult,
        ui: tuple[str, str],
        comparison: Comparison | None = None,
    ) -> None:
        """The sweep's end: the verdict first, one row per run, what failed and why, the speedup
        lines, and the UI's link (`ui`: the command that starts the UI on the store and the
        experiment's runs page, masked, as Tracker.ui gives them)."""
        answer = Answer(comparison) if comparison is not None and not comparison.table.empty else None
        if answer is not None:
            self.headline(answer)
        self.console.print(results_table(axes, result))
        counts: dict[str, int] = {}
        for o in result.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        self.console.print(", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
        if result.stopped:
            self.console.print(result.stopped, markup=False, style="bold")
        grouped: dict[tuple[str, str], list[str]] = {}
        for o in result.outcomes:
            if o.status in ("SKIPPED", "FAILED", "KILLED", "NOT RUN", "UNLOGGED"):
                grouped.setdefault((o.status, o.reason), []).append(f"#{o.point.index}")
        for (status, reason), where in grouped.items():
            self.console.print(f"  {status.lower()} {', '.join(where)}: {redact(reason)}")
        if answer is not None:
            self.speedups(answer)
            self.console.print(
                "Charts and tables: the parent run's comparison/ artifacts; or `pipeline compare --out DIR`"
            )
        published = comparison is not None and not comparison.table.empty
        command, url = ui
        if published:
            if result.parent_run_id:
                url = view.page(url, result.parent_run_id)  # the sweep's saved view
            if not view.supported():
                self.console.print(f"note: {view.unverified_note()}")
        # Never wrapped, whatever the width: a command or a link broken over lines cannot be pasted.
        if command:
            self.console.print(f"Open the MLflow UI:  {command}", soft_wrap=True)
        self.console.print(f"then browse to       {url}", soft_wrap=True)


def comparison_tables(comparison: Comparison, wide: bool = False, width: int | None = None) -> list[Table]:
    """One row per setting: its decision columns (tables.decision_frame) or, `wide`, every column,
    within `width` (frame_tables: folded into several tables that each repeat the setting columns,
    speedups last, where one does not fit); the title says which epochs the times are, the caption
    the settings every row shares."""
    sweep = comparison.sweep
    rows, runs = len(comparison.table), len(comparison.runs)
    title = (
        f"{sweep.name} ({sweep.experiment_name}): {plural(rows, 'setting')}, {plural(runs, 'finished run')}; "
        f"{timed_title(comparison)}"
    )
    frame = display_frame(comparison, compact=not wide, stacked=True)
    tables = frame_tables(
        title,
        frame,
        width,
        keys=[c for c in comparison.setting_columns if c in frame],
        later=[c for c in frame if c in SPEEDUP_LABELS],
    )
    tables[-1].caption = caption(comparison)
    return tables


def results_table(axes: Sequence[tuple[str, tuple]], result: SweepResult) -> Table:
    """One row per run: its settings, its repeat when there are several, its steady-state summary
    (test accuracy, epoch time to the ms, images/s: Outcome.figures, the ones it logged and the UI
    shows; a DONE run's as stored when it finished, never its last epoch's) and status."""

    keys = [k for k, _ in axes]
    if "device" not in keys:
        keys.append("device")
    repeats = any(o.point.repeat > 1 for o in result.outcomes)
    table = Table(title="Results")
    table.add_column("#", justify="right")
    for key in keys:
        table.add_column(key)
    if repeats:
        table.add_column("repeat", justify="right")
    for name in ("test acc", "epoch s", "img/s"):
        table.add_column(name, justify="right")
    table.add_column("status")
    for o in result.outcomes:
        values = o.point.config.as_params()
        cells = [format_value(values[k]) for k in keys]
        if o.device and o.device != values["device"]:
            cells[keys.index("device")] = f"{values['device']} ({o.device})"
        if repeats:
            cells.append(str(o.point.repeat))
        figures = o.figures
        numbers = [
            _number(figures.get(name), spec)
            for name, spec in ((FINAL_ACCURACY, ".4f"), (STEADY_EPOCH, ".3f"), (STEADY_IMAGES, ",.0f"))
        ]
        table.add_row(str(o.point.index), *cells, *numbers, status_cell(o.status))
    return table


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def frame_tables(
    title: str, frame, width: int | None = None, keys: Sequence[str] = (), later: Sequence[str] = ()
) -> list[Table]:
    """Rich tables of a display frame, the first titled: text left, numbers right. Within `width` (a
    terminal's columns) cells and headers wrap between words, never inside one (_widths), so that no
    number is cut or split and no header is stacked a letter a line. Where even their words do not
    fit side by side, the columns fold into several tables (_fold), each repeating `keys` (the
    columns that name a row), with `later` (the columns a reader spares first) placed last: nothing
    is dropped. Only a table whose keys and one column are wider than `width` folds inside words."""
    headers = {column: column.replace("_", " ") for column in frame.columns}  # words ("batch size"), so they wrap
    cells = {column: [str(v) for v in frame[column]] for column in frame.columns}
    extents = {column: _extent(headers[column], cells[column]) for column in frame.columns}
    parts = (
        _fold(list(frame.columns), {c: least for c, (_, least) in extents.items()}, width, keys, later)
        if width
        else [list(frame.columns)]
    )
    tables: list[Table] = []
    for part in parts:
        table = Table(title=None if tables else title)
        widths = _widths([extents[column] for column in part], width) if width else [None] * len(part)
        for column, size in zip(part, widths):
            table.add_column(
                headers[column],
                justify="left" if column in ("device", "point") else "right",
                overflow="fold",
                width=size,
            )
        for row in zip(*(cells[column] for column in part)):
            table.add_row(*row)
        tables.append(table)
    return tables


def _extent(header: str, cells: Sequence[str]) -> tuple[int, int]:
    """A column's width unwrapped (its longest line, header included) and wrapped between words (its
    longest word): the most and the least it needs."""
    lines = [header, *(line for cell in cells for line in cell.splitlines())]
    words = [word for line in lines for word in line.split()]
    return max(map(cell_len, lines)), max(map(cell_len, words), default=1)


def _table_width(widths: Sequence[int]) -> int:
    """How wide a table with columns `widths` wide is: a border and two spaces of padding per column,
    one border more."""
    return sum(width + 3 for width in widths) + 1


def _fold(
    columns: list[str], least: dict[str, int], width: int, keys: Sequence[str], later: Sequence[str]
) -> list[list[str]]:
    """The columns of each table: all in one where their words fit side by side within `width`.
    Else each table starts with `keys`, and every other column, `later` ones last, goes into the
    first table it fits in (a new one where none has room); each table lists its columns in the
    frame's order."""
    if _table_width([least[c] for c in columns]) <= width:
        return [columns]
    parts: list[list[str]] = []
    for column in [c for c in columns if c not in keys and c not in later] + [c for c in later if c not in keys]:
        part = next((p for p in parts if _table_width([least[c] for c in [*p, column]]) <= width), None)
        if part is None:
            parts.append([*keys, column])
        else:
            part.append(column)
    return [[c for c in columns if c in part] for part in parts] or [columns]


def _widths(extents: Sequence[tuple[int, int]], width: int) -> list[int] | list[None]:
    """Column widths for a table `width` characters wide, from each column's (most, least) need
    (_extent): where the table fits unwrapped, rich's own (None); else each column as wide as its
    longest word, and the room left given one character at a time to the column that lacks most of
    its unwrapped width."""
    most, least = [m for m, _ in extents], [n for _, n in extents]
    if _table_width(most) <= width:
        return [None] * len(extents)
    widths, spare = list(least), width - _table_width(least)
    while spare > 0:
        lacking = [m - w for m, w in zip(most, widths)]
        if max(lacking) <= 0:
            break
        widths[lacking.index(max(lacking))] += 1
        spare -= 1
    return widths
