"""Compare a sweep's runs: one row per finished run, device speedups, and where the time went.

Works on plain RunRecords (tracking.read_sweep), so it needs no MLflow calls of its own. Speed
figures (epoch time, images/s, time shares, speedups) use the steady-state epochs (timing.steady);
the first epoch is shown on its own, and the `timed` column says which epochs were used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from pipeline.config import DEFAULTS, KEYS, LATER_KEYS
from pipeline.errors import UserError
from pipeline.grid import format_value
from pipeline.names import COMPILE, TAG_DEVICE, TAG_ENERGY, TAG_HARDWARE, TIME_BUCKETS, WARMUP
from pipeline.timing import steady, timed_label

if TYPE_CHECKING:
    from pipeline.records import SweepRecord

# Runs equal in all of these but the device are "twins" whose epoch times compare devices: every
# setting that changes what a run measures (config.Key.twin), and the data sizes.
TWIN_KEYS = (*(name for name, key in KEYS.items() if key.twin), "train_size", "test_size")
# The axes whose twins get a speedup: the column, its reference value, the speedup column.
TWIN_AXES = (("device", "cpu", "speedup"), ("precision", "fp32", "precision_speedup"),
             ("compile", "false", "compile_speedup"))
FINAL = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
_LATER_DEFAULTS = {key: format_value(DEFAULTS[key]) for key in LATER_KEYS}  # as params are logged
SPEEDUPS = tuple(column for _, _, column in TWIN_AXES)
HIGHER_IS_BETTER = ("train_accuracy", "test_accuracy", "images_per_s", *SPEEDUPS)
HISTORIES = ("test_accuracy", "epoch_duration_s", "images_per_s", "peak_memory_mb", "energy_j", *TIME_BUCKETS)
# The data's first columns (csv, json): which run, its settings, the results people compare.
KEY_COLUMNS = ("run_name", "device", *TWIN_KEYS, "epoch_duration_s", "timed", "images_per_s", "test_accuracy",
               *SPEEDUPS, "peak_memory_mb")
# The labels the human view (table, markdown) gives the data columns; --sort takes either name.
LABELS = {
    "train_loss": "train loss", "train_accuracy": "train acc", "test_loss": "test loss", "test_accuracy": "test acc",
    "epoch_duration_s": "epoch_s", "images_per_s": "img/s", "run_duration_s": "run_s",
    "first_epoch_s": "epoch1_s", "warmup_s": "warmup_s", "compile_s": "compile_s", "peak_memory_mb": "peak MiB",
    "data_share": "data %", "transfer_share": "transfer %", "compute_share": "compute %",
}


@dataclass
class Comparison:
    sweep: "SweepRecord"
    table: pd.DataFrame  # one row per finished run; columns below
    speedups: list[str]  # one summary line per twin group with a cpu run and another device
    notes: list[str] = field(default_factory=list)  # why a figure is missing
    # Points that differ only in seed, one row per group (empty unless seed varies): n, the median
    # and min-max of epoch time and test accuracy, and speedups on the medians.
    repeats: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def varying(self) -> list[str]:
        """Settings (other than device) whose values differ between rows."""
        return [k for k in TWIN_KEYS if k in self.table and self.table[k].nunique() > 1]

    @property
    def variants(self) -> list[str]:
        """Varying settings that change how a device runs the same training (config.Key.variant):
        each value gets its own bar in the charts."""
        return [k for k in self.varying if k in KEYS and KEYS[k].variant]


def _number(text: str | None) -> float | int | str | None:
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def build(sweep: "SweepRecord", sort: str | None = None) -> Comparison:
    """The comparison table of `sweep`'s finished children, with speedups over cpu twins."""
    rows = []
    for run in sweep.children:
        row = {"run_id": run.run_id, "run_name": run.name}
        row["device"] = run.tags.get(TAG_DEVICE) or run.params.get("device")
        row["requested_device"] = run.params.get("device")
        row["hardware"] = run.tags.get(TAG_HARDWARE, "")
        for key in TWIN_KEYS:  # a setting added later is at its default in runs made before it
            row[key] = _number(run.params.get(key, _LATER_DEFAULTS.get(key)))
        for key in FINAL:
            row[key] = run.metrics.get(key, math.nan)
        epochs = run.histories.get("epoch_duration_s") or [run.metrics.get("epoch_duration_s", math.nan)]
        row["epoch_duration_s"] = _mean(steady(epochs))
        row["images_per_s"] = _mean(steady(run.histories.get("images_per_s")
                                           or [run.metrics.get("images_per_s", math.nan)]))
        row["timed"] = timed_label(len(epochs))
        row["first_epoch_s"] = epochs[0]
        row["warmup_s"] = run.metrics.get(WARMUP, math.nan)
        row["compile_s"] = run.metrics.get(COMPILE, math.nan)
        memory = run.histories.get("peak_memory_mb") or [run.metrics.get("peak_memory_mb", math.nan)]
        row["peak_memory_mb"] = max(memory)
        # Counters advance in steps (NVML's every 100 ms): an epoch shorter than a step can read 0 J,
        # and the mean over the steady epochs is right to one step. Zero in all of them is unknown.
        joules = steady(run.histories.get("energy_j") or [])
        energy, source = _mean(joules), run.tags.get(TAG_ENERGY, "not measured: recorded before energy was")
        if joules and energy == 0:
            energy, source = math.nan, (f"not measured: the counter ({source}) did not advance in the steady "
                                        "epochs, each shorter than its update interval; train longer epochs")
        row["energy_j"], row["energy_source"] = energy, source
        row["images_per_j"] = int(run.params.get("train_size") or 0) / energy if energy > 0 else math.nan
        row["run_duration_s"] = run.metrics.get("run_duration_s", math.nan)
        total = sum(steady(epochs))
        for bucket in TIME_BUCKETS:
            spent = steady(run.histories.get(bucket) or [])
            share = bucket.replace("_time_s", "_share")
            row[share] = sum(spent) / total if spent and total > 0 else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    lines: list[str] = []
    notes = []  # why a figure is missing (energy where no counter was readable)
    if not table.empty and table["energy_j"].isna().any():
        for source, group in table[table["energy_j"].isna()].groupby("energy_source", sort=False):
            runs = "every run" if len(group) == len(table) else ", ".join(group["run_name"])
            notes.append(f"energy of {runs}: {source}")
    if not table.empty:
        for axis, reference, column in TWIN_AXES:
            table[column], table[f"{column}_vs"], found = _speedups(table, axis, reference)
            lines += found
        first = [c for c in KEY_COLUMNS if c in table]
        table = table[first + [c for c in table.columns if c not in first]]
    if sort:
        sort = {label: column for column, label in LABELS.items()}.get(sort, sort)
        if sort not in table.columns:
            raise UserError(f"--sort {sort}: no such column; choose one of {', '.join(table.columns)}")
        table = table.sort_values(sort, ascending=sort not in HIGHER_IS_BETTER, kind="stable", na_position="last")
    repeats, repeat_lines = _repeats(table)
    return Comparison(sweep, table.reset_index(drop=True), lines + repeat_lines, notes, repeats)


