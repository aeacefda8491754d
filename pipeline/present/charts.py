"""PNG charts of a comparison (matplotlib, no display needed).

Two halves. `plan` turns a Comparison into plain data (names, numbers, labels); `draw` turns that
data into PNG files with matplotlib's object API (Agg figures of its own, never pyplot: drawing in
a notebook's process leaves its backend and figures alone).
"""

from __future__ import annotations

import math
import numbers
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.analysis.compare import SPEEDUPS, ranks_on_target
from pipeline.base.files import replacing
from pipeline.base.names import (
    ACHIEVED_TFLOPS,
    FINAL_ACCURACY,
    PEAK_BANDWIDTH,
    PEAK_TFLOPS,
    STEADY_EPOCH,
    TIME_SHARES,
    TRAIN_BYTES,
    TRAIN_FLOPS,
)
from pipeline.present.palette import colours
from pipeline.present.sentences import cell
from pipeline.settings.config import KEYS
from pipeline.settings.grid import format_value, short

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from pipeline.analysis.compare import Comparison

TRADEOFF_PNG = "accuracy_vs_time.png"  # first in comparison/ (names sort), first in `plan`
EPOCH_DURATION_PNG = "epoch_duration.png"
TEST_ACCURACY_PNG = "test_accuracy.png"
TIME_BREAKDOWN_PNG = "time_breakdown.png"
SPEEDUP_PNG = "speedup.png"  # only where some row has a speedup
ROOFLINE_PNG = "roofline.png"  # only where some row has its FLOPs, bytes and achieved FLOP/s


DPI = 120


def _new_axes(figsize: tuple[float, float]):
    """A figure with an Agg canvas (files only, no display, no pyplot) and its one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


# --- the data: Comparison -> plain values (no matplotlib) -------------------------------------------


def _timed(comparison: Comparison) -> str:
    """Which epochs the chart's times average, as the table's `timed` column says."""
    labels = comparison.table["timed"].unique()
    return labels[0] if len(labels) == 1 else "steady state where a run had 2+ epochs"


def _settings(comparison: Comparison) -> Iterator[tuple[pd.Series, str, str]]:
    """Each row of the table (a setting) with its label and its colour: the UI's (palette.colours, one
    per row), so that a setting has one colour in every chart and in the MLflow UI."""
    t = comparison.table
    for (_, row), colour in zip(t.iterrows(), colours(comparison)):
        yield row, comparison.label(row), colour


# What a missing figure is called where a chart says why a setting is not on it.
_FIGURE_NAMES = {
    "epoch_duration_s": "epoch time",
    STEADY_EPOCH: "epoch time",
    "run_duration_s": "run duration",
    FINAL_ACCURACY: "final test accuracy",
    "test_accuracy": "test accuracy per epoch",
    **{share: "time shares" for share in TIME_SHARES},
    TRAIN_FLOPS: "FLOP count",
    TRAIN_BYTES: "byte count",
    ACHIEVED_TFLOPS: "achieved FLOP/s",
}


def _not_shown(row: pd.Series, label: str, column: str) -> str:
    """Why `row` has no `column` to draw, after its label: a speed figure counts only the timed runs,
    so a setting whose every run was contended has none (compare.Comparison.timed_runs)."""
    speed = column not in (FINAL_ACCURACY, "test_accuracy")
    why = "every run contended" if speed and not row["timed_runs"] else f"no {_FIGURE_NAMES[column]} logged"
    return f"{label} ({why})"


def _missing(value: Any) -> bool:
    return value is None or math.isnan(float(value))


def _group_keys() -> list[str]:
    """The keys the epoch chart groups its bars by: those the table gives words on a chart's axis
    (config.Key.chart_group), in the table's order."""
    return [name for name, key in KEYS.items() if key.chart_group]


