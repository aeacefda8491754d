"""What a person reads: the plan, progress per run and epoch, and the final results table.

Per-epoch lines are plain prints so they read well in logs and under `mlflow run`; a transient
progress bar over an epoch's batches is added only on an interactive terminal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

import pipeline.execution.point
from pipeline.base.names import FINAL_ACCURACY, STEADY_EPOCH, STEADY_IMAGES
from pipeline.settings.grid import SHOWN_POINTS, format_value, grid_size, run_count
from pipeline.tracking.store import redact
from pipeline.training.peak import TERA, reference

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline.analysis.compare import Comparison
    from pipeline.analysis.gate import GateResult
    from pipeline.execution.executors import Planned
    from pipeline.execution.point import Outcome, SweepResult
    from pipeline.settings.config import GridSpec
    from pipeline.settings.grid import GridPoint
    from pipeline.tracking.tracker import Tracker
    from pipeline.training.train import EpochStats


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def sweep_size(spec: GridSpec) -> str:
    """How much a sweep of `spec` trains: "6 grid points", or "6 grid points x 3 repeats = 18 runs"."""
    points = plural(grid_size(spec), "grid point")
    if spec.auto_repeats:
        return f"{points} x {spec.repeats} to {spec.max_repeats} repeats (auto) = up to {run_count(spec)} runs"
    return f"{points} x {spec.repeats} repeats = {run_count(spec)} runs" if spec.repeats > 1 else points


def grid_table(spec: GridSpec, rows: Sequence[tuple[GridPoint, str]], title: str, last: str) -> Table:
    """One row per grid point (per run, with repeats): its index, the grid's settings, its repeat
    when there are several, and a last column (`last`)."""
    repeats = spec.repeats > 1
    table = Table(title=title)
    table.add_column("#", justify="right")
    for key, _ in spec.axes:
        table.add_column(key)
    if repeats:
        table.add_column("repeat", justify="right")
    table.add_column(last)
    for point, cell in rows:
        values = point.config.as_params()
        shown = [format_value(values[k]) for k, _ in spec.axes] + ([str(point.repeat)] if repeats else [])
        table.add_row(str(point.index), *shown, cell)
    return table


def grid_notes(spec: GridSpec, shown: int, max_points: int) -> list[str]:
    """Under a table of a sweep's first `shown` runs: how many more there are, what `repeats: auto`
    trains after them, and whether a run takes them."""
    size = run_count(spec)
    planned = grid_size(spec) * spec.repeats  # with `repeats: auto`, its first rounds: the table's runs
    noun = "run" if spec.repeats > 1 else "grid point"
    notes = []
    if shown < planned:
        notes.append(f"... and {planned - shown} more: the first {shown} of {plural(planned, noun)} are shown")
    if spec.auto_repeats:
        notes.append(auto_line(spec))
    if size > max_points:
        notes.append(
            f"note: `pipeline run` refuses {plural(size, noun)} (more than --max-points {max_points}); "
            f"pass --max-points {size} to train them all"
        )
    return notes


def make_console() -> Console:
    import os
    import sys

    # Logs, pipes and `mlflow run`: wide enough that tables do not wrap, unless COLUMNS says how wide.
    # Whether stdout is a terminal is asked of stdout itself: FORCE_COLOR makes rich treat any output
    # as a terminal, whose size it then cannot read (80 columns).
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        return Console(highlight=False, width=200)
    return Console(highlight=False)


class Reporter(pipeline.execution.point.Progress):
    """The terminal's side of a sweep. It is the Progress a point reports to (`pipeline train` hands it
    to LocalExecutor): a method Progress gains is a no-op here until the Reporter shows it."""

    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        if quiet:  # a Ray worker: the driver reports
            import os

            console = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the reporter
        self.console = console or make_console()
        self._progress: Progress | None = None
        self._task: Any = None
        self._reasons_said: set[str] = set()

    # --- before training ----------------------------------------------------------------------------

    def plan(
        self, spec: GridSpec, planned: Sequence[Planned], data_folder: Path, done: dict[int, Outcome], max_points: int
    ) -> None:
        """--dry-run: where each point would run, or why it would not; the table shows the first
        SHOWN_POINTS, the counts under it every point planned."""
        rows, reasons = [], Counter(p.reason for p in planned if p.device is None)
        numbers = {reason: n for n, reason in enumerate(reasons, start=1)}  # each reason once, under the table
        for item in planned[:SHOWN_POINTS]:
            if item.device is None:
                where = f"[yellow]skipped[/] ({numbers[item.reason]})"
            elif item.point.index in done:
                where = f"[green]DONE[/]: {done[item.point.index].reason}"
            else:
                where = str(item.device)
            rows.append((item.point, where))
        title = f"{spec.path}: {sweep_size(spec)} (dry run, nothing trained)"
        self.console.print(grid_table(spec, rows, title, "runs on"))
        for line in grid_notes(spec, len(rows), max_points):
            self.console.print(line)
        if spec.target is not None:
            self.console.print(target_line(spec))
        for reason, count in reasons.items():
            self.console.print(f"({numbers[reason]}) {plural(count, 'point')} would be skipped: {reason}")
        if done:
            self.console.print(
                f"{len(done)} of {len(planned)} already FINISHED here would be skipped; --rerun trains them again"
            )
        sizes = f" ({_data_sizes(spec)})" if spec.data.train_size or spec.data.test_size else ""
        self.console.print(f"experiment: {spec.experiment}   data: {data_folder}{sizes}")

    def data(self, description: str) -> None:
        self.console.print(f"data: {description}")

    def note(self, text: str) -> None:
        self.console.print(f"note: {text}")

    def sweep_start(self, tracker: Tracker, parent_id: str, spec: GridSpec) -> None:
        self.console.print(
            f"experiment {tracker.experiment_name!r} (id {tracker.experiment_id}), parent run {parent_id}, "
            f"{sweep_size(spec)}, store {redact(tracker.uri)}"
        )

    # --- during training ------------------------------------------------------------------------------

    def run_start(self, point: GridPoint, device: str, index: int, total: int) -> None:
        self.console.print(f"[bold]run {index}/{total}[/] [{point.index}] {point.name} on {device}")

    def epoch_start(self, epoch: int, epochs: int, steps: int) -> None:
        if not self.console.is_terminal:
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("  epoch {task.fields[epoch]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=steps, epoch=f"{epoch}/{epochs}")
        else:
            self._progress.reset(self._task, total=steps, epoch=f"{epoch}/{epochs}")

    def step(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def epoch_end(self, stats: EpochStats, epochs: int) -> None:
        self.console.print(
            f"  epoch {stats.epoch}/{epochs}  train loss {stats.train_loss:.4f} acc {stats.train_accuracy:.4f}"
            f"  test loss {stats.test_loss:.4f} acc {stats.test_accuracy:.4f}"
            f"  {stats.epoch_duration_s:.2f}s ({stats.images_per_s:,.0f} img/s)"
        )

    def epoch_done(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def round_done(self, line: str) -> None:
        """`repeats: auto` between rounds: what is still unclear, and the round it trains next."""
        self.console.print(line, markup=False, style="bold")

    def remote_done(self, outcome: Outcome, done: int, total: int) -> None:
        """A point finished on a Ray worker."""
        final = outcome.final
        result = (
            f"test acc {final.test_accuracy:.4f}, {outcome.mean_epoch_s:.2f} s/epoch on {outcome.device}"
            if final and outcome.status == "FINISHED"
            else redact(outcome.reason)
        )
        self.console.print(
            f"[{done}/{total}] #{outcome.point.index} {outcome.point.name}: {_status(outcome.status)} {result}"
        )

    def tracking_down(self, results_file: Path, reason: str = "", no_room: bool = False) -> None:
        """The sweep stopped because the store could not be written: why, where the results are,
        and how to go on."""
        if no_room:
            self.console.print(f"[red]The sweep stopped: the disk is full.[/] {reason}")
            self.console.print(
                f"Free some space; then `pipeline relog` logs what {results_file} kept, and running "
                "the same grid again trains only what is missing."
            )
            return
        self.console.print(f"[red]The tracking store stopped answering.[/] Trained results are kept in {results_file}")
        self.console.print(
            "When the store is back, `pipeline relog` logs them; running the same grid again then "
            "trains only what is missing."
        )

    def run_end(self, outcome: Outcome) -> None:
        if outcome.status == "FINISHED":
            return
        colour = "red" if outcome.status == "FAILED" else "yellow"
        self.console.print(f"  [{colour}]{outcome.status}[/]: {redact(outcome.reason)}")

    # --- after training ------------------------------------------------------------------------------

    def comparison(self, comparison: Comparison, wide: bool = False) -> None:
        """`pipeline compare --format table`: the verdict (sentences.headline), then one row per setting,
        its decision columns only (`wide`: every column; in several tables where the terminal is too
        narrow for one), then one line per speedup group."""
        self.headline(comparison)
        for table in comparison_tables(comparison, wide, self.console.width):
            self.console.print(table)
        self.speedups(comparison)

    def headline(self, comparison: Comparison) -> None:
        from pipeline.present.sentences import headline

        for line in headline(comparison):
            self.console.print(line, markup=False, style="bold")

    def gate(self, result: GateResult) -> None:
        """`pipeline compare --baseline`: one row per point, then the verdict."""
        from pipeline.present.sentences import gate_verdict
        from pipeline.present.tables import gate_display_frame, gate_title

        for table in frame_tables(gate_title(result), gate_display_frame(result), self.console.width, keys=["point"]):
            self.console.print(table)
        self.console.print(gate_verdict(result), markup=False)

    def speedups(self, comparison: Comparison) -> None:
        from pipeline.present.sentences import notes, speedup_lines

        for line in speedup_lines(comparison):
            self.console.print(f"speedup  {line}", markup=False)
        for line in notes(comparison):
            self.console.print(f"note     {line}", markup=False)

    def summary(
        self,
        axes: Sequence[tuple[str, tuple]],
        result: SweepResult,
        tracker: Tracker,
        comparison: Comparison | None = None,
    ) -> None:
        """The sweep's end: the verdict first, one row per run, what failed and why, the speedup
        lines, and the UI's link."""
        if comparison is not None and not comparison.table.empty:
            self.headline(comparison)
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
        if comparison is not None and not comparison.table.empty:
            self.speedups(comparison)
            self.console.print(
                "Charts and tables: the parent run's comparison/ artifacts; or `pipeline compare --out DIR`"
            )
        published = comparison is not None and not comparison.table.empty
        command, url = tracker.ui()
        if published:
            from pipeline.present import view

            if result.parent_run_id:
                url = view.page(url, result.parent_run_id)  # the sweep's saved view
            if not view.supported():
                self.note(view.unverified_note())
        # Never wrapped, whatever the width: a command or a link broken over lines cannot be pasted.
        if command:
            self.console.print(f"Open the MLflow UI:  {command}", soft_wrap=True)
        self.console.print(f"then browse to       {url}", soft_wrap=True)


