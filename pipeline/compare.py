"""Compare a sweep's settings: one row per setting (its repeats aggregated), device speedups with
95% intervals, time to a target, and where the time went.

Works on plain RunRecords (records.read_sweep), so it needs no MLflow calls of its own. Runs that
differ only in `repeat` (names.REPEAT) are one row. Speed figures use the steady-state epochs
(timing.steady) pooled over a row's runs: the median and interquartile range of the epoch time;
other figures are medians over the runs. Every speedup carries a hierarchical bootstrap interval
(stats.median_ratio) and whether it excludes "no difference". Runs recorded while other processes
took the cores (names.TAG_CONTENDED) are counted in their row but left out of the speedups unless
asked for.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from pipeline import stats
from pipeline.config import DEFAULTS, KEYS, LATER_KEYS
from pipeline.errors import UserError
from pipeline.grid import format_value
from pipeline.names import (COMPILE, END_FIGURES, FINAL_ACCURACY, FIRST_EPOCH, LOAD_AVERAGE, OTHERS_CPU_SHARE,
                            PEAK_MEMORY, REPEAT, STEADY_ENERGY, STEADY_EPOCH, STEADY_EPOCH_UNROUNDED, STEADY_IMAGES,
                            TAG_CONTENDED, TAG_DEVICE, TAG_ENERGY, TAG_HARDWARE, TAG_HOST, TAG_TARGET,
                            TAG_TARGET_STATUS, TIME_SHARES, TIME_TO_TARGET, TRAINED_EPOCHS, WALL_TO_TARGET, WARMUP)
from pipeline.timing import FIGURE_HISTORIES, has_end_figures, run_figures, steady, timed_label

if TYPE_CHECKING:
    from pipeline.records import RunRecord, SweepRecord

# Runs equal in all of these but the device are "twins" whose epoch times compare devices: every
# setting that changes what a run measures (config.Key.twin), and the data sizes.
TWIN_KEYS = (*(name for name, key in KEYS.items() if key.twin), "train_size", "test_size")
# What makes one row: a setting on one device of one kind of hardware. Its repeats are its runs.
ROW_KEYS = ("device", "hardware", *TWIN_KEYS)
# The axes whose twins get a speedup: the column, its reference value, the speedup column.
TWIN_AXES = (("device", "cpu", "speedup"), ("precision", "fp32", "precision_speedup"),
             ("compile", "false", "compile_speedup"))
VERSUS = "versus_speedup"  # --versus KEY=VALUE: each row over its twin with KEY=VALUE
TARGET_SPEEDUP = "target_speedup"  # the device speedup on time to target
FINAL = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
_LATER_DEFAULTS = {key: format_value(DEFAULTS[key]) for key in LATER_KEYS}  # as params are logged
# A run's steady-state summary, as each child logs it and as every view of the sweep shows it.
SUMMARY = (STEADY_EPOCH, STEADY_IMAGES, FINAL_ACCURACY)
SPEEDUPS = (*(column for _, _, column in TWIN_AXES), VERSUS, TARGET_SPEEDUP)
INTERVAL_SUFFIXES = ("_low", "_high", "_significant")
HIGHER_IS_BETTER = ("train_accuracy", "test_accuracy", "images_per_s", *SPEEDUPS)
# Per-epoch histories, read for a run only where needed (records.read_sweep): a run's figures come
# from what it logged at its end, or from HISTORIES for a run made before children logged them; the
# charts draw CHART_HISTORIES (`pipeline compare --out`; a sweep's end has them from its own epochs).
HISTORIES = FIGURE_HISTORIES
CHART_HISTORIES = ("test_accuracy",)
# Per-run figures whose row value is the median over the row's runs.
RUN_MEDIANS = (*FINAL, "images_per_s", "first_epoch_s", "warmup_s", "compile_s", "peak_memory_mb", "energy_j",
               "images_per_j", "run_duration_s", "data_share", "transfer_share", "compute_share",
               LOAD_AVERAGE, OTHERS_CPU_SHARE)
# The data's first columns (csv, json): which setting, its runs, the results people compare.
KEY_COLUMNS = ("run_name", "device", *TWIN_KEYS, "n", *SUMMARY, "epoch_duration_s", "epoch_duration_s_q1",
               "epoch_duration_s_q3", "timed", "images_per_s", "test_accuracy",
               *(f"{c}{s}" for c in SPEEDUPS for s in ("", *INTERVAL_SUFFIXES)), "peak_memory_mb", "run_ids")
# The labels the human view (table, markdown) gives the data columns; --sort takes either name.
LABELS = {
    "train_loss": "train loss", "train_accuracy": "train acc", "test_loss": "test loss", "test_accuracy": "test acc",
    "epoch_duration_s": "epoch_s", "images_per_s": "img/s", "run_duration_s": "run_s",
    "first_epoch_s": "epoch1_s", "warmup_s": "warmup_s", "compile_s": "compile_s", "peak_memory_mb": "peak MiB",
    "data_share": "data %", "transfer_share": "transfer %", "compute_share": "compute %",
    "time_to_target_s": "to target s",
}


@dataclass(frozen=True)
class CompareOptions:
    """What `pipeline compare` was asked for, beyond which sweep."""

    sort: str | None = None  # a column or its label; default: time to target when there is one, else run order
    versus: str | None = None  # "KEY=VALUE": a speedup of every row over its twin with KEY=VALUE
    include_contended: bool = False  # count contended runs in the speedups (and the gate)
    target: str | None = None  # the sweep's target (its parent's TAG_TARGET); None: the runs' own


@dataclass
class Comparison:
    sweep: "SweepRecord"
    table: pd.DataFrame  # one row per setting (its repeats aggregated); columns above
    speedups: list[str]  # one summary line per twin group with a reference row and another
    notes: list[str] = field(default_factory=list)  # why a figure is missing, which runs were left out
    # One row per finished run, indexed by run id: the rows' material (its `steady` column holds
    # each run's steady-state epoch times, for the intervals).
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    include_contended: bool = False
    target: str | None = None  # "test_accuracy >= 0.85" when the sweep was timed against one
    versus: tuple[str, str] | None = None  # --versus KEY=VALUE, checked: (KEY, VALUE)
    sorted_by: str | None = None  # --sort, where one was asked for

    def label(self, row: pd.Series) -> str:
        """A setting as people name it: its device and the settings that vary ("cpu bs128 w0"),
        as run names spell them but without a repeat's number."""
        from pipeline.grid import short

        return " ".join([str(row["device"])] + [short(k, row[k]) for k in self.varying if k in KEYS])

    @property
    def varying(self) -> list[str]:
        """Settings (other than device) whose values differ between rows."""
        return [k for k in TWIN_KEYS if k in self.table and self.table[k].nunique() > 1]

    @property
    def variants(self) -> list[str]:
        """Varying settings that change how a device runs the same training (config.Key.variant):
        each value gets its own bar in the charts."""
        return [k for k in self.varying if k in KEYS and KEYS[k].variant]

    def timed_runs(self, row: pd.Series) -> list[str]:
        """The run ids of `row` that speedups and the gate time: contended runs left out unless asked."""
        ids = str(row["run_ids"]).split(",")
        return [r for r in ids if self.include_contended or not self.runs.at[r, "contended"]]

    def epochs(self, row: pd.Series) -> list[list[float]]:
        """The steady-state epoch times of each timed run of `row` (stats.Runs)."""
        return [self.runs.at[r, "steady"] for r in self.timed_runs(row)]

    def to_target(self, row: pd.Series) -> list[list[float]]:
        """The time to target of each timed run of `row` that reached it, one value per run."""
        times = (self.runs.at[r, "time_to_target_s"] for r in self.timed_runs(row))
        return [[t] for t in times if not math.isnan(t)]