def _group_value(value: Any) -> Any:
    """A setting's value of a group key in JSON's types: None where its runs did not record it, a
    whole number as an int (a column is floats where some run lacks the param)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value  # a numpy scalar as its Python value


def _tick(key: str, value: Any) -> str:
    """One group key's value on a tick, as run names show it but readable apart: "bs 128", "w 2",
    "cpu", "compiled" ("?" for a value its runs did not record)."""
    name = KEYS[key].name
    if value is None:
        return f"{name} ?" if isinstance(name, str) and name else "?"
    if isinstance(name, tuple):
        return short(key, value)
    return f"{name} {format_value(value)}" if name else format_value(value)


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """The indices of the best trade-offs among (time, accuracy) points, fastest first: each is more
    accurate than every faster point (no other point is both faster and at least as accurate)."""
    front, best = [], -math.inf
    for i in sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1])):
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _tradeoff(comparison: Comparison) -> dict:
    """Speed against accuracy, one labelled point per setting at its final test accuracy. Without a
    target its x is its epoch time, whiskers from its first to its third quartile. With one, a
    setting that ranks on the target (compare.ranks_on_target: every run reached it) is at its time
    to it (the geometric mean over its runs); one that missed it in any run is hollow, at its total
    training time (its median run duration): every setting is
    on the chart, and none is drawn faster than it was. The best trade-offs (the Pareto front, among
    the points whose x is the same figure) are ringed, and joined where there are two or more."""

    t = comparison.table
    to_target = comparison.target is not None and "target_runs" in t and bool((t["target_runs"] > 0).any())
    points: list[dict[str, Any]] = []
    left_out = []
    for row, label, colour in _settings(comparison):
        reached = ranks_on_target(row) and not _missing(row["time_to_target_s"])
        missed = to_target and not reached
        column = ("run_duration_s" if missed else "time_to_target_s") if to_target else STEADY_EPOCH
        absent = next((c for c in (column, FINAL_ACCURACY) if _missing(row[c])), None)
        if absent is not None:
            left_out.append(_not_shown(row, label, absent))
            continue
        if missed:
            label += (
                f" (reached in {row['target_reached']}/{row['target_runs']} runs)"
                if row["target_runs"]
                else " (trained without the target)"
            )
        low, high = (math.nan, math.nan) if to_target else (row["epoch_duration_s_q1"], row["epoch_duration_s_q3"])
        points.append(
            {
                "label": label,
                "colour": colour,
                "missed": bool(missed),
                "x": round(float(row[column]), 3),
                "y": round(float(row[FINAL_ACCURACY]), 4),
                "low": None if _missing(low) else round(float(low), 3),
                "high": None if _missing(high) else round(float(high), 3),
            }
        )
    # Only points of the same figure compete: a setting's training time is no time to the target.
    ranked = [i for i, point in enumerate(points) if not point["missed"]]
    front = [ranked[i] for i in pareto([(points[i]["x"], points[i]["y"]) for i in ranked])]
    among = " that reached it" if to_target else ""
    front_label = (
        f"best trade-offs (ringed, joined): each more accurate than every faster setting{among}"
        if len(front) > 1
        else f"best trade-off (ringed): more accurate than every faster setting{among}"
    )
    if to_target:
        xlabel = (
            f"time to {comparison.target} (s), geometric mean over the runs, every one of which reached it\n"
            "settings that missed it in any run: total training time (s), median run duration"
        )
    else:
        xlabel = f"epoch time (s), {_timed(comparison)}; whiskers: first to third quartile over its runs"
    return {
        "kind": "tradeoff",
        "points": points,
        "front": front,
        "front_label": front_label,
        "reached_label": "reached the target in every run: time to it" if to_target else None,
        "missed_label": (
            "missed the target: drawn at total training time" if any(point["missed"] for point in points) else None
        ),
        "left_out": left_out,
        "xlabel": xlabel,
        "ylabel": "final test accuracy",
        "title": f"Speed against accuracy\n{comparison.sweep.name}",
    }


def _epoch_duration(comparison: Comparison) -> dict:
    """Steady-state epoch duration (timing.steady), one bar per setting in its colour, grouped by the
    group keys (batch size, workers: _group_keys): the geometric mean over the setting's timed runs
    (the estimate its speedups are ratios of), whiskers from its first to its third quartile."""
    groups = _group_keys()
    bars: list[dict[str, Any]] = []
    left_out = []
    for row, label, colour in _settings(comparison):
        if _missing(row["epoch_duration_s"]):
            left_out.append(_not_shown(row, label, "epoch_duration_s"))
            continue
        bars.append(
            {
                "label": label,
                "colour": colour,
                "category": [_group_value(row[key]) if key in row else None for key in groups],
                "value": round(float(row[STEADY_EPOCH]), 3),  # the figure every surface shows
                "low": round(float(row["epoch_duration_s_q1"]), 3),
                "high": round(float(row["epoch_duration_s_q3"]), 3),
            }
        )
    categories = sorted({tuple(bar["category"]) for bar in bars}, key=lambda c: [(v is None, v or 0) for v in c])
    for bar in bars:
        bar["category"] = categories.index(tuple(bar["category"]))
    words = [KEYS[key].chart_group for key in groups]
    return {
        "kind": "epoch_duration",
        "categories": [list(c) for c in categories],
        "ticks": ["\n".join(_tick(key, value) for key, value in zip(groups, c)) for c in categories],
        "bars": bars,
        "legend": "setting",
        "left_out": left_out,
        "xlabel": " / ".join(words),
        "ylabel": "epoch duration (s), " + _timed(comparison) + "\ngeometric mean over the runs, "
        "whiskers: first to third quartile",
        "title": f"Epoch duration by {' and '.join(words)}\n{comparison.sweep.name}",
    }


def _speedup(comparison: Comparison) -> dict:
    """Every speedup a row has over its reference twin, one bar each, whiskers at its 95% interval;
    the label says it in words, with (n.s.) where the interval includes no difference."""

    t = comparison.table
    bars = []
    for column in SPEEDUPS:
        if column not in t:
            continue
        for _, row in t[t[column].notna() & (t[f"{column}_vs"] != "")].iterrows():
            low, high = row[f"{column}_low"], row[f"{column}_high"]
            bars.append(
                [
                    f"{row['run_name']} ({column.replace('_', ' ')})",
                    round(float(row[column]), 3),
                    None if math.isnan(low) else round(float(low), 3),
                    None if math.isnan(high) else round(float(high), 3),
                    cell(comparison, row, column),
                ]
            )
    return {
        "kind": "speedup",
        "bars": bars,
        "xlabel": "speedup over the reference twin (1 = no difference)",
        "title": f"Speedups with 95% intervals (Welch, over runs)\n{comparison.sweep.name}",
    }


def _test_accuracy(comparison: Comparison) -> dict:
    """Test accuracy after each epoch, one line per run in its setting's colour, the runs of each
    setting together: the legend names settings, not runs."""
    runs = {run.run_id: run for run in comparison.sweep.children}
    settings, left_out = [], []
    for row, label, colour in _settings(comparison):
        lines = [
            [runs[run_id].name, [round(float(v), 4) for v in runs[run_id].histories.get("test_accuracy") or []]]
            for run_id in str(row["run_ids"]).split(",")
            if run_id in runs
        ]
        if any(values for _, values in lines):
            settings.append({"label": label, "colour": colour, "runs": lines})
        else:
            left_out.append(_not_shown(row, label, "test_accuracy"))
    return {
        "kind": "test_accuracy",
        "settings": settings,
        "left_out": left_out,
        "xlabel": "epoch",
        "ylabel": "test accuracy (fraction correct)",
        "title": f"Test accuracy per epoch\n{comparison.sweep.name}",
    }


def _time_breakdown(comparison: Comparison) -> dict:
    """Where each setting's epoch went: data, transfer and compute seconds, stacked (medians over its
    timed runs), its label in its colour. A setting whose runs logged no shares has no bar (rather
    than one of 0 s)."""
    shown, labels, colours, left_out = [], [], [], []
    for row, label, colour in _settings(comparison):
        absent = (
            "epoch_duration_s"
            if _missing(row["epoch_duration_s"])
            else TIME_SHARES[0]
            if all(_missing(row[share]) for share in TIME_SHARES)
            else None
        )
        if absent is not None:
            left_out.append(_not_shown(row, label, absent))
            continue
        shown.append(row)
        labels.append(f"{label} (median of {row['timed_runs']} runs)" if row["timed_runs"] > 1 else label)
        colours.append(colour)
    # A share its runs did not log is drawn as 0 s; the others are what they measured.
    stacks = [
        [
            share.replace("_share", ""),
            colour,
            [0.0 if _missing(row[share]) else round(float(row[share] * row["epoch_duration_s"]), 3) for row in shown],
        ]
        for share, colour in (
            ("data_share", "tab:orange"),
            ("transfer_share", "tab:purple"),
            ("compute_share", "tab:blue"),
        )
    ]
    return {
        "kind": "time_breakdown",
        "labels": labels,
        "colours": colours,
        "stacks": stacks,
        "left_out": left_out,
        "xlabel": "seconds per epoch, " + _timed(comparison),
        "title": f"Where each epoch's time goes\n{comparison.sweep.name}",
    }


def _roofline(comparison: Comparison) -> dict:
    """Each setting's arithmetic intensity (the FLOPs of an epoch over its counted bytes, flops.py)
    against the FLOP/s it achieved (the median over its timed runs), log-log, under the roof of each
    device and precision in the sweep: min(the measured matmul peak, intensity x the measured copy
    bandwidth), as its runs logged them from the peak cache (peak.py). The bytes are the eager count,
    an upper bound: a point's intensity is a lower bound, and the point may sit right of where it is
    drawn."""
    points: list[dict[str, Any]] = []
    roofs: dict[tuple[str, str, str], dict[str, Any]] = {}
    left_out = []
    for row, label, colour in _settings(comparison):
        absent = next((c for c in (TRAIN_FLOPS, TRAIN_BYTES, ACHIEVED_TFLOPS) if _missing(row.get(c))), None)
        if absent is not None:
            left_out.append(_not_shown(row, label, absent))
            continue
        points.append(
            {
                "label": label,
                "colour": colour,
                "x": _rounded(float(row[TRAIN_FLOPS]) / float(row[TRAIN_BYTES])),
                "y": _rounded(float(row[ACHIEVED_TFLOPS]) * 1e12),
            }
        )
        if _missing(row.get(PEAK_TFLOPS)) or _missing(row.get(PEAK_BANDWIDTH)):
            continue
        device = str(row["device"]).partition(":")[0]
        precision = str(row.get("precision", "fp32"))
        key = (device, str(row["hardware"]), precision)
        if key not in roofs:
            peak, bandwidth = float(row[PEAK_TFLOPS]), float(row[PEAK_BANDWIDTH])  # TFLOP/s, GB/s
            roofs[key] = {
                "label": f"{row['hardware'] or device} {precision}: {peak:.3g} TFLOP/s, {bandwidth:,.0f} GB/s",
                "peak": _rounded(peak * 1e12),
                "bandwidth": _rounded(bandwidth * 1e9),
            }
    return {
        "kind": "roofline",
        "points": points,
        "roofs": list(roofs.values()),
        "left_out": left_out,
        "xlabel": "arithmetic intensity (FLOPs per byte of the eager, unfused step: a lower bound)",
        "ylabel": f"achieved TFLOP/s, {_timed(comparison)}\nmedian over the runs",
        "title": f"Roofline: achieved FLOP/s under each device's measured peaks\n{comparison.sweep.name}",
    }


def _rounded(value: float) -> float:
    """A figure to 4 significant digits, as a chart's data carries it."""
    return float(f"{value:.4g}")


