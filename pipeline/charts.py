"""PNG charts of a comparison (matplotlib, no display needed).

Two halves. `plan` turns a Comparison into plain data (names, numbers, labels); `draw` turns that
data into PNG files with matplotlib's object API (Agg figures of its own, never pyplot: drawing in
a notebook's process leaves its backend and figures alone). A sweep draws through a Painter: `python -m pipeline.charts`,
started with the sweep, imports matplotlib (about 0.8 s of CPU here) on the other core while the
sweep imports torch and MLflow, then waits, idle, for the comparison. `pipeline compare` draws
in its own process.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pipeline.compare import Comparison

EPOCH_DURATION_PNG = "epoch_duration.png"
TEST_ACCURACY_PNG = "test_accuracy.png"
TIME_BREAKDOWN_PNG = "time_breakdown.png"
DRAW_TIMEOUT_S = 30  # three small charts take about a second


DPI = 120


def _new_axes(figsize: tuple[float, float]):
    """A figure with an Agg canvas (files only, no display, no pyplot) and its one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


# --- the data: Comparison -> plain values (no matplotlib) -------------------------------------------


def _timed(comparison: "Comparison") -> str:
    """Which epochs the chart's times average, as the table's `timed` column says."""
    labels = comparison.table["timed"].unique()
    return labels[0] if len(labels) == 1 else "steady state where a run had 2+ epochs"


def variants(comparison: "Comparison") -> list[str]:
    """Each run's bar label: its device, and the variant settings that differ in the sweep
    ("cpu bf16 compiled"), so that twins on other axes are never averaged into one bar."""
    from pipeline.grid import short

    t = comparison.table
    return [" ".join([str(row["device"])] + [short(k, row[k]) for k in comparison.variants]) for _, row in t.iterrows()]


def _epoch_duration(comparison: "Comparison") -> dict:
    """Steady-state epoch duration (timing.steady) for each (batch size, workers), one bar per
    device (and variant: precision, compile, ...)."""
    t = comparison.table.assign(device=variants(comparison))
    means = t.groupby(["batch_size", "num_workers", "device"], sort=False)["epoch_duration_s"].mean()
    categories = list(dict.fromkeys((int(b), int(w)) for b, w, _ in means.index))
    devices = list(dict.fromkeys(d for _, _, d in means.index))
    bars = [[categories.index((int(b), int(w))), devices.index(d), float(v)] for (b, w, d), v in means.items()]
    return {"kind": "epoch_duration", "categories": categories, "devices": devices, "bars": bars,
            "ylabel": "epoch duration (s), " + _timed(comparison),
            "title": f"Epoch duration by batch size and workers\n{comparison.sweep.name}"}


def _test_accuracy(comparison: "Comparison") -> dict:
    """Test accuracy after each epoch, one line per run."""
    return {"kind": "test_accuracy", "title": f"Test accuracy per epoch\n{comparison.sweep.name}",
            "lines": [[run.name, [float(v) for v in run.histories.get("test_accuracy") or []]]
                      for run in comparison.sweep.children]}


def _time_breakdown(comparison: "Comparison") -> dict:
    """Where each run's epoch went: data, transfer and compute seconds, stacked."""
    t = comparison.table
    labels = [f"{n} [{d}]" if d not in n else n for n, d in zip(t["run_name"], t["device"])]
    stacks = [[share.replace("_share", ""), colour, (t[share].fillna(0) * t["epoch_duration_s"]).tolist()]
              for share, colour in (("data_share", "tab:orange"), ("transfer_share", "tab:purple"),
                                    ("compute_share", "tab:blue"))]
    return {"kind": "time_breakdown", "labels": labels, "stacks": stacks,
            "xlabel": "seconds per epoch, " + _timed(comparison),
            "title": f"Where each epoch's time goes\n{comparison.sweep.name}"}


def plan(comparison: "Comparison") -> dict[str, dict]:
    """Each chart's file name and data, in JSON's types."""
    return {EPOCH_DURATION_PNG: _epoch_duration(comparison), TEST_ACCURACY_PNG: _test_accuracy(comparison),
            TIME_BREAKDOWN_PNG: _time_breakdown(comparison)}