def _number(text: str | None) -> float | int | str | None:
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _rounded(value: float, digits: int) -> float:
    return value if math.isnan(value) else float(round(value, digits))


def _run_row(run: "RunRecord") -> dict[str, Any]:
    """One finished run's figures: its settings, final metrics, steady-state speed and shares."""
    row: dict[str, Any] = {"run_id": run.run_id, "run_name": run.name}
    row["device"] = run.tags.get(TAG_DEVICE) or run.params.get("device")
    row["requested_device"] = run.params.get("device")
    row["hardware"] = run.tags.get(TAG_HARDWARE, "")
    row["host"] = run.tags.get(TAG_HOST, "")
    row["repeat"] = int(run.params.get(REPEAT, "1"))  # runs made before repeats existed are repeat 1
    for key in TWIN_KEYS:  # a setting added later is at its default in runs made before it
        row[key] = _number(run.params.get(key, _LATER_DEFAULTS.get(key)))
    for key in FINAL:
        row[key] = run.metrics.get(key, math.nan)
    figures = run_summary(run)
    # The run's steady epoch times where its history was read (a run without end figures), else its
    # median steady epoch, unrounded, as one value: the statistics take one value per run.
    epochs = run.histories.get("epoch_duration_s")
    row["steady"] = steady(epochs) if epochs else [figures.get(STEADY_EPOCH_UNROUNDED, math.nan)]
    row.update({name: figures.get(name, math.nan) for name in SUMMARY})
    row["images_per_s"] = row[STEADY_IMAGES]
    row["timed"] = timed_label(int(figures[TRAINED_EPOCHS]))
    row["first_epoch_s"] = figures.get(FIRST_EPOCH, math.nan)
    row["warmup_s"] = run.metrics.get(WARMUP, math.nan)
    row["compile_s"] = run.metrics.get(COMPILE, math.nan)
    row["peak_memory_mb"] = figures.get(PEAK_MEMORY, math.nan)
    # Counters advance in steps (NVML's every 100 ms): an epoch shorter than a step can read 0 J,
    # and the mean over the steady epochs is right to one step. Zero in all of them is unknown.
    energy = figures.get(STEADY_ENERGY, math.nan)
    source = run.tags.get(TAG_ENERGY, "not measured: recorded before energy was")
    if energy == 0:
        energy, source = math.nan, (f"not measured: the counter ({source}) did not advance in the steady "
                                    "epochs, each shorter than its update interval; train longer epochs")
    row["energy_j"], row["energy_source"] = energy, source
    row["images_per_j"] = int(run.params.get("train_size") or 0) / energy if energy > 0 else math.nan
    row["run_duration_s"] = run.metrics.get("run_duration_s", math.nan)
    for share in TIME_SHARES:
        row[share] = figures.get(share, math.nan)
    row[LOAD_AVERAGE] = run.metrics.get(LOAD_AVERAGE, math.nan)
    row[OTHERS_CPU_SHARE] = run.metrics.get(OTHERS_CPU_SHARE, math.nan)
    row["contended"] = TAG_CONTENDED in run.tags
    row["contended_detail"] = run.tags.get(TAG_CONTENDED, "")
    row["target"] = run.tags.get(TAG_TARGET)
    row["target_status"] = run.tags.get(TAG_TARGET_STATUS, "")
    row["time_to_target_s"] = run.metrics.get(TIME_TO_TARGET, math.nan)
    row["wall_to_target_s"] = run.metrics.get(WALL_TO_TARGET, math.nan)
    return row