def plan(comparison: Comparison) -> dict[str, dict]:
    """Each chart's file name and data, in JSON's types. A chart is drawn only where it has something
    to draw: where every run is contended (no speed figure, as the speedups leave them out), only the
    test accuracy is. On a drawn chart every setting is either drawn or named in its `left_out`."""
    charts = {
        TRADEOFF_PNG: _tradeoff(comparison),
        EPOCH_DURATION_PNG: _epoch_duration(comparison),
        TEST_ACCURACY_PNG: _test_accuracy(comparison),
        TIME_BREAKDOWN_PNG: _time_breakdown(comparison),
        SPEEDUP_PNG: _speedup(comparison),
        ROOFLINE_PNG: _roofline(comparison),
    }
    drawn = {
        TRADEOFF_PNG: "points",
        EPOCH_DURATION_PNG: "bars",
        TEST_ACCURACY_PNG: "settings",
        TIME_BREAKDOWN_PNG: "labels",
        SPEEDUP_PNG: "bars",
        ROOFLINE_PNG: "points",
    }
    return {name: chart for name, chart in charts.items() if chart[drawn[name]]}


# --- the drawing: plain values -> PNG (matplotlib) ---------------------------------------------------


def _span(values: list[float], floor: float, ceiling: float = math.inf, pad: float = 0.15) -> tuple[float, float]:
    """An axis's limits around `values`, with room for labels on either side but never past what the
    figure can be: accuracy within 0..1, a time never below 0 (matplotlib's margins alone drew an
    accuracy above 1 near a point at 0.998, and negative seconds left of a point near 0)."""
    low, high = min(values), max(values)
    room = pad * ((high - low) or abs(high) or 1.0)
    return max(floor, low - room), min(ceiling, high + room)


