"""PNG charts of a comparison (matplotlib, no display needed).

Two halves. `plan` turns a Comparison into plain data (names, numbers, labels); `draw` turns that
data into PNG files with matplotlib's object API (Agg figures of its own, never pyplot: drawing in
a notebook's process leaves its backend and figures alone).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.files import replacing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pipeline.compare import Comparison

TRADEOFF_PNG = "accuracy_vs_time.png"  # first in comparison/ (names sort), first in `plan`
EPOCH_DURATION_PNG = "epoch_duration.png"
TEST_ACCURACY_PNG = "test_accuracy.png"
TIME_BREAKDOWN_PNG = "time_breakdown.png"
SPEEDUP_PNG = "speedup.png"  # only where some row has a speedup


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


def _colours(comparison: "Comparison") -> list[str]:
    """Each setting's colour, as the UI's view gives its runs (view.colours: one per row)."""
    from pipeline.view import colours

    return colours(comparison)


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """The indices of the best trade-offs among (time, accuracy) points, fastest first: each is more
    accurate than every faster point (no other point is both faster and at least as accurate)."""
    front, best = [], -math.inf
    for i in sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1])):
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _tradeoff(comparison: "Comparison") -> dict:
    """Speed against accuracy, one labelled point per setting: its epoch time (time to target when the
    sweep has a target) and its final test accuracy, the figures the table shows; the best
    trade-offs (the Pareto front) joined by a line."""
    from pipeline.names import FINAL_ACCURACY, STEADY_EPOCH

    t = comparison.table
    to_target = comparison.target is not None and t["time_to_target_s"].notna().any()
    column = "time_to_target_s" if to_target else STEADY_EPOCH
    points = []
    for (_, row), colour in zip(t.iterrows(), _colours(comparison)):
        x, y = float(row[column]), float(row[FINAL_ACCURACY])
        if not (math.isnan(x) or math.isnan(y)):
            points.append([comparison.label(row), x, y, colour])
    xlabel = (f"time to {comparison.target} (s), median over the runs" if to_target
              else f"epoch time (s), {_timed(comparison)}")
    return {"kind": "tradeoff", "points": points, "front": pareto([(x, y) for _, x, y, _ in points]),
            "xlabel": xlabel, "ylabel": "final test accuracy",
            "title": f"Speed against accuracy (best trade-offs joined)\n{comparison.sweep.name}"}


def _epoch_duration(comparison: "Comparison") -> dict:
    """Steady-state epoch duration (timing.steady) for each (batch size, workers), one bar per
    device (and variant: precision, compile, ...): the median over the setting's runs, whiskers from
    its first to its third quartile (the outer ones where several settings share a bar)."""
    t = comparison.table.assign(device=variants(comparison), label=[comparison.label(r) for _, r in
                                                                     comparison.table.iterrows()])
    t = t[t["epoch_duration_s"].notna()]  # a setting whose every run is contended has no epoch time
    groups = t.groupby(["batch_size", "num_workers", "device"], sort=False)
    labels = groups["label"].agg(lambda names: " / ".join(names))
    means = groups["epoch_duration_s"].mean()
    low, high = groups["epoch_duration_s_q1"].min(), groups["epoch_duration_s_q3"].max()
    categories = list(dict.fromkeys((int(b), int(w)) for b, w, _ in means.index))
    devices = list(dict.fromkeys(d for _, _, d in means.index))
    bars = []
    for (b, w, d), value in means.items():
        bars.append([categories.index((int(b), int(w))), devices.index(d), float(value),
                     float(low[(b, w, d)]), float(high[(b, w, d)]), labels[(b, w, d)]])
    legend = " / ".join(["device", *comparison.variants])  # what the bar colours encode
    return {"kind": "epoch_duration", "categories": categories, "devices": devices, "bars": bars, "legend": legend,
            "ylabel": "epoch duration (s), " + _timed(comparison) + "\nmedian, whiskers: interquartile range",
            "title": f"Epoch duration by batch size and workers\n{comparison.sweep.name}"}


def _speedup(comparison: "Comparison") -> dict:
    """Every speedup a row has over its reference twin, one bar each, whiskers at its 95% interval;
    the label says it in words, with (n.s.) where the interval includes no difference."""
    from pipeline.compare import SPEEDUPS, cell

    t = comparison.table
    bars = []
    for column in SPEEDUPS:
        if column not in t:
            continue
        for _, row in t[t[column].notna() & (t[f"{column}_vs"] != "")].iterrows():
            low, high = row[f"{column}_low"], row[f"{column}_high"]
            bars.append([f"{row['run_name']} ({column.replace('_', ' ')})", float(row[column]),
                         None if math.isnan(low) else float(low), None if math.isnan(high) else float(high),
                         cell(comparison, row, column)])
    return {"kind": "speedup", "bars": bars, "xlabel": "speedup over the reference twin (1 = no difference)",
            "title": f"Speedups with 95% intervals (Welch, over runs)\n{comparison.sweep.name}"}


def _test_accuracy(comparison: "Comparison") -> dict:
    """Test accuracy after each epoch, one line per run, in its setting's colour."""
    colours = {run_id: colour for ids, colour in zip(comparison.table["run_ids"], _colours(comparison))
               for run_id in str(ids).split(",")}
    return {"kind": "test_accuracy", "title": f"Test accuracy per epoch\n{comparison.sweep.name}",
            "lines": [[run.name, [float(v) for v in run.histories.get("test_accuracy") or []],
                       colours.get(run.run_id, "black")] for run in comparison.sweep.children]}