def run_summary(run: "RunRecord") -> dict[str, float]:
    """A run's per-run figures, its summary (SUMMARY) and its end figures (names.END_FIGURES), as it
    logged them at its end. For a run logged before children did, the same figures from its history
    (timing.run_figures; a summary it did log is kept), so that old and new runs agree. A figure
    that cannot be told is left out; the epoch count is always there."""
    if has_end_figures(run.metrics):
        return {name: run.metrics[name] for name in (*SUMMARY, *END_FIGURES) if name in run.metrics}
    # A history that was not read falls back to the metric's last value, as the store returns it.
    history = {name: run.histories.get(name) or ([run.metrics[name]] if name in run.metrics else [])
               for name in HISTORIES}
    computed = run_figures(history, run.metrics.get("test_accuracy"))
    return {**computed, **{name: run.metrics[name] for name in SUMMARY if name in run.metrics}}


def _setting_row(group: pd.DataFrame, target: str | None) -> dict[str, Any]:
    """One setting's row from its runs (the repeats): pooled epoch-time quartiles, medians of the rest."""
    first = group.iloc[0]
    row: dict[str, Any] = {"run_name": first["run_name"], **{k: first[k] for k in ROW_KEYS}}
    row["n"] = len(group)
    q1, median, q3 = stats.quartiles(list(group["steady"]))
    row["epoch_duration_s"], row["epoch_duration_s_q1"], row["epoch_duration_s_q3"] = median, q1, q3
    row["timed"] = first["timed"]
    for column in RUN_MEDIANS:
        row[column] = group[column].median()  # NaN where no run has it
    # The summary a person reads, rounded as timing.summary rounds a run's: a one-run setting shows
    # its run's own figures, a repeated one the pooled median epoch and the medians of the rest.
    if len(group) == 1:
        row.update({name: first[name] for name in SUMMARY})
    else:
        row[STEADY_EPOCH] = _rounded(median, 3)
        row[STEADY_IMAGES] = _rounded(group[STEADY_IMAGES].median(), 0)
        row[FINAL_ACCURACY] = _rounded(group[FINAL_ACCURACY].median(), 4)
    row["energy_source"] = first["energy_source"]
    row["requested_device"] = first["requested_device"]
    row["host"] = ",".join(sorted(set(group["host"])))
    row["contended"] = int(group["contended"].sum())
    if target is not None:
        timed = group[group["target"].notna()]
        reached = timed["time_to_target_s"].dropna()
        row["target_runs"], row["target_reached"] = len(timed), len(reached)
        row["time_to_target_s"] = reached.median() if len(reached) else math.nan
        row["wall_to_target_s"] = timed["wall_to_target_s"].dropna().median() if len(reached) else math.nan
    row["run_ids"] = ",".join(group["run_id"])
    return row