def _data_sizes(spec: GridSpec) -> str:
    """What the grid's data.train_size and data.test_size take: "first 60000 train, all test images"."""

    def part(size: int | None, split: str) -> str:
        return f"first {size} {split}" if size else f"all {split}"

    return f"{part(spec.data.train_size, 'train')}, {part(spec.data.test_size, 'test')} images"


def auto_line(spec: GridSpec) -> str:
    """What `repeats: auto` trains after its first rounds, and what stops it, in a line."""
    from pipeline.analysis.rounds import references

    first = f"repeats: auto: rounds 1-{spec.repeats} first"
    axes = references(spec.axes)
    if not axes:
        return f"{first}; the grid varies no setting, so there is nothing to compare and it stops there"
    against = ", ".join(f"{key} against {format_value(value)}" for key, value in axes)
    within = f" or within ±{100 * spec.half_width:g}%" if spec.half_width is not None else ""
    return (
        f"{first}, then one round of {plural(grid_size(spec), 'run')} at a time until every speedup "
        f"({against}) is significant{within}, up to max_repeats {spec.max_repeats}"
    )


def target_line(spec: GridSpec) -> str:
    """What the sweep does with its target, in a line."""
    stop = ", each run stops at the epoch that reaches it (epochs: the cap)" if spec.stop_at_target else ""
    return f"target: {spec.target} (time_to_target_s){stop}"


