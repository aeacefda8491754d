"""What a person reads while a sweep runs: the plan, progress per run and epoch, and what failed.

Per-epoch lines are plain prints so they read well in logs and under `mlflow run`; a transient
progress bar over an epoch's batches is added only on an interactive terminal. What it reads once
the sweep is over (the verdict, a row per run, the UI's link) is verdict.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

import pipeline.execution.outcomes
from pipeline.base.uris import redact
from pipeline.settings.grid import SHOWN_POINTS, format_value, grid_size, run_count
from pipeline.training.peak import TERA, reference

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline.execution.outcomes import Outcome, Planned
    from pipeline.settings.config import GridSpec
    from pipeline.settings.grid import GridPoint
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


# The narrowest width a console is made at: narrower, rich squeezes a results table's cells to blanks
# (COLUMNS=20 drew only borders). A narrower terminal wraps the lines itself, and they stay readable.
MIN_COLUMNS = 60


def make_console() -> Console:
    import os
    import shutil
    import sys

    # Logs, pipes and `mlflow run`: wide enough that tables do not wrap, unless COLUMNS says how wide.
    # Whether stdout is a terminal is asked of stdout itself: FORCE_COLOR makes rich treat any output
    # as a terminal, whose size it then cannot read (80 columns). A COLUMNS that is no usable width
    # (0, "", words: a degenerate terminal) is ignored: rich would print nothing at width 0.
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= MIN_COLUMNS:
        return Console(highlight=False, width=int(columns))
    if not sys.stdout.isatty():
        return Console(highlight=False, width=200)
    return Console(highlight=False, width=max(MIN_COLUMNS, shutil.get_terminal_size().columns))


class Reporter(pipeline.execution.outcomes.Progress):
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

    def sweep_start(self, experiment_name: str, experiment_id: str, uri: str, parent_id: str, spec: GridSpec) -> None:
        self.console.print(
            f"experiment {experiment_name!r} (id {experiment_id}), parent run {parent_id}, "
            f"{sweep_size(spec)}, store {redact(uri)}"
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
            f"[{done}/{total}] #{outcome.point.index} {outcome.point.name}: {status_cell(outcome.status)} {result}"
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


def status_cell(status: str) -> str:
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
