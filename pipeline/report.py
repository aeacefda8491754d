"""What a person reads: the plan, progress per run and epoch, and the final results table.

Per-epoch lines are plain prints so they read well in logs and under `mlflow run`; a transient
progress bar over an epoch's batches is added only on an interactive terminal.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from pipeline.grid import SHOWN_POINTS, format_value, grid_size, run_count

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline.compare import Comparison
    from pipeline.config import GridSpec
    from pipeline.executors import Planned
    from pipeline.gate import GateResult
    from pipeline.grid import GridPoint
    from pipeline.point import Outcome, SweepResult
    from pipeline.tracking import Tracker
    from pipeline.train import EpochStats


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def sweep_size(spec: "GridSpec") -> str:
    """How much a sweep of `spec` trains: "6 grid points", or "6 grid points x 3 repeats = 18 runs"."""
    points = plural(grid_size(spec), "grid point")
    return f"{points} x {spec.repeats} repeats = {run_count(spec)} runs" if spec.repeats > 1 else points


def grid_table(spec: "GridSpec", rows: Sequence[tuple["GridPoint", str]], title: str, last: str) -> Table:
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


def grid_notes(spec: "GridSpec", shown: int, max_points: int) -> list[str]:
    """Under a table of a sweep's first `shown` runs: how many more there are, and whether a run takes them."""
    size = run_count(spec)
    noun = "run" if spec.repeats > 1 else "grid point"
    notes = []
    if shown < size:
        notes.append(f"... and {size - shown} more: the first {shown} of {plural(size, noun)} are shown")
    if size > max_points:
        notes.append(f"note: `pipeline run` refuses {plural(size, noun)} (more than --max-points {max_points}); "
                     f"pass --max-points {size} to train them all")
    return notes


def make_console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # logs and `mlflow run`: wide enough that tables do not wrap
        console = Console(highlight=False, width=200)
    return console