def _draw_epoch_duration(chart: dict) -> Figure:
    categories, bars = chart["categories"], chart["bars"]
    groups = [[bar for bar in bars if bar["category"] == j] for j in range(len(categories))]
    width = 0.8 / max(len(group) for group in groups)
    xs = [j + (k - (len(group) - 1) / 2) * width for j, group in enumerate(groups) for k in range(len(group))]
    bars = [bar for group in groups for bar in group]  # in the order of xs
    fig, ax = _new_axes((max(6.0, 0.45 * len(bars) + 2.0), 4.5))
    values = [bar["value"] for bar in bars]
    whiskers = [
        [max(0.0, bar["value"] - bar["low"]) for bar in bars],
        [max(0.0, bar["high"] - bar["value"]) for bar in bars],
    ]
    drawn = ax.bar(
        xs, values, width, color=[bar["colour"] for bar in bars], yerr=whiskers, capsize=3, error_kw={"elinewidth": 1}
    )
    # Above each bar, upright: its time to the ms (as every table says it) and its setting's name.
    ax.bar_label(
        drawn, labels=[f"{bar['value']:.3f}  {bar['label']}" for bar in bars], rotation=90, fontsize=7, padding=3
    )
    ax.set_xticks(range(len(categories)), chart["ticks"])
    ax.set_xlabel(chart["xlabel"])
    ax.set_ylabel(chart["ylabel"])
    # Right of the axes, one entry per setting: the upright labels fill the space above the bars.
    ax.legend(
        drawn.patches,
        [bar["label"] for bar in bars],
        title=chart["legend"],
        fontsize=7,
        loc="center left",
        bbox_to_anchor=(1.01, 0.5),
    )
    top = max(max(bar["value"], bar["high"]) for bar in bars)
    ax.set_ylim(0, 1.7 * top)  # room for the upright labels above the bars
    return fig