def build(sweep: "SweepRecord", options: CompareOptions | None = None) -> Comparison:
    """The comparison of `sweep`'s finished children: one row per setting, speedups with intervals."""
    options = options or CompareOptions()
    runs = pd.DataFrame([_run_row(run) for run in sweep.children])
    if runs.empty:
        return Comparison(sweep, pd.DataFrame(), [], [], runs, options.include_contended, options.target)
    runs = runs.set_index("run_id", drop=False)
    known = runs["target"].dropna()
    target = options.target or (known.iloc[0] if len(known) else None)
    groups = runs.groupby(list(ROW_KEYS), dropna=False, sort=False)
    table = pd.DataFrame([_setting_row(group, target) for _, group in groups])
    comparison = Comparison(sweep, table, [], [], runs, options.include_contended, target)
    versus = comparison.versus = _versus(comparison, options.versus) if options.versus else None
    for axis, reference, column in TWIN_AXES:
        comparison.speedups += _speedups(comparison, axis, reference, column, comparison.epochs)
    if versus is not None:
        comparison.speedups += _speedups(comparison, *versus, VERSUS, comparison.epochs)
    if target is not None:
        comparison.speedups += _speedups(comparison, "device", "cpu", TARGET_SPEEDUP, comparison.to_target,
                                         what=f"time to {target}")
    comparison.notes = _notes(comparison)
    comparison.sorted_by = options.sort
    first = [c for c in KEY_COLUMNS if c in table]
    table = table[first + [c for c in table.columns if c not in first]]
    comparison.table = _sorted(table, options.sort, target).reset_index(drop=True)
    return comparison


def _sorted(table: pd.DataFrame, sort: str | None, target: str | None) -> pd.DataFrame:
    """`--sort`'s order (higher first for accuracies and speedups); by default, with a target, the
    fastest to it first and the rows that never reached it last (the terminal's table puts the
    fastest first either way: decision_frame)."""
    if sort is None:
        if target is None:
            return table
        sort = "time_to_target_s"
    sort = {label: column for column, label in LABELS.items()}.get(sort, sort)
    if sort not in table.columns:
        # The figures people sort by; the settings and every other csv/json column work as well.
        figures = [c for c in (*SUMMARY, "epoch_duration_s", "time_to_target_s", "images_per_s", "test_accuracy",
                               *SPEEDUPS, "peak_memory_mb", "run_duration_s") if c in table.columns]
        raise UserError(f"--sort {sort}: no such column; choose a setting or a figure such as {', '.join(figures)} "
                        "(`pipeline compare --format csv | head -1` lists every column)")
    return table.sort_values(sort, ascending=sort not in HIGHER_IS_BETTER, kind="stable", na_position="last")


def _same(values: pd.Series, value: Any) -> pd.Series:
    """Which of `values` (a setting's column) equal `value`, as the grid would spell both."""
    wanted = format_value(_number(str(value))).lower()
    return values.map(lambda v: format_value(v).lower() == wanted)


def _versus(comparison: Comparison, versus: str) -> tuple[str, str]:
    """`--versus KEY=VALUE` checked against the sweep: (KEY, VALUE), or UserError saying what is there."""
    key, sep, value = versus.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise UserError(f"--versus {versus}: give KEY=VALUE, e.g. --versus num_workers=0 or --versus seed=0")
    keys = ["device", *TWIN_KEYS[:-2]]
    if key not in keys:
        raise UserError(f"--versus {versus}: {key} is not a grid key; grid keys: {', '.join(keys)}")
    column = comparison.table[key]
    present = list(dict.fromkeys(format_value(v) for v in column))
    if len(present) < 2:
        raise UserError(f"--versus {versus}: {key} does not vary in this sweep (every run has {key}={present[0]}); "
                        f"vary it in the grid, or compare on a key that varies")
    if not _same(column, value).any():
        raise UserError(f"--versus {versus}: no run has {key}={value}; values in this sweep: {', '.join(present)}")
    return key, value