def comparison_tables(comparison: Comparison, wide: bool = False, width: int | None = None) -> list[Table]:
    """One row per setting: its decision columns (tables.decision_frame) or, `wide`, every column,
    within `width` (frame_tables: folded into several tables that each repeat the setting columns,
    speedups last, where one does not fit); the title says which epochs the times are, the caption
    the settings every row shares."""
    from pipeline.present.tables import SPEEDUP_LABELS, caption, display_frame, timed_title

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
        table.add_row(str(o.point.index), *cells, *numbers, _status(o.status))
    return table


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def class_accuracy_table(title: str, per_class: Sequence[tuple[str, int, float]]) -> Table:
    table = Table(title=title)
    for column in ("class", "examples", "accuracy"):
        table.add_column(column.replace("_", " "), justify="left" if column == "class" else "right")
    for name, count, value in per_class:
        table.add_row(name, str(count), "-" if count == 0 else f"{value:.4f}")
    return table


def devices_table(found: Sequence[Any]) -> Table:
    """`pipeline devices`: each device, its hardware, and whether a tiny op on it worked."""
    import torch

    table = Table(title=f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}")
    for column in ("device", "hardware", "detail", "works"):
        table.add_column(column)
    for d in found:
        table.add_row(d.name, d.hardware, d.detail, "yes" if d.works else f"no: {d.error}")
    return table