# --- the drawing: plain values -> PNG (matplotlib) ---------------------------------------------------


def _draw_epoch_duration(chart: dict) -> Figure:
    categories, devices = chart["categories"], chart["devices"]
    width = 0.8 / len(devices)
    fig, ax = _new_axes((max(6.0, 1.3 * len(categories) * max(1, len(devices)) / 1.5), 4.5))
    for i, device in enumerate(devices):
        bars = [(j + (i - (len(devices) - 1) / 2) * width, value) for j, d, value in chart["bars"] if d == i]
        drawn = ax.bar([x for x, _ in bars], [y for _, y in bars], width, label=device)
        ax.bar_label(drawn, fmt="%.2f", fontsize=8, padding=2)
    ax.set_xticks(range(len(categories)), [f"bs {b}\n{w} worker{'s' if w != 1 else ''}" for b, w in categories])
    ax.set_xlabel("batch size / DataLoader workers")
    ax.set_ylabel(chart["ylabel"])
    ax.legend(title="device")
    ax.margins(y=0.15)
    return fig


_DASHES = ("-", "--", "-.", ":")
_MARKERS = "osD^vP<>X"


def _draw_test_accuracy(chart: dict) -> Figure:
    fig, ax = _new_axes((8, 4.5))
    longest, lines = 1, chart["lines"]
    for i, (name, values) in enumerate(lines):
        if values:
            # Runs that learn the same numbers (same seed, 0 or 1 workers) draw the same line: each
            # later line is thinner, with its own dashes and marker, so none hides under another.
            fade = i / max(len(lines) - 1, 1)
            ax.plot(range(1, len(values) + 1), values, label=name, linestyle=_DASHES[i % len(_DASHES)],
                    marker=_MARKERS[i % len(_MARKERS)], linewidth=3.5 - 2.5 * fade, markersize=9 - 5 * fade,
                    alpha=0.85)
            longest = max(longest, len(values))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (fraction correct)")
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlim(0.5, longest + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="run")
    return fig