def axis_ratios(comparison: Comparison, axis: str, reference_value: str,
                samples: Callable[[pd.Series], stats.Runs] | None = None) -> list[tuple[str, stats.Ratio]]:
    """Each row's speedup over its twin that differs only in `axis` and has `reference_value` there
    (a speedup > 1: the row is faster), as (the row's label, its Ratio with the interval); rows with no
    such twin are left out. `samples`: what is timed (default: the epoch times of the timed runs).
    `repeats: auto` stops once every ratio of the grid's axes is clear."""
    samples = samples or comparison.epochs
    table = comparison.table
    ignored = {axis, "hardware"} if axis == "device" else {axis}
    keys = [k for k in ROW_KEYS if k in table and k not in ignored]
    found = []
    for _, group in table.groupby(keys, dropna=False, sort=False):
        matches = _same(group[axis], reference_value)
        base, others = group[matches], group[~matches]
        if base.empty or others.empty:
            continue
        reference_samples = samples(base.iloc[0])
        for _, row in others.iterrows():
            ratio = stats.median_ratio(reference_samples, samples(row))
            if not math.isnan(ratio.estimate):
                found.append((comparison.label(row), ratio))
    return found


def _speedups(comparison: Comparison, axis: str, reference_value: str, column: str,
              samples: Callable[[pd.Series], stats.Runs], what: str = "epoch time") -> list[str]:
    """Each row's speedup over its twin row that differs only in `axis`, where that twin has
    `reference_value` (the cpu row for devices, the fp32 row for precisions), with its 95% bootstrap
    interval over `samples` of each row; columns `column` and its _low/_high/_significant/_vs are
    added to the table. One summary line per group of twins."""
    table = comparison.table
    speedup, low, high = ([math.nan] * len(table) for _ in range(3))
    significant: list[bool | None] = [None] * len(table)
    versus = [""] * len(table)
    lines = []
    # Other devices are other hardware by nature: device twins differ in both.
    ignored = {axis, "hardware"} if axis == "device" else {axis}
    keys = [k for k in ROW_KEYS if k in table and k not in ignored]
    varying = [k for k in keys if k != "hardware" and table[k].nunique() > 1]
    for _, group in table.groupby(keys, dropna=False, sort=False):
        matches = _same(group[axis], reference_value)
        base, others = group[matches], group[~matches]
        if base.empty or others.empty:
            continue
        reference = base.iloc[0]
        reference_samples = samples(reference)
        label = " ".join(f"{k}={format_value(reference[k])}" for k in varying if k != axis) or "all settings equal"
        parts = []
        for index, row in others.iterrows():
            ratio = stats.median_ratio(reference_samples, samples(row))
            if math.isnan(ratio.estimate):
                continue
            speedup[index], low[index], high[index] = ratio.estimate, ratio.low, ratio.high
            significant[index], versus[index] = ratio.significant, reference["run_ids"]
            parts.append(f"{_value(axis, row[axis])} {verdict(ratio.estimate, ratio.low, ratio.high)} "
                         f"({_figure(row, samples, what)})")
        if not parts:
            continue
        speedup[base.index[0]] = 1.0
        lines.append(f"{label}: {', '.join(parts)} vs {_value(axis, reference_value)} "
                     f"({_figure(reference, samples, what)}); {_basis(reference, what)}")
    table[column], table[f"{column}_low"], table[f"{column}_high"] = speedup, low, high
    table[f"{column}_significant"], table[f"{column}_vs"] = significant, versus
    return lines


def _figure(row: pd.Series, samples: Callable[[pd.Series], stats.Runs], what: str) -> str:
    """A row's figure in a speedup line: its pooled median and how many runs it is over."""
    runs = samples(row)
    unit = "s/epoch" if what == "epoch time" else "s"
    return f"{stats.pooled_median(runs):.3f} {unit}, {len(runs)} run{'s' if len(runs) != 1 else ''}"


def _basis(reference: pd.Series, what: str) -> str:
    if what == "epoch time":
        return f"median epoch time, timed on {reference['timed']}"
    return f"median {what} of the runs that reached it"


def _value(axis: str, value: Any) -> str:
    """A twin axis's value as a speedup line names it: cuda, bf16, compile=true, num_workers=0."""
    return str(value) if axis in ("device", "precision") else f"{axis}={format_value(value)}"