def print_peaks(console: Console, found: Sequence[Any]) -> None:
    """`pipeline devices --peak`: per device (peak.Found), its measured matmul peak at each precision
    and its copy bandwidth beside the vendor's nominal figures or the CPU's estimate, and whether the
    figures were measured now or reused from the cache."""

    for item in found:
        peak = item.peak
        nominal = reference(peak)
        threads = f", {peak.threads} torch threads" if peak.threads is not None else ""
        table = Table(title=f"{peak.device}: {peak.hardware}{threads}")
        for column in ("figure", "measured", "nominal" if nominal is None or not nominal.estimate else "estimate"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        for precision, flops in peak.matmul.items():
            expected = nominal.matmul.get(precision) if nominal else None
            table.add_row(
                f"{precision} matmul TFLOP/s (side {peak.matmul_side.get(precision, '?')})",
                f"{flops / TERA:.4g}",
                "-" if expected is None else f"{expected / TERA:.4g}",
            )
        bandwidth = nominal.copy_bytes_per_s if nominal else None
        table.add_row(
            "copy GB/s (read + write)",
            f"{peak.copy_bytes_per_s / 1e9:,.1f}",
            "-" if bandwidth is None else f"{bandwidth / 1e9:,.0f}",
        )
        console.print(table)
        if nominal is not None:
            console.print(f"  {nominal.label}")
        if item.reused:
            console.print(
                f"  reused the peaks measured {peak.measured_at} (torch {peak.torch_version}), cached in "
                f"{item.cache}; --remeasure measures again"
            )
        else:
            saved = f"cached in {item.cache}" if not item.cache_error else f"not cached: {item.cache_error}"
            console.print(f"  measured now in {peak.seconds:.1f} s, {saved}")


def _status(status: str) -> str:
    colour = {
        "FINISHED": "green",
        "DONE": "green",
        "FAILED": "red",
        "NOT RUN": "red",
        "KILLED": "yellow",
        "SKIPPED": "yellow",
        "UNLOGGED": "yellow",
    }.get(status, "")
    return f"[{colour}]{status}[/]" if colour else status


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