def _repeats(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Runs equal in everything but the seed are repeats of one point: aggregate each group."""
    if table.empty or "seed" not in table or table["seed"].nunique() < 2:
        return pd.DataFrame(), []
    keys = [k for k in ("device", *TWIN_KEYS) if k in table and k != "seed"]
    rows = []
    for values, group in table.groupby(keys, dropna=False, sort=False):
        row = {**dict(zip(keys, values)), "n": len(group), "timed": group["timed"].iloc[0],
               "run_id": ",".join(group["run_id"])}
        for column in ("epoch_duration_s", "test_accuracy"):
            row[column] = group[column].median()
            row[f"{column}_min"], row[f"{column}_max"] = group[column].min(), group[column].max()
        rows.append(row)
    repeats = pd.DataFrame(rows)
    lines = []
    for axis, reference, column in TWIN_AXES:
        repeats[column], _, found = _speedups(repeats, axis, reference)
        lines += [f"median of repeats, {line}" for line in found]
    return repeats.drop(columns=["run_id"]), lines


def _speedups(table: pd.DataFrame, axis: str, reference_value: str) -> tuple[list[float], list[str], list[str]]:
    """Each run's epoch-time speedup over its twin that differs only in `axis`, where that twin has
    `reference_value` (the cpu run for devices, the fp32 run for precisions), and one summary line
    per group of twins."""
    speedup = [math.nan] * len(table)
    versus = [""] * len(table)
    lines = []
    keys = [k for k in (*TWIN_KEYS, "device") if k in table and k != axis]
    varying = [k for k in keys if table[k].nunique() > 1]
    for _, group in table.groupby(keys, dropna=False, sort=False):
        base = group[group[axis] == reference_value]
        others = group[group[axis] != reference_value]
        if base.empty or others.empty:
            continue
        reference = base.iloc[0]
        label = " ".join(f"{k}={reference[k]}" for k in varying) or "all settings equal"
        parts = []
        for index, row in others.iterrows():
            ratio = reference["epoch_duration_s"] / row["epoch_duration_s"]
            speedup[index], versus[index] = ratio, reference["run_id"]
            parts.append(f"{_value(axis, row[axis])} x{ratio:.2f} ({row['epoch_duration_s']:.3f} s/epoch)")
        speedup[base.index[0]] = 1.0
        lines.append(f"{label}: {', '.join(parts)} vs {_value(axis, reference_value)} ({reference['epoch_duration_s']:.3f} "
                     f"s/epoch), timed on {reference['timed']}")
    return speedup, versus, lines


def _value(axis: str, value) -> str:
    """A twin axis's value as a speedup line names it: cuda, bf16, compile=true."""
    return f"{axis}={value}" if str(value).lower() in ("true", "false") else str(value)


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


def display_frame(comparison: Comparison) -> pd.DataFrame:
    """The human view: varying settings, results, time shares and speedups, formatted."""
    t = comparison.table
    always = sorted((k for k, key in KEYS.items() if key.shown == "always"), key=lambda k: k != "device")
    settings = [k for k in always if k in t] + [k for k in comparison.varying if k in KEYS and KEYS[k].shown == "varying"]
    out = t[settings].copy()
    if "data_on_device" in t and (t["data_on_device"].astype(str).str.lower() == "true").any():
        out["data path"] = ["on device (no host data path)" if str(v).lower() == "true" else "host"
                            for v in t["data_on_device"]]
    for key in FINAL:
        out[LABELS[key]] = t[key].map(lambda v: f"{v:.4f}")
    out[LABELS["epoch_duration_s"]] = t["epoch_duration_s"].map(lambda v: f"{v:.3f}")
    out["timed"] = t["timed"]
    out[LABELS["first_epoch_s"]] = t["first_epoch_s"].map(lambda v: f"{v:.3f}")
    if t["compile_s"].notna().any():  # compiling is its own one-off cost, in neither epoch column
        out[LABELS["compile_s"]] = t["compile_s"].map(lambda v: "-" if math.isnan(v) else f"{v:.1f}")
    out[LABELS["images_per_s"]] = t["images_per_s"].map(lambda v: f"{v:,.0f}")
    out[LABELS["peak_memory_mb"]] = t["peak_memory_mb"].map(lambda v: "-" if math.isnan(v) else f"{v:,.0f}")
    if t["energy_j"].notna().any():
        out["J/epoch"] = t["energy_j"].map(lambda v: "-" if math.isnan(v) else f"{v:,.1f}")
        out["img/J"] = t["images_per_j"].map(lambda v: "-" if math.isnan(v) else f"{v:,.0f}")
    out[LABELS["run_duration_s"]] = t["run_duration_s"].map(lambda v: f"{v:.2f}")
    for share in ("data_share", "transfer_share", "compute_share"):
        out[LABELS[share]] = t[share].map(lambda v: "-" if math.isnan(v) else f"{100 * v:.1f}")
    out = pd.concat([out, speedup_columns(t, always=("speedup",))], axis=1)
    return out


def speedup_columns(frame: pd.DataFrame, always: tuple[str, ...] = ()) -> pd.DataFrame:
    """One text column per twin axis that has a speedup in `frame` (and those in `always`): "ref"
    on the reference run, "x2.10" on its twins, empty where a run has no twin."""
    columns = {}
    for axis, reference, column in TWIN_AXES:
        values = frame[column] if column in frame else pd.Series([math.nan] * len(frame), index=frame.index)
        if column in always or values.notna().any():
            columns[column.replace("_", " ")] = [
                "" if math.isnan(v) else ("ref" if str(a) == reference else f"x{v:.2f}")
                for v, a in zip(values, frame[axis])]
    return pd.DataFrame(columns, index=frame.index)


def repeats_frame(comparison: Comparison) -> pd.DataFrame:
    """The human view of the repeats: settings, n, median [min-max] of epoch time and accuracy."""
    r = comparison.repeats
    settings = ["device"] + [k for k in comparison.varying if k != "seed" and k in r]
    out = r[settings].copy()
    out["n"] = r["n"]
    for column, label, digits in (("epoch_duration_s", "epoch_s", 3), ("test_accuracy", "test acc", 4)):
        out[label] = [f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"
                      for m, lo, hi in zip(r[column], r[f"{column}_min"], r[f"{column}_max"])]
    return pd.concat([out, speedup_columns(r)], axis=1)


def markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"