def _legend_marker(label: str, filled: bool, joined: bool = False, size: float = 8):
    """A legend entry for a kind of point (none of the points stands for its kind: each has its colour)."""
    from matplotlib.lines import Line2D

    return Line2D(
        [],
        [],
        label=label,
        color="grey",
        linestyle="--" if joined else "none",
        marker="o",
        markersize=size,
        markerfacecolor="grey" if filled else "none",
        markeredgecolor="black",
    )


def _draw_tradeoff(chart: dict) -> Figure:
    points, front = chart["points"], chart["front"]
    fig, ax = _new_axes((8, 5))
    for i, point in enumerate(points):
        x, y, colour = point["x"], point["y"], point["colour"]
        if point["missed"]:  # hollow: its x is its training time, not a time to the target
            ax.scatter([x], [y], s=60, zorder=3, facecolors="none", edgecolors=colour, linewidths=1.5)
        else:
            ax.scatter([x], [y], s=60, zorder=3, color=colour, edgecolors="black", linewidths=0.5)
        if point["low"] is not None and point["high"] is not None and point["low"] < point["high"]:
            ax.errorbar(
                [x],
                [y],
                xerr=[[max(0.0, x - point["low"])], [max(0.0, point["high"] - x)]],
                fmt="none",
                ecolor=colour,
                elinewidth=1,
                capsize=3,
                zorder=2,
            )
        # Settings often sit close together: labels alternate above and below to stay apart.
        above = i % 2 == 0
        ax.annotate(
            f"{point['label']}\n{x:.3f} s, {y:.4f}",
            (x, y),
            textcoords="offset points",
            xytext=(5, 6 if above else -6),
            fontsize=7,
            va="bottom" if above else "top",
        )
    handles = []
    if front:
        ax.scatter(
            [points[i]["x"] for i in front],
            [points[i]["y"] for i in front],
            s=220,
            zorder=4,
            facecolors="none",
            edgecolors="black",
            linewidths=1.2,
        )
        if len(front) > 1:
            ax.plot(
                [points[i]["x"] for i in front],
                [points[i]["y"] for i in front],
                color="grey",
                linewidth=1.5,
                linestyle="--",
                zorder=2,
            )
        handles.append(_legend_marker(chart["front_label"], False, joined=len(front) > 1, size=14))
    if chart["reached_label"]:
        handles.append(_legend_marker(chart["reached_label"], True))
    if chart["missed_label"]:
        handles.append(_legend_marker(chart["missed_label"], False))
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_xlabel(chart["xlabel"])
    ax.set_ylabel(chart["ylabel"])
    ax.grid(alpha=0.3)
    xs = [v for point in points for v in (point["x"], point["low"], point["high"]) if v is not None]
    ax.set_xlim(*_span(xs, 0.0, pad=0.3))  # room for the labels right of the points
    ax.set_ylim(*_span([point["y"] for point in points], 0.0, 1.0, pad=0.25))
    return fig