def verdict(estimate: float, low: float, high: float, compact: bool = False) -> str:
    """A speedup in words: "2.41x faster [2.30-2.52]", "1.02x slower [0.97-1.08] (n.s.)", or "(n too
    small)" where there is no interval. Slower is said as the inverse ratio (never "x0.42"), its
    interval inverted with it. `compact`: the interval on a second line (a terminal cell)."""
    if math.isnan(estimate):
        return ""
    faster = estimate >= 1
    words = f"{estimate:.2f}x faster" if faster else f"{1 / estimate:.2f}x slower"
    gap = "\n" if compact else " "  # a terminal cell: the interval on its second line
    if math.isnan(low) or math.isnan(high):
        return f"{words}{gap}" + (stats.TOO_SMALL if compact else f"({stats.TOO_SMALL})")
    lo, hi = (low, high) if faster else (1 / high, 1 / low)
    text = f"{words}\n{lo:.2f}-{hi:.2f}" if compact else f"{words} [{lo:.2f}-{hi:.2f}]"
    if low > 1 or high < 1:
        return text
    return f"{text}\nn.s." if compact else f"{text} (n.s.)"


def headline(comparison: Comparison) -> list[str]:
    """The answer first, in a few plain lines: the fastest setting with its accuracy, the most
    accurate with its time, the first to the target where there is one, and each axis's speedup
    with its interval (device, precision, compile, --versus). The sweep's end, `pipeline compare`
    and the parent run's description all open with these lines."""
    t = comparison.table
    if t.empty:
        return []
    timed = t[t[STEADY_EPOCH].notna()]
    lines = []
    if len(timed):
        fastest = timed.loc[timed[STEADY_EPOCH].idxmin()]
        # The most accurate; of settings equally accurate (to the 4 digits shown), the fastest.
        best = timed[timed[FINAL_ACCURACY] == timed[FINAL_ACCURACY].max()]
        accurate = best.loc[best[STEADY_EPOCH].idxmin()] if len(best) else None
        if len(best) == len(t) > 1:
            lines.append(f"Fastest: {comparison.label(fastest)} ({_figures(fastest)}); every setting "
                         f"reached the same test acc")
        elif accurate is not None and accurate.name == fastest.name and len(t) > 1:
            lines.append(f"Fastest and most accurate: {comparison.label(fastest)} ({_figures(fastest)})")
        else:
            lines.append(f"Fastest: {comparison.label(fastest)} ({_figures(fastest)})")
            if accurate is not None and len(t) > 1:
                lines.append(f"Most accurate: {comparison.label(accurate)} ({_figures(accurate, accuracy_first=True)})")
    if comparison.target is not None and "time_to_target_s" in t:
        reached = t[t["time_to_target_s"].notna()]
        if len(reached):
            first = reached.loc[reached["time_to_target_s"].idxmin()]
            lines.append(f"First to {comparison.target}: {comparison.label(first)} in "
                         f"{first['time_to_target_s']:.2f} s ({first['target_reached']}/{first['target_runs']} runs)")
        else:
            lines.append(f"No setting reached {comparison.target}")
    for axis, reference, column, what in _axes(comparison):
        lines += _axis_lines(comparison, axis, reference, column, what)
    return lines


def _figures(row: pd.Series, accuracy_first: bool = False) -> str:
    """A setting's two headline figures: "0.123 s/epoch, test acc 0.8123"."""
    time, accuracy = f"{row[STEADY_EPOCH]:.3f} s/epoch", f"test acc {row[FINAL_ACCURACY]:.4f}"
    return f"{accuracy}, {time}" if accuracy_first else f"{time}, {accuracy}"


def _axes(comparison: Comparison) -> list[tuple[str, str, str, str]]:
    """Each speedup column with its axis, the axis's reference value and what it times."""
    axes = [(axis, reference, column, "epoch time") for axis, reference, column in TWIN_AXES]
    if comparison.versus is not None:
        axes.append((*comparison.versus, VERSUS, "epoch time"))
    if comparison.target is not None:
        axes.append(("device", "cpu", TARGET_SPEEDUP, "time to target"))
    return axes


def _axis_lines(comparison: Comparison, axis: str, reference: str, column: str, what: str) -> list[str]:
    """One line per value of `axis` with a speedup over `reference`: "cuda:0 vs cpu, epoch time: 2.41x
    faster [2.30-2.52]" where one setting has it; the slowest and fastest of several, each with its
    interval and where it was measured."""
    t = comparison.table
    if column not in t:
        return []
    rows = t[t[column].notna() & (t[f"{column}_vs"] != "")]
    lines = []
    for value, group in rows.groupby(axis, sort=False):
        group = group.sort_values(column)
        said = [verdict(r[column], r[f"{column}_low"], r[f"{column}_high"]) for _, r in group.iterrows()]
        head = f"{_value(axis, value)} vs {_value(axis, reference)}, {what}"
        if len(group) == 1:
            where = _where(comparison, group.iloc[0], axis)
            lines.append(f"{head}: {said[0]}" + (f" ({where})" if where else ""))
        else:
            low, high = group.iloc[0], group.iloc[-1]
            lines.append(f"{head}: from {said[0]} ({_where(comparison, low, axis)}) to {said[-1]} "
                         f"({_where(comparison, high, axis)}), over {len(group)} settings")
    return lines


