"""A comparison's tables and the regression gate's: the human view (a terminal's, markdown's), and
the data as csv or json. Presentation: it lays out what compare.py and gate.py computed, in the
verdict's words (sentences.cell); report.py draws the terminal's tables from these frames.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from pipeline.analysis import gate
from pipeline.analysis.compare import SPEEDUPS, Comparison, ranks_on_target
from pipeline.analysis.figures import ALWAYS, LEAD, SOME, figures, fixed, named, percent, tflops
from pipeline.base.names import FINAL_ACCURACY, STEADY_EPOCH, STEADY_IMAGES
from pipeline.present.sentences import cell, change_words, gate_verdict
from pipeline.settings.config import KEYS
from pipeline.settings.grid import format_value

SPEEDUP_LABELS = tuple(column.replace("_", " ") for column in SPEEDUPS)  # their columns in the human view


def render(comparison: Comparison, fmt: str) -> str:
    """csv, markdown or json text of the comparison table (table format is drawn by report)."""
    table = comparison.table
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "json":
        return json.dumps(json.loads(table.to_json(orient="records")), indent=2) + "\n"
    if fmt == "markdown":
        return markdown(display_frame(comparison))
    raise ValueError(fmt)


def display_frame(comparison: Comparison, compact: bool = False, stacked: bool = False) -> pd.DataFrame:
    """The human view. Full (markdown, `pipeline compare --wide`): settings, n, results, time shares
    and speedups, formatted; `stacked` (a terminal) puts intervals on their cell's second line.
    `compact` (a terminal, by default): the decision columns only (decision_frame)."""
    if compact:
        return decision_frame(comparison)
    t = comparison.table
    always = sorted((k for k, key in KEYS.items() if key.shown == "always"), key=lambda k: k != "device")
    settings = [k for k in always if k in t] + [
        k for k in comparison.varying if k in KEYS and KEYS[k].shown == "varying"
    ]
    out = t[settings].copy()
    for name, worded in KEYS.items():  # a key with words of its own (data_on_device: "data path")
        if worded.column and name in t:
            heading, on, off = worded.column
            flags = [str(v).lower() == "true" for v in t[name]]
            if any(flags):
                out[heading] = [on if flag else off for flag in flags]
    out["n"] = t["n"]
    if t["contended"].any():
        out["contended"] = _contended(t)
    for figure in figures(shown=LEAD):  # what was learnt
        out[figure.heading] = t[figure.name].map(figure.text)
    out[label_of("epoch_duration_s")] = _spreads(t, compact=stacked)
    out["timed"] = t["timed"]
    if comparison.target is not None:
        out[label_of("time_to_target_s")] = [_to_target(row, stacked) for _, row in t.iterrows()]
    for figure in figures():  # the figures after the epoch time: always, or where some row has one
        if figure.shown == ALWAYS or (figure.shown == SOME and figure.name in t and t[figure.name].notna().any()):
            out[figure.heading] = t[figure.name].map(figure.text)
    return pd.concat([out, speedup_columns(comparison, t, always=("speedup",), compact=stacked)], axis=1)


def decision_frame(comparison: Comparison, stacked: bool = True) -> pd.DataFrame:
    """What a decision rests on, narrow enough for a 120-column terminal (a narrower one folds it into
    tables that each repeat the settings: verdict.frame_tables): the device and the settings that vary,
    n where a setting was repeated, the epoch time with its interquartile range under it, time to
    target where timed, the speedups this sweep has (each interval on its cell's second line), test
    accuracy and images/s. Columns with nothing in them for this sweep are left out. In the table's
    order: the verdict's (best first, then fastest first), unless --sort said otherwise. Not
    `stacked` (markdown): each interval beside its figure, in brackets, one line a cell."""
    t = comparison.table
    out = t[comparison.setting_columns].copy()
    if (t["n"] > 1).any():
        out["n"] = t["n"]
    if t["contended"].any():
        out["contended"] = _contended(t)
    out[label_of("epoch_duration_s")] = _spreads(t, compact=stacked)
    if t["timed"].nunique() > 1:
        out["timed"] = t["timed"]
    if comparison.target is not None:
        out[label_of("time_to_target_s")] = [_to_target(row, stacked) for _, row in t.iterrows()]
    out = pd.concat([out, speedup_columns(comparison, t, compact=stacked)], axis=1)
    out[label_of("test_accuracy")] = t[FINAL_ACCURACY].map(fixed(4))
    out[label_of("images_per_s")] = t[STEADY_IMAGES].map(fixed(0))
    return out


def utilisation_frame(comparison: Comparison) -> pd.DataFrame:
    """How far each setting ran from its device's limit: its device, hardware and varying settings,
    the FLOPs of an epoch, the FLOP/s it achieved in steady state, the device's measured matmul peak
    at its precision and the share of it (MFU); where the runs counted their bytes, the bytes of an
    epoch (the eager count), the FLOPs per byte, and the share of the device's copy bandwidth where
    some setting has one (CUDA, compile off). Empty where no run logged them (runs made before)."""
    t = comparison.table
    if "mfu" not in t or not t["achieved_tflops"].notna().any():
        return pd.DataFrame()
    settings = list(dict.fromkeys(["device", "hardware", *comparison.varying]))
    out = t[[c for c in settings if c in t]].copy()
    out["GFLOP/epoch"] = t["train_flops_per_epoch"].map(lambda v: "-" if math.isnan(v) else f"{v / 1e9:,.1f}")
    if "train_bytes_per_epoch" in t and t["train_bytes_per_epoch"].notna().any():
        moved = t["train_bytes_per_epoch"]
        out["GB/epoch"] = moved.map(lambda v: "-" if math.isnan(v) else f"{v / 1e9:,.2f}")
        out["FLOP/byte"] = (t["train_flops_per_epoch"] / moved).map(lambda v: "-" if math.isnan(v) else f"{v:.3g}")
    out["achieved TFLOP/s"] = t["achieved_tflops"].map(tflops)
    out["peak TFLOP/s"] = t["peak_tflops"].map(tflops)
    out["MFU %"] = t["mfu"].map(percent)
    if "bandwidth_share" in t and t["bandwidth_share"].notna().any():
        out["BW %"] = t["bandwidth_share"].map(percent)
    return out


def _contended(t: pd.DataFrame) -> list[str]:
    return [f"{c}/{n}" if c else "" for c, n in zip(t["contended"], t["n"])]


def _spreads(t: pd.DataFrame, compact: bool) -> list[str]:
    return [
        spread(m, q1, q3, compact)
        for m, q1, q3 in zip(t[STEADY_EPOCH], t["epoch_duration_s_q1"], t["epoch_duration_s_q3"])
    ]


def label_of(name: str) -> str:
    """A figure's heading in the human view (figures.FIGURES)."""
    figure = named(name)
    return figure.heading if figure is not None else name


def caption(comparison: Comparison) -> str:
    """What the compact view leaves out of its columns: the settings every row shares."""
    t = comparison.table
    shown = [k for k in KEYS if KEYS[k].shown == "always" and k != "device" and k in t and k not in comparison.varying]
    same = ", ".join(f"{k} {format_value(t[k].iloc[0])}" for k in shown)
    return f"every row: {same}" if same else ""


def timed_title(comparison: Comparison) -> str:
    """Which epochs the epoch times are, for a table's title: "epoch s: median of epochs 2-4, geometric
    mean over the runs"."""
    labels = comparison.table["timed"].unique()
    timed = labels[0] if len(labels) == 1 else "the steady epochs (see timed)"
    return f"epoch s: median of {timed}, geometric mean over the runs, quartiles under it"


def spread(figure: float, q1: float, q3: float, compact: bool) -> str:
    """An epoch time and its runs' interquartile range: "0.300 [0.290-0.310]" (none where they agree;
    "-" where every run was contended and the figure is withheld)."""
    if math.isnan(figure):
        return "-"
    if math.isnan(q1) or f"{q1:.3f}" == f"{q3:.3f}":
        return f"{figure:.3f}"
    return f"{figure:.3f}\n{q1:.3f}-{q3:.3f}" if compact else f"{figure:.3f} [{q1:.3f}-{q3:.3f}]"


def _to_target(row: pd.Series, compact: bool) -> str:
    """A row's time to target (the geometric mean over its runs) where every timed run reached it:
    "1.23 (4/4)"; else how many did, "reached in 1 of 4" (it ranks by epoch time instead), or "not
    reached (0/4)"; "-" where its runs were trained without the target."""
    if not row["target_runs"]:
        return "-"
    reached, runs = row["target_reached"], row["target_runs"]
    if ranks_on_target(row):
        time, count = f"{row['time_to_target_s']:.2f}", f"({reached}/{runs})"
    elif reached:
        time, count = "reached in", f"{reached} of {runs}"
    else:
        time, count = "not reached", f"(0/{runs})"
    return f"{time}\n{count}" if compact else f"{time} {count}"


def speedup_columns(
    comparison: Comparison, frame: pd.DataFrame | None = None, always: tuple[str, ...] = (), compact: bool = False
) -> pd.DataFrame:
    """One text column per speedup in `frame` (the comparison's table, or rows of it; and those in
    `always`): "ref" on the reference row, "2.41x faster [2.30-2.52]" on its twins (cell, with a
    faster row's accuracy shortfall beyond the margin), empty where a row has no twin."""
    frame = comparison.table if frame is None else frame
    columns = {}
    for column, label in zip(SPEEDUPS, SPEEDUP_LABELS):
        values = frame[column] if column in frame else pd.Series([math.nan] * len(frame), index=frame.index)
        if column not in always and not values.notna().any():
            continue
        cells = []
        for index, value in values.items():
            reference = frame.at[index, f"{column}_vs"] == "" if f"{column}_vs" in frame else False
            if math.isnan(value):
                cells.append("")
            elif reference:
                cells.append("ref")
            else:
                cells.append(cell(comparison, frame.loc[index], column, compact))
        columns[label] = cells
    return pd.DataFrame(columns, index=frame.index)


def markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


# --- the regression gate ---------------------------------------------------------------------------


def gate_display_frame(result: gate.GateResult) -> pd.DataFrame:
    """The human view: one row per point."""

    def seconds(value: float) -> str:
        return "-" if math.isnan(value) else f"{value:.3f}"

    return pd.DataFrame(
        {
            "point": [c.point for c in result.changes],
            "state": [c.state for c in result.changes],
            "baseline s/epoch": [seconds(c.baseline_s) for c in result.changes],
            "s/epoch": [seconds(c.current_s) for c in result.changes],
            "change": [change_words(c) for c in result.changes],
            "runs": [
                f"{c.runs[0]} vs {c.runs[1]}" if c.ratio is not None or any(c.runs) else "-" for c in result.changes
            ],
        }
    )


def gate_title(result: gate.GateResult) -> str:
    return f"Epoch time of {result.current.name} against the baseline {result.baseline.name}"


def render_gate(result: gate.GateResult, fmt: str) -> str:
    """csv, json or markdown (a CI comment: a heading, one row per point, the verdict)."""
    if fmt == "csv":
        return gate.frame(result).to_csv(index=False)
    if fmt == "json":
        return (
            json.dumps(
                {
                    "verdict": gate_verdict(result),
                    "exit_code": result.exit_code,
                    "points": json.loads(gate.frame(result).to_json(orient="records")),
                },
                indent=2,
            )
            + "\n"
        )
    if fmt == "markdown":
        return f"### {gate_title(result)}\n\n{markdown(gate_display_frame(result))}\n**{gate_verdict(result)}**\n"
    raise ValueError(fmt)