_DASHES = ("-", "--", "-.", ":")
_MARKERS = "osD^vP<>X"


def _draw_test_accuracy(chart: dict) -> Figure:
    fig, ax = _new_axes((8, 4.5))
    lines = [(setting, values) for setting in chart["settings"] for _, values in setting["runs"] if values]
    labelled: set[str] = set()
    for i, (setting, values) in enumerate(lines):
        # Runs that learn the same numbers (same seed, 0 or 1 workers) draw the same line: each
        # later line is thinner, with its own dashes and marker, so none hides under another.
        fade = i / max(len(lines) - 1, 1)
        first = setting["label"] not in labelled  # one legend entry per setting, its runs share it
        labelled.add(setting["label"])
        ax.plot(
            range(1, len(values) + 1),
            values,
            label=setting["label"] if first else None,
            color=setting["colour"],
            linestyle=_DASHES[i % len(_DASHES)],
            marker=_MARKERS[i % len(_MARKERS)],
            linewidth=3.5 - 2.5 * fade,
            markersize=9 - 5 * fade,
            alpha=0.85,
        )
    longest = max(len(values) for _, values in lines)
    ax.set_xlabel(chart["xlabel"])
    ax.set_ylabel(chart["ylabel"])
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlim(0.5, longest + 0.5)
    ax.set_ylim(*_span([v for _, values in lines for v in values], 0.0, 1.0, pad=0.1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="setting")
    return fig


def _draw_time_breakdown(chart: dict) -> Figure:
    labels = chart["labels"]
    fig, ax = _new_axes((8, 0.45 * len(labels) + 1.8))
    rows = range(len(labels))  # positions, not names: two settings may share a label
    left = [0.0] * len(labels)
    for name, colour, seconds in chart["stacks"]:
        ax.barh(rows, seconds, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, seconds)]
    ax.set_yticks(rows, labels)
    for text, colour in zip(ax.get_yticklabels(), chart["colours"]):
        text.set_color(colour)  # the bars' colours say where the time went; the names', which setting
    ax.invert_yaxis()
    ax.set_xlim(left=0.0)
    ax.set_xlabel(chart["xlabel"])
    # Right of the axes: the bars span the plot's whole width, so any legend inside covers one.
    ax.legend(title="time spent on", fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _draw_speedup(chart: dict) -> Figure:
    bars = chart["bars"]
    fig, ax = _new_axes((8, 0.5 * len(bars) + 1.8))
    values = [value for _, value, _, _, _ in bars]
    whiskers = [
        [value - low if low is not None else 0.0 for _, value, low, _, _ in bars],
        [high - value if high is not None else 0.0 for _, value, _, high, _ in bars],
    ]
    drawn = ax.barh(
        [label for label, *_ in bars], values, xerr=whiskers, capsize=3, color="tab:green", error_kw={"elinewidth": 1}
    )
    ax.bar_label(drawn, labels=[text for *_, text in bars], fontsize=8, padding=4)
    ax.axvline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.invert_yaxis()
    ax.set_xlabel(chart["xlabel"])
    ax.margins(x=0.35)  # room for the labels right of the bars
    return fig


def _draw_roofline(chart: dict) -> Figure:
    points, roofs = chart["points"], chart["roofs"]
    fig, ax = _new_axes((8, 5))
    xs = [point["x"] for point in points] + [roof["peak"] / roof["bandwidth"] for roof in roofs]
    ys = [point["y"] for point in points] + [roof["peak"] for roof in roofs]
    low, high = min(xs) / 4, max(xs) * 4  # room either side, and each roof's ridge in view
    for i, roof in enumerate(roofs):
        ridge = roof["peak"] / roof["bandwidth"]
        line = [low, *([ridge] if low < ridge < high else []), high]
        ax.plot(
            line,
            [min(roof["peak"], x * roof["bandwidth"]) for x in line],
            color="black",
            linestyle=_DASHES[i % len(_DASHES)],
            linewidth=1.2,
            label=roof["label"],
        )
    for i, point in enumerate(points):
        x, y = point["x"], point["y"]
        ax.scatter([x], [y], s=60, zorder=3, color=point["colour"], edgecolors="black", linewidths=0.5)
        above = i % 2 == 0  # settings often sit close together: labels alternate above and below
        ax.annotate(
            point["label"],
            (x, y),
            textcoords="offset points",
            xytext=(5, 6 if above else -6),
            fontsize=7,
            va="bottom" if above else "top",
        )
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)  # 16x wide and at least 12x high: each axis spans a decade
    ax.set_ylim(min(ys) / 4, max(ys) * 3)
    # Plain numbers at 1, 2 and 5 of each decade (TFLOP/s on y), not powers of ten; other ticks unlabelled.
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1e12:g}"))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(chart["xlabel"])
    ax.set_ylabel(chart["ylabel"])
    ax.grid(alpha=0.3, which="both")
    if roofs:
        ax.legend(
            title="roof: min(matmul peak, intensity x copy bandwidth)",
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
        )
    return fig


_DRAW = {
    "tradeoff": _draw_tradeoff,
    "epoch_duration": _draw_epoch_duration,
    "test_accuracy": _draw_test_accuracy,
    "time_breakdown": _draw_time_breakdown,
    "speedup": _draw_speedup,
    "roofline": _draw_roofline,
}


def figure(chart: dict) -> Figure:
    """One planned chart as a figure, for callers that look at its parts. Settings the chart could
    not place are named under its x axis, with why. Legends may lie outside the figure's own box:
    save it as `draw` does, with bbox_inches="tight"."""
    fig = _DRAW[chart["kind"]](chart)
    ax = fig.axes[0]
    ax.set_title(chart["title"], fontsize=10)
    if chart.get("left_out"):
        note = textwrap.fill("not shown: " + "; ".join(chart["left_out"]), 110)
        ax.set_xlabel(f"{ax.get_xlabel()}\n{note}")
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