def _where(comparison: Comparison, row: pd.Series, axis: str) -> str:
    """The settings that place a speedup, but for its own axis: "bs128 w0"."""
    from pipeline.grid import short

    devices = [str(row["device"])] if axis != "device" and comparison.table["device"].nunique() > 1 else []
    return " ".join(devices + [short(k, row[k]) for k in comparison.varying if k != axis and k in KEYS])


def _names(names: pd.Series, total: int, limit: int = 5) -> str:
    """Run names for a note: all of them up to `limit`, else the first few and a count."""
    names = list(names)
    if len(names) == total and total > 1:
        return f"all {total}"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _notes(comparison: Comparison) -> list[str]:
    """Why a figure is missing or which runs were left out: energy, untargeted and contended runs."""
    table, runs, notes = comparison.table, comparison.runs, []
    if table["energy_j"].isna().any():
        for source, group in table[table["energy_j"].isna()].groupby("energy_source", sort=False):
            where = "every row" if len(group) == len(table) else ", ".join(group["run_name"])
            notes.append(f"energy of {where}: {source}")
    if comparison.target is not None and runs["target"].isna().any():
        untargeted = runs[runs["target"].isna()]
        notes.append(f"{_names(untargeted['run_name'], len(runs))} of {len(runs)} runs were trained without the "
                     f"target ({comparison.target}): no time to target (\"-\"); `pipeline run GRID --rerun` times them")
    contended = runs[runs["contended"]]
    if len(contended):
        figures = "; ".join(f"{name}: {detail}" for name, detail in
                            zip(contended["run_name"][:5], contended["contended_detail"][:5]))
        if comparison.include_contended:
            notes.append(f"{len(contended)} contended run(s) counted in the speedups (--include-contended): {figures}")
        else:
            notes.append(f"{len(contended)} contended run(s) left out of the speedups (other processes took the "
                         f"cores): {figures}; --include-contended counts them")
    return notes


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
    settings = [k for k in always if k in t] + [k for k in comparison.varying if k in KEYS and KEYS[k].shown == "varying"]
    out = t[settings].copy()
    if "data_on_device" in t and (t["data_on_device"].astype(str).str.lower() == "true").any():
        out["data path"] = ["on device (no host data path)" if str(v).lower() == "true" else "host"
                            for v in t["data_on_device"]]
    out["n"] = t["n"]
    if t["contended"].any():
        out["contended"] = _contended(t)
    for key in FINAL:
        out[LABELS[key]] = t[key].map(lambda v: f"{v:.4f}")
    out[LABELS["epoch_duration_s"]] = _spreads(t, compact=stacked)
    out["timed"] = t["timed"]
    if comparison.target is not None:
        out[LABELS["time_to_target_s"]] = [_to_target(row, stacked) for _, row in t.iterrows()]
    out[LABELS["first_epoch_s"]] = t["first_epoch_s"].map(lambda v: f"{v:.3f}")
    if t["compile_s"].notna().any():  # compiling is its own one-off cost, in neither epoch column
        out[LABELS["compile_s"]] = t["compile_s"].map(lambda v: "-" if math.isnan(v) else f"{v:.1f}")
    out[LABELS["images_per_s"]] = _images(t)
    out[LABELS["peak_memory_mb"]] = t["peak_memory_mb"].map(lambda v: "-" if math.isnan(v) else f"{v:,.0f}")
    if t["energy_j"].notna().any():
        out["J/epoch"] = t["energy_j"].map(lambda v: "-" if math.isnan(v) else f"{v:,.1f}")
        out["img/J"] = t["images_per_j"].map(lambda v: "-" if math.isnan(v) else f"{v:,.0f}")
    out[LABELS["run_duration_s"]] = t["run_duration_s"].map(lambda v: f"{v:.2f}")
    for share in ("data_share", "transfer_share", "compute_share"):
        out[LABELS[share]] = t[share].map(lambda v: "-" if math.isnan(v) else f"{100 * v:.1f}")
    return pd.concat([out, speedup_columns(t, always=("speedup",), compact=stacked)], axis=1)