def _draw_time_breakdown(chart: dict) -> Figure:
    labels = chart["labels"]
    fig, ax = _new_axes((8, 0.45 * len(labels) + 1.8))
    left = [0.0] * len(labels)
    for name, colour, seconds in chart["stacks"]:
        ax.barh(labels, seconds, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, seconds)]
    ax.invert_yaxis()
    ax.set_xlabel(chart["xlabel"])
    # Right of the axes: the bars span the plot's whole width, so any legend inside covers one.
    ax.legend(title="time spent on", fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


_DRAW = {"epoch_duration": _draw_epoch_duration, "test_accuracy": _draw_test_accuracy,
         "time_breakdown": _draw_time_breakdown}


def figure(chart: dict) -> Figure:
    """One planned chart as a figure, for callers that look at its parts. Legends may lie outside
    the figure's own box: save it as `draw` does, with bbox_inches="tight"."""
    fig = _DRAW[chart["kind"]](chart)
    fig.axes[0].set_title(chart["title"], fontsize=10)
    return fig


def draw(charts: dict[str, dict], folder: Path) -> list[Path]:
    """Each planned chart as a PNG in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, chart in charts.items():
        fig = figure(chart)
        # "tight" grows the image to take in legends placed outside the axes; no tight_layout before
        # it: the same fit again, a third of the drawing (0.96 s -> 0.61 s for the three charts).
        fig.savefig(folder / name, dpi=DPI, bbox_inches="tight")
        paths.append(folder / name)
    return paths


def write_all(comparison: "Comparison", folder: Path, painter: "Painter | None" = None) -> list[Path]:
    """The comparison's charts in `folder`: drawn by `painter` when one is given, else here."""
    charts = plan(comparison)
    return painter.draw(charts, folder) if painter is not None else draw(charts, folder)


# --- the painter: the drawing in a process of its own --------------------------------------------------


def painter_pays() -> bool:
    """Whether a painter would save this process time: it imports matplotlib on the other core. In a
    process that has it already (one that ran a sweep before: a notebook, a test session) there is
    nothing to move off the critical path, and a painter would import it again."""
    return "matplotlib.figure" not in sys.modules


@contextlib.contextmanager
def painting(wanted: bool):
    """A started Painter for the block when `wanted` (None where none starts: drawn in-process)."""
    started = None
    if wanted:
        with contextlib.suppress(OSError):
            started = Painter()
    try:
        yield started
    finally:
        if started is not None:
            started.close()


class Painter:
    """`python -m pipeline.charts`: imports matplotlib at once, then draws one request and exits.

    The request is one line of JSON, so no end-of-file is needed: a DataLoader worker forked
    meanwhile may hold a copy of the pipe. Ctrl-C is the sweep's: the painter runs in a session of
    its own, which the terminal's signals do not reach, and `close` ends it. If the sweep's process
    dies, the painter reads the end of its input and exits (after the sweep's DataLoader workers,
    which notice their parent's death within seconds). Use `painting`, or call close."""

    def __init__(self) -> None:
        self.failure: str | None = None  # why a request was drawn in this process instead
        self._process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.charts"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "MPLBACKEND": "Agg"},
            start_new_session=True)  # out of the terminal's process group: Ctrl-C is the sweep's

    @property
    def pid(self) -> int:
        return self._process.pid

    def draw(self, charts: dict[str, dict], folder: Path) -> list[Path]:
        """The charts, drawn by the painter; where it fails (dead, hung, an error), drawn here, and
        `failure` says why."""
        try:
            return self._request(charts, folder)
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            self.failure = str(exc) or exc.__class__.__name__
            self.close()
            return draw(charts, folder)

    def _request(self, charts: dict[str, dict], folder: Path) -> list[Path]:
        request = json.dumps({"folder": str(folder), "charts": charts}) + "\n"
        try:
            out, err = self._process.communicate(request.encode(), timeout=DRAW_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the chart process drew nothing in {DRAW_TIMEOUT_S} s") from None
        if self._process.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"the chart process failed (exit {self._process.returncode}): {last}")
        return [Path(path) for path in json.loads(out)]

    def close(self) -> None:
        # The painter and any child it forked to draw: it leads a session, hence a process group, of
        # its own, whose id stays its own until the painter (a zombie at worst) is waited for.
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
            stream.close()
        self._process.wait()


def _draw_forked(charts: dict[str, dict], folder: Path) -> list[Path]:
    """`draw`, each chart but the first in a child forked from this process (matplotlib imported
    already), the first here: the sweep waits idle meanwhile, so both cores draw. Three charts of a
    six-run grid: 0.65 s one after the other, 0.42 s this way (2 cores)."""
    names, children = list(charts), []
    for name in names[1:]:
        pid = os.fork()
        if pid == 0:  # the child: draw one chart, say why on stderr if it cannot, and go
            code = 1
            try:
                draw({name: charts[name]}, folder)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        children.append((pid, name))
    try:
        draw({names[0]: charts[names[0]]}, folder)
    finally:  # reaped whatever happens here
        failed = [name for pid, name in children if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
    if failed:
        raise RuntimeError(f"drawing {', '.join(failed)} failed")
    return [folder / name for name in names]


def _serve() -> None:
    # One drawing and out: no collector (startup.py says why), and no teardown, which took 0.28 s
    # after matplotlib here while the sweep waited for this process's end.
    gc.disable()
    _new_axes((1, 1))  # the imports, before the request comes
    line = sys.stdin.readline()
    if not line:  # the sweep ended without charts
        return
    request = json.loads(line)
    draw_all = _draw_forked if hasattr(os, "fork") else draw
    print(json.dumps([str(path) for path in draw_all(request["charts"], Path(request["folder"]))]), flush=True)
    os._exit(0)  # the PNGs are closed files: nothing is left to flush


if __name__ == "__main__":
    _serve()