class Reporter:
    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        if quiet:  # a Ray worker: the driver reports
            import os

            console = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the reporter
        self.console = console or make_console()
        self._progress: Progress | None = None
        self._task: Any = None
        self._reasons_said: set[str] = set()

    # --- before training ----------------------------------------------------------------------------

    def plan(self, spec: "GridSpec", planned: Sequence["Planned"], data_folder: "Path",
             done: dict[int, "Outcome"], max_points: int) -> None:
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
            self.console.print(f"{len(done)} of {len(planned)} already FINISHED here would be skipped; "
                               "--rerun trains them again")
        self.console.print(f"experiment: {spec.experiment}   data: {data_folder}")

    def data(self, description: str) -> None:
        self.console.print(f"data: {description}")

    def note(self, text: str) -> None:
        self.console.print(f"note: {text}")

    def sweep_start(self, tracker: "Tracker", parent_id: str, spec: "GridSpec") -> None:
        self.console.print(
            f"experiment {tracker.experiment_name!r} (id {tracker.experiment_id}), parent run {parent_id}, "
            f"{sweep_size(spec)}, store {tracker.uri}"
        )

    # --- during training ------------------------------------------------------------------------------

    def run_start(self, point: "GridPoint", device: str, index: int, total: int) -> None:
        self.console.print(f"[bold]run {index}/{total}[/] [{point.index}] {point.name} on {device}")

    def epoch_start(self, epoch: int, epochs: int, steps: int) -> None:
        if not self.console.is_terminal:
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("  epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), console=self.console, transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("", total=steps, epoch=f"{epoch}/{epochs}")
        else:
            self._progress.reset(self._task, total=steps, epoch=f"{epoch}/{epochs}")

    def step(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def epoch_end(self, stats: "EpochStats", epochs: int) -> None:
        self.console.print(
            f"  epoch {stats.epoch}/{epochs}  train loss {stats.train_loss:.4f} acc {stats.train_accuracy:.4f}"
            f"  test loss {stats.test_loss:.4f} acc {stats.test_accuracy:.4f}"
            f"  {stats.epoch_duration_s:.2f}s ({stats.images_per_s:,.0f} img/s)"
        )

    def epoch_done(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def remote_done(self, outcome: "Outcome", done: int, total: int) -> None:
        """A point finished on a Ray worker."""
        final = outcome.final
        result = (f"test acc {final.test_accuracy:.4f}, {outcome.mean_epoch_s:.2f} s/epoch on {outcome.device}"
                  if final and outcome.status == "FINISHED" else outcome.reason)
        self.console.print(f"[{done}/{total}] #{outcome.point.index} {outcome.point.name}: "
                           f"{_status(outcome.status)} {result}")

    def tracking_down(self, results_file: "Path") -> None:
        self.console.print(f"[red]The tracking store stopped answering.[/] Trained results are kept in {results_file}")
        self.console.print("When the store is back, `pipeline relog` logs them; running the same grid again then "
                           "trains only what is missing.")

    def run_end(self, outcome: "Outcome") -> None:
        if outcome.status == "FINISHED":
            return
        colour = "red" if outcome.status == "FAILED" else "yellow"
        self.console.print(f"  [{colour}]{outcome.status}[/]: {outcome.reason}")

    # --- after training ------------------------------------------------------------------------------

    def comparison(self, comparison: "Comparison") -> None:
        """`pipeline compare --format table`: one row per setting (intervals on a second line of their
        cell) and one line per speedup group."""
        from pipeline.compare import caption, display_frame

        sweep = comparison.sweep
        rows, runs = len(comparison.table), len(comparison.runs)
        title = f"{sweep.name} ({sweep.experiment_name}): {plural(rows, 'setting')}, {plural(runs, 'finished run')}"
        table = _frame_table(title, display_frame(comparison, compact=True))
        table.caption = caption(comparison)
        self.console.print(table)
        self.speedups(comparison)

    def gate(self, result: "GateResult") -> None:
        """`pipeline compare --baseline`: one row per point, then the verdict."""
        from pipeline import gate

        self.console.print(_frame_table(gate.title(result), gate.display_frame(result)))
        self.console.print(result.verdict(), markup=False)

    def speedups(self, comparison: "Comparison") -> None:
        for line in comparison.speedups:
            self.console.print(f"speedup  {line}", markup=False)
        for line in comparison.notes:
            self.console.print(f"note     {line}", markup=False)

    def summary(self, axes: Sequence[tuple[str, tuple]], result: "SweepResult", tracker: "Tracker",
                comparison: "Comparison | None" = None) -> None:
        self.console.print(results_table(axes, result))
        counts = {}
        for o in result.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        self.console.print(", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
        grouped: dict[tuple[str, str], list[str]] = {}
        for o in result.outcomes:
            if o.status in ("SKIPPED", "FAILED", "KILLED", "NOT RUN", "UNLOGGED"):
                grouped.setdefault((o.status, o.reason), []).append(f"#{o.point.index}")
        for (status, reason), where in grouped.items():
            self.console.print(f"  {status.lower()} {', '.join(where)}: {reason}")
        if comparison is not None and not comparison.table.empty:
            self.speedups(comparison)
            self.console.print("Charts and tables: the parent run's comparison/ artifacts; "
                               "or `pipeline compare --out DIR`")
        published = comparison is not None and not comparison.table.empty
        command, url = tracker.ui(result.parent_run_id if published else None)
        if published:
            from pipeline import view

            if not view.supported():
                self.note(view.unverified_note())
        if command:
            self.console.print(f"Open the MLflow UI:  {command}")
        self.console.print(f"then browse to       {url}")


def target_line(spec: "GridSpec") -> str:
    """What the sweep does with its target, in a line."""
    stop = ", each run stops at the epoch that reaches it (epochs: the cap)" if spec.stop_at_target else ""
    return f"target: {spec.target} (time_to_target_s){stop}"


def results_table(axes: Sequence[tuple[str, tuple]], result: "SweepResult") -> Table:
    """One row per run: its settings, its repeat when there are several, final numbers, mean epoch
    time and status."""
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
    for name in ("train loss", "train acc", "test loss", "test acc", "epoch s", "run s"):
        table.add_column(name, justify="right")
    table.add_column("status")
    for o in result.outcomes:
        values = o.point.config.as_params()
        cells = [format_value(values[k]) for k in keys]
        if o.device and o.device != values["device"]:
            cells[keys.index("device")] = f"{values['device']} ({o.device})"
        if repeats:
            cells.append(str(o.point.repeat))
        f = o.final
        numbers = (
            [f"{f.train_loss:.4f}", f"{f.train_accuracy:.4f}", f"{f.test_loss:.4f}", f"{f.test_accuracy:.4f}",
             f"{o.mean_epoch_s:.2f}", f"{o.run_duration_s:.2f}" if o.run_duration_s is not None else "-"]
            if f else ["-"] * 6
        )
        table.add_row(str(o.point.index), *cells, *numbers, _status(o.status))
    return table


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


def _status(status: str) -> str:
    colour = {"FINISHED": "green", "DONE": "green", "FAILED": "red", "NOT RUN": "red", "KILLED": "yellow",
              "SKIPPED": "yellow", "UNLOGGED": "yellow"}.get(status, "")
    return f"[{colour}]{status}[/]" if colour else status


def _frame_table(title: str, frame) -> Table:
    """A rich table of a display frame: text left, numbers right."""
    table = Table(title=title)
    for column in frame.columns:
        # Headers as words ("batch size"), so they can wrap; a cell too wide for the terminal folds
        # onto another line rather than losing its end to an ellipsis.
        table.add_column(column.replace("_", " "), justify="left" if column in ("device", "point") else "right",
                         overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*(str(v) for v in row))
    return table