def _time_breakdown(comparison: "Comparison") -> dict:
    """Where each setting's epoch went: data, transfer and compute seconds, stacked (medians over its
    timed runs); settings with no timed run (every run contended) are left out."""
    t = comparison.table
    t = t[t["epoch_duration_s"].notna()]
    labels = [f"{n} [{d}]" if d not in n else n for n, d in zip(t["run_name"], t["device"])]
    labels = [f"{label} (median of {n})" if n > 1 else label for label, n in zip(labels, t["n"])]
    stacks = [[share.replace("_share", ""), colour, (t[share].fillna(0) * t["epoch_duration_s"]).tolist()]
              for share, colour in (("data_share", "tab:orange"), ("transfer_share", "tab:purple"),
                                    ("compute_share", "tab:blue"))]
    return {"kind": "time_breakdown", "labels": labels, "stacks": stacks,
            "xlabel": "seconds per epoch, " + _timed(comparison),
            "title": f"Where each epoch's time goes\n{comparison.sweep.name}"}


def plan(comparison: "Comparison") -> dict[str, dict]:
    """Each chart's file name and data, in JSON's types. The charts of speed are drawn only where a
    setting has a speed figure: where every run is contended (left out, as the speedups leave them),
    only the test accuracy is."""
    charts = {TRADEOFF_PNG: _tradeoff(comparison), EPOCH_DURATION_PNG: _epoch_duration(comparison),
              TEST_ACCURACY_PNG: _test_accuracy(comparison),
              TIME_BREAKDOWN_PNG: _time_breakdown(comparison), SPEEDUP_PNG: _speedup(comparison)}
    drawn = {TRADEOFF_PNG: "points", EPOCH_DURATION_PNG: "bars", TIME_BREAKDOWN_PNG: "labels", SPEEDUP_PNG: "bars"}
    return {name: chart for name, chart in charts.items() if name not in drawn or chart[drawn[name]]}


# --- the drawing: plain values -> PNG (matplotlib) ---------------------------------------------------