def decision_frame(comparison: Comparison) -> pd.DataFrame:
    """What a decision rests on, narrow enough for a 120-column terminal: the device and the settings
    that vary, n where a setting was repeated, the epoch time with its interquartile range under it,
    time to target where timed, the speedups this sweep has (each interval on its cell's second
    line), test accuracy and images/s. Columns with nothing in them for this sweep are left out.
    Fastest first, unless --sort said otherwise (with a target the table already ranks by it)."""
    t = comparison.table
    if comparison.sorted_by is None and comparison.target is None:
        t = t.sort_values("epoch_duration_s", kind="stable", na_position="last")
    out = t[["device", *(k for k in comparison.varying if k in KEYS)]].copy()
    if (t["n"] > 1).any():
        out["n"] = t["n"]
    if t["contended"].any():
        out["contended"] = _contended(t)
    out[LABELS["epoch_duration_s"]] = _spreads(t, compact=True)
    if t["timed"].nunique() > 1:
        out["timed"] = t["timed"]
    if comparison.target is not None:
        out[LABELS["time_to_target_s"]] = [_to_target(row, True) for _, row in t.iterrows()]
    out = pd.concat([out, speedup_columns(t, compact=True)], axis=1)
    out[LABELS["test_accuracy"]] = t[FINAL_ACCURACY].map(lambda v: "-" if math.isnan(v) else f"{v:.4f}")
    out[LABELS["images_per_s"]] = _images(t)
    return out


def _contended(t: pd.DataFrame) -> list[str]:
    return [f"{c}/{n}" if c else "" for c, n in zip(t["contended"], t["n"])]


def _spreads(t: pd.DataFrame, compact: bool) -> list[str]:
    return [_spread(m, q1, q3, compact) for m, q1, q3 in
            zip(t[STEADY_EPOCH], t["epoch_duration_s_q1"], t["epoch_duration_s_q3"])]


def _images(t: pd.DataFrame) -> pd.Series:
    return t[STEADY_IMAGES].map(lambda v: "-" if math.isnan(v) else f"{v:,.0f}")


def caption(comparison: Comparison) -> str:
    """What the compact view leaves out of its columns: the settings every row shares."""
    t = comparison.table
    shown = [k for k in KEYS if KEYS[k].shown == "always" and k != "device" and k in t and k not in comparison.varying]
    same = ", ".join(f"{k} {format_value(t[k].iloc[0])}" for k in shown)
    return f"every row: {same}" if same else ""


def timed_title(comparison: Comparison) -> str:
    """Which epochs the epoch times are, for a table's title: "epoch s: median of epochs 2-4"."""
    labels = comparison.table["timed"].unique()
    timed = labels[0] if len(labels) == 1 else "the steady epochs (see timed)"
    return f"epoch s: median of {timed}, quartiles under it"


def _spread(median: float, q1: float, q3: float, compact: bool) -> str:
    """A median epoch time and its interquartile range: "0.300 [0.290-0.310]" (none where they agree)."""
    if math.isnan(q1) or f"{q1:.3f}" == f"{q3:.3f}":
        return f"{median:.3f}"
    return f"{median:.3f}\n{q1:.3f}-{q3:.3f}" if compact else f"{median:.3f} [{q1:.3f}-{q3:.3f}]"


def _to_target(row: pd.Series, compact: bool) -> str:
    """A row's median time to target and how many of its timed runs reached it: "1.23 (3/4)"; "-"
    where its runs were trained without the target."""
    if not row["target_runs"]:
        return "-"
    reached = f"({row['target_reached']}/{row['target_runs']})"
    time = "never" if math.isnan(row["time_to_target_s"]) else f"{row['time_to_target_s']:.2f}"
    return f"{time}\n{reached}" if compact else f"{time} {reached}"


def speedup_columns(frame: pd.DataFrame, always: tuple[str, ...] = (), compact: bool = False) -> pd.DataFrame:
    """One text column per speedup in `frame` (and those in `always`): "ref" on the reference row,
    "2.41x faster [2.30-2.52]" on its twins (verdict), empty where a row has no twin."""
    columns = {}
    for column in SPEEDUPS:
        values = frame[column] if column in frame else pd.Series([math.nan] * len(frame), index=frame.index)
        if column not in always and not values.notna().any():
            continue
        low, high = frame.get(f"{column}_low"), frame.get(f"{column}_high")
        cells = []
        for index, value in values.items():
            reference = frame.at[index, f"{column}_vs"] == "" if f"{column}_vs" in frame else False
            if math.isnan(value):
                cells.append("")
            elif reference:
                cells.append("ref")
            else:
                cells.append(verdict(value, low[index], high[index], compact))
        columns[column.replace("_", " ")] = cells
    return pd.DataFrame(columns, index=frame.index)


def markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"