def _draw_epoch_duration(chart: dict) -> Figure:
    categories, devices = chart["categories"], chart["devices"]
    width = 0.8 / len(devices)
    fig, ax = _new_axes((max(6.0, 1.3 * len(categories) * max(1, len(devices)) / 1.5), 4.5))
    for i, device in enumerate(devices):
        bars = [(j + (i - (len(devices) - 1) / 2) * width, value, low, high, label)
                for j, d, value, low, high, label in chart["bars"] if d == i]
        whiskers = [[max(0.0, y - lo) for _, y, lo, _, _ in bars], [max(0.0, hi - y) for _, y, _, hi, _ in bars]]
        drawn = ax.bar([x for x, *_ in bars], [y for _, y, *_ in bars], width, label=device,
                       yerr=whiskers, capsize=3, error_kw={"elinewidth": 1})
        # Above each bar, upright: its time to the ms (as every table says it) and its setting's name.
        ax.bar_label(drawn, labels=[f"{y:.3f}  {label}" for _, y, _, hi, label in bars], rotation=90,
                     fontsize=7, padding=3)
    ax.set_xticks(range(len(categories)), [f"bs {b}\n{w} worker{'s' if w != 1 else ''}" for b, w in categories])
    ax.set_xlabel("batch size / DataLoader workers")
    ax.set_ylabel(chart["ylabel"])
    ax.legend(title=chart["legend"])
    top = max((max(value, high) for _, _, value, _, high, _ in chart["bars"]), default=1.0)
    ax.set_ylim(0, 1.7 * top)  # room for the upright labels above the bars
    return fig


def _draw_tradeoff(chart: dict) -> Figure:
    points, front = chart["points"], chart["front"]
    fig, ax = _new_axes((8, 5))
    for i, (label, x, y, colour) in enumerate(points):
        ax.scatter([x], [y], s=60, color=colour, zorder=3, edgecolor="black", linewidth=0.5)
        # Settings often sit close together: labels alternate above and below, slanted, to stay apart.
        above = i % 2 == 0
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 7 if above else -9), fontsize=7,
                    rotation=30 if above else -30, va="bottom" if above else "top", color="black")
    if len(front) > 1:
        ax.plot([points[i][1] for i in front], [points[i][2] for i in front], color="grey", linewidth=1.5,
                linestyle="--", zorder=2, label="best trade-offs: faster and more accurate")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel(chart["xlabel"])
    ax.set_ylabel(chart["ylabel"])
    ax.grid(alpha=0.3)
    ax.margins(x=0.2, y=0.15)  # room for the labels right of the points
    return fig


_DASHES = ("-", "--", "-.", ":")
_MARKERS = "osD^vP<>X"


def _draw_test_accuracy(chart: dict) -> Figure:
    fig, ax = _new_axes((8, 4.5))
    longest, lines = 1, chart["lines"]
    for i, (name, values, colour) in enumerate(lines):
        if values:
            # Runs that learn the same numbers (same seed, 0 or 1 workers) draw the same line: each
            # later line is thinner, with its own dashes and marker, so none hides under another.
            fade = i / max(len(lines) - 1, 1)
            ax.plot(range(1, len(values) + 1), values, label=name, color=colour, linestyle=_DASHES[i % len(_DASHES)],
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


def _draw_speedup(chart: dict) -> Figure:
    bars = chart["bars"]
    fig, ax = _new_axes((8, 0.5 * len(bars) + 1.8))
    values = [value for _, value, _, _, _ in bars]
    whiskers = [[value - low if low is not None else 0.0 for _, value, low, _, _ in bars],
                [high - value if high is not None else 0.0 for _, value, _, high, _ in bars]]
    drawn = ax.barh([label for label, *_ in bars], values, xerr=whiskers, capsize=3, color="tab:green",
                    error_kw={"elinewidth": 1})
    ax.bar_label(drawn, labels=[text for *_, text in bars], fontsize=8, padding=4)
    ax.axvline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.invert_yaxis()
    ax.set_xlabel(chart["xlabel"])
    ax.margins(x=0.35)  # room for the labels right of the bars
    return fig


_DRAW = {"tradeoff": _draw_tradeoff, "epoch_duration": _draw_epoch_duration, "test_accuracy": _draw_test_accuracy,
         "time_breakdown": _draw_time_breakdown, "speedup": _draw_speedup}


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
        with replacing(folder / name) as temporary:  # a user's file of that name is replaced whole or not at all
            fig.savefig(temporary, dpi=DPI, bbox_inches="tight", format="png")
        paths.append(folder / name)
    return paths


def write_all(comparison: "Comparison", folder: Path) -> list[Path]:
    """The comparison's charts in `folder`."""
    return draw(plan(comparison), folder)
