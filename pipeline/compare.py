"""Compare a sweep's settings: one row per setting (its repeats aggregated), speedups with 95%
intervals, time to a target, where the time went, and the one best setting.

Works on plain RunRecords (records.read_sweep), so it needs no MLflow calls of its own. Runs that
differ only in `repeat` (names.REPEAT) are one row. The run is the unit: each run gives one value
per figure (its median steady-state epoch, its time to target, its final accuracy), a row's figure
is the median over its runs, and every speedup is the ratio of the two rows' geometric means with
Welch's 95% interval on the logs (stats.ratio): none below two runs a side ("n too small"). A
speedup is a win only if the faster row is no less accurate than its reference by more than the
quality margin. Runs recorded while other processes took the cores (names.TAG_CONTENDED) are
counted in their row but left out of every speed figure, ranking, speedup and the best setting
unless asked for (accuracy does not depend on the machine's load, so it counts every run).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from pipeline import stats
from pipeline.config import DEFAULT_QUALITY_MARGIN, DEFAULTS, KEYS, LATER_KEYS
from pipeline.errors import UserError
from pipeline.grid import format_value
from pipeline.names import (COMPILE, END_FIGURES, FINAL_ACCURACY, FIRST_EPOCH, LOAD_AVERAGE, OTHERS_CPU_SHARE,
                            PEAK_MEMORY, REPEAT, STEADY_ENERGY, STEADY_EPOCH, STEADY_IMAGES, TAG_CONTENDED, TAG_DEVICE,
                            TAG_ENERGY, TAG_HARDWARE, TAG_HOST, TAG_TARGET, TAG_TARGET_STATUS, TIME_SHARES,
                            TIME_TO_TARGET, TRAINED_EPOCHS, WALL_TO_TARGET, WARMUP)
from pipeline.timing import FIGURE_HISTORIES, has_end_figures, run_figures, significant, timed_label

if TYPE_CHECKING:
    from pipeline.records import RunRecord, SweepRecord

# Runs equal in all of these but the device are "twins" whose epoch times compare devices: every
# grid key that changes what a run measures (config.Key.twin), and the data sizes.
GRID_TWIN_KEYS = tuple(name for name, key in KEYS.items() if key.twin)
TWIN_KEYS = (*GRID_TWIN_KEYS, "train_size", "test_size")
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
SPEEDUP_LABELS = tuple(column.replace("_", " ") for column in SPEEDUPS)  # their columns in the human view
INTERVAL_SUFFIXES = ("_low", "_high", "_significant")
# With each speedup, the faster row's accuracy against its reference's (a difference, with its
# interval) and whether the speedup is a win: significant, and not less accurate beyond the margin.
QUALITY_SUFFIXES = ("_accuracy_change", "_accuracy_change_low", "_accuracy_change_high", "_win")
HIGHER_IS_BETTER = ("train_accuracy", "test_accuracy", "images_per_s", *SPEEDUPS)
# Per-epoch histories, read for a run only where needed (records.read_sweep): a run's figures come
# from what it logged at its end, or from HISTORIES for a run made before children logged them; the
# charts draw CHART_HISTORIES (`pipeline compare --out`; a sweep's end has them from its own epochs).
HISTORIES = FIGURE_HISTORIES
CHART_HISTORIES = ("test_accuracy",)
# Per-run figures whose row value is the median over the row's runs: those that measure speed over
# its timed runs (contended ones left out unless asked), those that measure what was learnt over all.
SPEED_MEDIANS = ("images_per_s", "first_epoch_s", "warmup_s", "compile_s", "peak_memory_mb", "energy_j",
                 "images_per_j", "run_duration_s", "data_share", "transfer_share", "compute_share")
QUALITY_MEDIANS = FINAL
LOAD_MEDIANS = (LOAD_AVERAGE, OTHERS_CPU_SHARE)
# The data's first columns (csv, json): which setting, its runs, the results people compare.
KEY_COLUMNS = ("run_name", "device", *TWIN_KEYS, "n", "timed_runs", *SUMMARY, "epoch_duration_s",
               "epoch_duration_s_q1", "epoch_duration_s_q3", "timed", "images_per_s", "test_accuracy",
               *(f"{c}{s}" for c in SPEEDUPS for s in ("", *INTERVAL_SUFFIXES, *QUALITY_SUFFIXES)),
               "peak_memory_mb", "best", "best_run_id", "run_ids")
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
    include_contended: bool = False  # count contended runs in the speed figures, speedups and the gate
    target: str | None = None  # the sweep's target (its parent's TAG_TARGET); None: the runs' own
    quality_margin: float = DEFAULT_QUALITY_MARGIN  # the accuracy a faster setting may lose and still win


def sweep_options(parent, options: CompareOptions, quality_margin: float | None = None) -> CompareOptions:
    """`options` with what the sweep's parent run recorded: its target (TAG_TARGET) and its grid's
    quality margin (the `quality_margin` param; 0.005 for sweeps made before it was recorded), unless
    `quality_margin` overrides it."""
    recorded = parent.data.params.get("quality_margin")
    margin = quality_margin if quality_margin is not None else float(recorded or DEFAULT_QUALITY_MARGIN)
    return replace(options, target=parent.data.tags.get(TAG_TARGET), quality_margin=margin)


@dataclass
class Comparison:
    sweep: "SweepRecord"
    table: pd.DataFrame  # one row per setting (its repeats aggregated); columns above
    speedups: list[str]  # one summary line per twin group with a reference row and another
    notes: list[str] = field(default_factory=list)  # why a figure is missing, which runs were left out
    # One row per finished run, indexed by run id: the rows' material (one value per run and figure).
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    include_contended: bool = False
    target: str | None = None  # "test_accuracy >= 0.85" when the sweep was timed against one
    versus: tuple[str, str] | None = None  # --versus KEY=VALUE, checked: (KEY, VALUE)
    sorted_by: str | None = None  # --sort, where one was asked for
    quality_margin: float = DEFAULT_QUALITY_MARGIN

    def label(self, row: pd.Series) -> str:
        """A setting as people name it: its device and the settings that vary ("cpu bs128 w0"),
        as run names spell them but without a repeat's number."""
        from pipeline.grid import short

        return " ".join([str(row["device"])] + [short(k, row[k]) for k in self.varying if k in KEYS])

    def labels(self) -> list[str]:
        """Each row's label, in the table's order."""
        return [self.label(row) for _, row in self.table.iterrows()]

    @cached_property
    def varying(self) -> list[str]:
        """Settings (other than device) whose values differ between rows (read once: every label asks,
        and the rows' settings never change after the comparison is built)."""
        return [k for k in TWIN_KEYS if k in self.table and self.table[k].nunique() > 1]

    @property
    def setting_columns(self) -> list[str]:
        """The columns that tell rows apart: the device and the grid settings that vary (a terminal's
        table that folds into several repeats them in each)."""
        return ["device", *(k for k in self.varying if k in KEYS)]

    @property
    def variants(self) -> list[str]:
        """Varying settings that change how a device runs the same training (config.Key.variant):
        each value gets its own bar in the charts."""
        return [k for k in self.varying if k in KEYS and KEYS[k].variant]

    @cached_property
    def per_run(self) -> dict[str, dict[str, Any]]:
        """The per-run columns the statistics read, as dicts by run id (a dict lookup per run, not a
        pandas one: a sweep of 10,000 runs reads them tens of thousands of times)."""
        columns = ("contended", STEADY_EPOCH, "time_to_target_s", FINAL_ACCURACY)
        return {column: self.runs[column].to_dict() for column in columns} if not self.runs.empty else {}

    def timed_runs(self, row: Mapping[str, Any]) -> list[str]:
        """The run ids of `row` that speed figures and claims count: contended runs left out unless asked."""
        ids = str(row["run_ids"]).split(",")
        contended = self.per_run["contended"]
        return [r for r in ids if self.include_contended or not contended[r]]

    def epochs(self, row: Mapping[str, Any]) -> list[float]:
        """One value per timed run of `row`: its median steady-state epoch time (the summary it logged)."""
        steady = self.per_run[STEADY_EPOCH]
        return [float(steady[r]) for r in self.timed_runs(row)]

    def to_target(self, row: Mapping[str, Any]) -> list[float]:
        """The time to target of each timed run of `row` that reached it, one value per run; none unless
        the row ranks on time to target (at least half its timed runs reached it)."""
        if not ranks_on_target(row):
            return []
        times = (self.per_run["time_to_target_s"][r] for r in self.timed_runs(row))
        return [float(t) for t in times if not math.isnan(t)]

    def accuracies(self, row: Mapping[str, Any]) -> list[float]:
        """One value per run of `row` (contended or not: load does not change what is learnt): its
        final test accuracy."""
        accuracy = self.per_run[FINAL_ACCURACY]
        return [float(accuracy[r]) for r in str(row["run_ids"]).split(",")]


def ranks_on_target(row: Mapping[str, Any]) -> bool:
    """Whether a row's time to target counts (ranks, headlines, speedups): at least half its timed runs
    reached the target (the table's `target_ranked`). A setting that rarely gets there shows "not
    reached (k/n)" instead."""
    return bool(row.get("target_ranked", False))


def _number(text: str | None) -> float | int | str | None:
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


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


def _settings(runs: pd.DataFrame, target: str | None, include_contended: bool) -> pd.DataFrame:
    """One row per setting from its runs (the repeats), one value per run and figure: medians over the
    runs, and the quartiles of their steady epoch times, all settings at once (a sweep of 10,000
    runs is a few group-wise reductions, not 10,000 small frames). Speed figures count the timed
    runs (contended ones left out unless `include_contended`); a row with none has no speed figure
    (NaN: withheld). The summary is rounded as timing.summary rounds a run's, so a one-run setting
    shows its run's own figures."""
    group = runs.groupby(list(ROW_KEYS), dropna=False, sort=False).ngroup().rename("group")
    runs = runs.assign(group=group.values)
    timed = runs if include_contended else runs[~runs["contended"]]
    every, timed_groups = runs.groupby("group"), timed.groupby("group")
    table = every[["run_name", *ROW_KEYS, "timed", "energy_source", "requested_device"]].first()
    table["n"] = every.size()
    table["timed_runs"] = timed_groups.size().reindex(table.index, fill_value=0)
    levels = [0.25, 0.5, 0.75]
    quartiles = (timed_groups[STEADY_EPOCH].quantile(levels).unstack() if len(timed) else pd.DataFrame())
    quartiles = quartiles.reindex(index=table.index, columns=levels)  # every run contended: all NaN
    table["epoch_duration_s_q1"], table["epoch_duration_s"], table["epoch_duration_s_q3"] = \
        quartiles[0.25], quartiles[0.5], quartiles[0.75]
    speed = timed_groups[[*SPEED_MEDIANS, STEADY_IMAGES]].median().reindex(table.index)
    table[list(SPEED_MEDIANS)] = speed[list(SPEED_MEDIANS)]
    table[[*QUALITY_MEDIANS, *LOAD_MEDIANS]] = every[[*QUALITY_MEDIANS, *LOAD_MEDIANS]].median()
    table[STEADY_EPOCH] = table["epoch_duration_s"].map(lambda v: v if math.isnan(v) else significant(v, 4))
    table[STEADY_IMAGES] = speed[STEADY_IMAGES].round(0)
    table[FINAL_ACCURACY] = every[FINAL_ACCURACY].median().round(4)
    # Strings joined per group in one plain pass (a Python function per group costs a pandas frame each).
    ids: dict[int, list[str]] = {}
    hosts: dict[int, set[str]] = {}
    for number, run_id, host in zip(runs["group"], runs["run_id"], runs["host"]):
        ids.setdefault(number, []).append(run_id)
        hosts.setdefault(number, set()).add(host)
    table["host"] = [",".join(sorted(hosts[number])) for number in table.index]
    table["contended"] = every["contended"].sum().astype(int)
    if target is not None:
        targeted = timed[timed["target"].notna()].groupby("group")
        table["target_runs"] = targeted.size().reindex(table.index, fill_value=0)
        table["target_reached"] = targeted["time_to_target_s"].count().reindex(table.index, fill_value=0)
        table["time_to_target_s"] = targeted["time_to_target_s"].median().reindex(table.index).map(
            lambda v: v if math.isnan(v) else significant(v, 4))  # as read: 4 significant digits, like the epoch
        table["wall_to_target_s"] = targeted["wall_to_target_s"].median().reindex(table.index)
        table["target_ranked"] = (table["target_reached"] > 0) & (2 * table["target_reached"] >= table["target_runs"])
    table["run_ids"] = [",".join(ids[number]) for number in table.index]
    return table.reset_index(drop=True)


def build(sweep: "SweepRecord", options: CompareOptions | None = None) -> Comparison:
    """The comparison of `sweep`'s finished children: one row per setting, speedups with intervals,
    the one best setting marked (`best`, with the run whose model stands for it in `best_run_id`)."""
    options = options or CompareOptions()
    runs = pd.DataFrame([_run_row(run) for run in sweep.children])
    if runs.empty:
        return Comparison(sweep, pd.DataFrame(), [], [], runs, options.include_contended, options.target,
                          quality_margin=options.quality_margin)
    runs = runs.set_index("run_id", drop=False)
    known = runs["target"].dropna()
    target = options.target or (known.iloc[0] if len(known) else None)
    table = _settings(runs, target, options.include_contended)
    comparison = Comparison(sweep, table, [], [], runs, options.include_contended, target,
                            quality_margin=options.quality_margin)
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
    chosen = pick(comparison, BEST)
    table["best"] = [chosen is not None and index == chosen.index for index in table.index]
    table["best_run_id"] = [chosen.run_id if chosen is not None and index == chosen.index else ""
                            for index in table.index]
    first = [c for c in KEY_COLUMNS if c in table]
    table = table[first + [c for c in table.columns if c not in first]]
    comparison.table = _sorted(table, options.sort, target).reset_index(drop=True)
    return comparison


# --- the one best setting -------------------------------------------------------------------------

BEST, SPEED, ACCURACY = "best", "speed", "accuracy"
RULES = {
    BEST: "the fastest setting whose test accuracy is within the quality margin of the most accurate's",
    SPEED: "the fastest setting",
    ACCURACY: "the most accurate setting",
}


@dataclass(frozen=True)
class Pick:
    """The setting a rule picks and the run that stands for it (its most accurate run: the model to ship)."""

    rule: str  # BEST, SPEED or ACCURACY
    index: Any  # the row's index in the table it was picked from
    label: str  # "cpu bs128 w0"
    run_id: str
    speed: str  # what it was fastest by: "time_to_target_s" or STEADY_EPOCH
    figures: dict[str, float]  # what it won on: its speed figure, its accuracy, and the runs behind them

    def words(self) -> str:
        """"cpu bs128 (0.412 s/epoch, test acc 0.8123, 3 runs; model from run 1a2b3c4d)"; "2 of 3 runs
        timed" where contended runs were left out of the speed figure."""
        runs, timed = int(self.figures["n"]), int(self.figures["timed_runs"])
        counted = f"{runs} run{'s' if runs != 1 else ''}" if timed == runs else f"{timed} of {runs} runs timed"
        return f"{self.label} ({self.figure_words()}, {counted}; model from run {self.run_id[:8]})"

    def figure_words(self) -> str:
        """What it won on: "0.412 s/epoch, test acc 0.8123" ("1.19 s to target, ..." by time to target)."""
        speed = self.figures.get(self.speed, math.nan)
        time = f"{speed:.2f} s to target" if self.speed == "time_to_target_s" else f"{speed:.3f} s/epoch"
        return f"{time}, test acc {self.figures[FINAL_ACCURACY]:.4f}"


def fastest_first(table: pd.DataFrame, target: str | None) -> pd.Index:
    """The rows' index, fastest first: rows that rank on time to target (where the sweep has a target)
    by it, then the rest by steady epoch time; rows with no speed figure (withheld) last."""
    ranked = table["target_ranked"] if target is not None and "target_ranked" in table else \
        pd.Series(False, index=table.index)
    keys = pd.DataFrame({"unranked": ~ranked, "time": table["time_to_target_s"].where(ranked) if ranked.any()
                         else math.nan, "epoch": table[STEADY_EPOCH]}, index=table.index)
    return keys.sort_values(["unranked", "time", "epoch"], na_position="last", kind="stable").index


def pick(comparison: Comparison, rule: str = BEST) -> Pick | None:
    """The setting `rule` picks, or None when no row has a speed figure (every run contended) for a
    rule that needs one. BEST: of the settings whose accuracy is no more than the quality margin below
    the most accurate setting's, the fastest (by time to target where the sweep has one and the
    setting reaches it in at least half its runs, else by steady epoch). SPEED: the fastest. ACCURACY:
    the most accurate, the fastest of equals. The verdict, the parent's model, `pipeline register`
    and the UI's first row all name this one."""
    t = comparison.table
    if t.empty:
        return None
    order = t.loc[fastest_first(t, comparison.target)]
    if rule == ACCURACY:
        candidates = order[order[FINAL_ACCURACY] == t[FINAL_ACCURACY].max()]
    else:
        candidates = order[order[STEADY_EPOCH].notna()]  # a speed figure: not withheld
        if rule == BEST:
            top = t[FINAL_ACCURACY].max()
            candidates = candidates[[not less_accurate(accuracy - top, comparison.quality_margin)
                                     for accuracy in candidates[FINAL_ACCURACY]]]
    chosen = candidates.index[0] if len(candidates) else None
    if chosen is None:
        return None
    row = t.loc[chosen]
    on_target = comparison.target is not None and ranks_on_target(row)
    speed = "time_to_target_s" if on_target else STEADY_EPOCH
    figures = {STEADY_EPOCH: float(row[STEADY_EPOCH]), FINAL_ACCURACY: float(row[FINAL_ACCURACY]),
               "n": int(row["n"]), "timed_runs": int(row["timed_runs"])}
    if speed == "time_to_target_s":
        figures["time_to_target_s"] = float(row["time_to_target_s"])
    return Pick(rule, chosen, comparison.label(row), _model_run(comparison, row), speed, figures)


def run_order(comparison: Comparison) -> list[str]:
    """Every run of the comparison in the verdict's order: the best setting's model run first (pick),
    then the settings fastest first (fastest_first), each setting's runs most accurate first."""
    t = comparison.table
    if t.empty:
        return []
    accuracy = comparison.per_run[FINAL_ACCURACY]
    run_ids = t["run_ids"].to_dict()
    ordered = []
    for index in fastest_first(t, comparison.target):
        ids = str(run_ids[index]).split(",")
        # Most accurate first (a run without the figure last), the earliest of equals first.
        ordered += sorted(ids, key=lambda r: -accuracy[r] if not math.isnan(accuracy[r]) else math.inf)
    best = pick(comparison, BEST)
    if best is not None:
        ordered.remove(best.run_id)
        ordered.insert(0, best.run_id)
    return [str(run_id) for run_id in ordered]


def _model_run(comparison: Comparison, row: pd.Series) -> str:
    """The run whose model stands for a setting: its most accurate run (the earliest of equals)."""
    ids = str(row["run_ids"]).split(",")
    accuracy = comparison.runs.loc[ids, FINAL_ACCURACY].fillna(-math.inf)
    return str(accuracy.idxmax())


def _sorted(table: pd.DataFrame, sort: str | None, target: str | None) -> pd.DataFrame:
    """`--sort`'s order (higher first for accuracies and speedups); by default, with a target, the
    rows that rank on it (reached in at least half their runs) fastest first, then the rest by epoch
    time (the terminal's table puts the fastest first either way: decision_frame)."""
    if sort is None:
        if target is None:
            return table
        return table.loc[fastest_first(table, target)]
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
    keys = ["device", *GRID_TWIN_KEYS]  # the grid keys a row's twins may differ in
    if key in KEYS and key not in keys:  # gpus_per_run: where a run ran, not what it measured
        raise UserError(f"--versus {versus}: runs that differ only in {key} are one setting; compare on one of "
                        f"{', '.join(keys)}")
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


Row = dict[str, Any]  # one row of the comparison's table, as a plain dict (with its index under "index")


def _twins(comparison: Comparison, axis: str, reference_value: str) -> Iterator[tuple[Row, list[Row]]]:
    """Each group of rows equal in everything but `axis` that has a row with `reference_value` there:
    (the group's reference row, the other rows), in table order, as plain dicts. Other devices are
    other hardware by nature: device twins may differ in both. One pass over the table (a dict of
    groups), so a sweep of thousands of settings pairs in milliseconds."""
    table = comparison.table
    ignored = {axis, "hardware"} if axis == "device" else {axis}
    keys = [k for k in ROW_KEYS if k in table and k not in ignored]
    is_reference = _same(table[axis], reference_value).to_dict()
    # The columns a speedup reads of a row (its settings, runs and figures), not the table's hundred.
    needed = [c for c in (*ROW_KEYS, "run_ids", "timed", STEADY_EPOCH, "time_to_target_s", "target_ranked")
              if c in table]
    # As plain objects first: pandas' Arrow-backed strings are slow to iterate one by one.
    rows = table[needed].astype(object).reset_index().to_dict("records")
    groups: dict[tuple, list[Row]] = {}
    for row, key in zip(rows, table[keys].astype(object).astype(str).itertuples(index=False, name=None)):
        groups.setdefault(key, []).append(row)
    for members in groups.values():
        references = [row for row in members if is_reference[row["index"]]]
        others = [row for row in members if not is_reference[row["index"]]]
        if references and others:
            yield references[0], others


def axis_ratios(comparison: Comparison, axis: str, reference_value: str,
                samples: Callable[[pd.Series], list[float]] | None = None) -> list[tuple[str, stats.Ratio]]:
    """Each row's speedup over its twin that differs only in `axis` and has `reference_value` there
    (a speedup > 1: the row is faster), as (the row's label, its Ratio with the interval); rows with no
    such twin are left out. `samples`: one value per run (default: the timed runs' steady epochs).
    `repeats: auto` stops once every ratio of the grid's axes is clear."""
    samples = samples or comparison.epochs
    found = []
    for reference, others in _twins(comparison, axis, reference_value):
        for row in others:
            ratio = stats.ratio(samples(reference), samples(row))
            if not math.isnan(ratio.estimate):
                found.append((comparison.label(row), ratio))
    return found


def accuracy_change(comparison: Comparison, row: pd.Series, reference: pd.Series) -> stats.Difference:
    """`row`'s final test accuracy minus `reference`'s, over one value per run, with Welch's interval."""
    return stats.difference(comparison.accuracies(row), comparison.accuracies(reference))


def less_accurate(change: float, margin: float) -> bool:
    """Whether an accuracy `change` (a row's minus its reference's, estimated over their runs) is a loss
    beyond the quality margin: the one test for a speedup's win and for the best setting."""
    return change < -margin - 1e-12


def _speedups(comparison: Comparison, axis: str, reference_value: str, column: str,
              samples: Callable[[pd.Series], list[float]], what: str = "epoch time") -> list[str]:
    """Each row's speedup over its twin row that differs only in `axis`, where that twin has
    `reference_value` (the cpu row for devices, the fp32 row for precisions), with its 95% interval
    over one value per run (stats.ratio), and for a faster row its accuracy against the reference's;
    columns `column` and its INTERVAL_SUFFIXES, QUALITY_SUFFIXES and _vs are added to the table. One
    summary line per group of twins."""
    table = comparison.table
    size = len(table)
    speedup, low, high = ([math.nan] * size for _ in range(3))
    change, change_low, change_high = ([math.nan] * size for _ in range(3))
    significant: list[bool | None] = [None] * size
    win: list[bool | None] = [None] * size
    versus = [""] * size
    lines = []
    varying = [k for k in ROW_KEYS if k in table and k not in (axis, "hardware") and table[k].nunique() > 1]
    for reference, others in _twins(comparison, axis, reference_value):
        label = " ".join(f"{k}={format_value(reference[k])}" for k in varying) or "all settings equal"
        parts = []
        for row in others:
            index = row["index"]
            ratio = stats.ratio(samples(reference), samples(row))
            if math.isnan(ratio.estimate):
                continue
            speedup[index], low[index], high[index] = ratio.estimate, ratio.low, ratio.high
            significant[index], versus[index] = ratio.significant, reference["run_ids"]
            worse = None
            if ratio.estimate > 1:  # faster: a win only if it learnt as well
                accuracy = accuracy_change(comparison, row, reference)
                change[index], change_low[index], change_high[index] = accuracy.estimate, accuracy.low, accuracy.high
                worse = accuracy if less_accurate(accuracy.estimate, comparison.quality_margin) else None
                win[index] = bool(ratio.significant) and worse is None
            else:
                win[index] = False
            parts.append(f"{_value(axis, row[axis])} {verdict(ratio.estimate, ratio.low, ratio.high, worse=worse, runs=ratio.runs)} "
                         f"({_figure(row, samples, what)})")
        if not parts:
            continue
        speedup[reference["index"]] = 1.0
        lines.append(f"{label}: {', '.join(parts)} vs {_value(axis, reference_value)} "
                     f"({_figure(reference, samples, what)}); {_basis(reference, what)}")
    table[column], table[f"{column}_low"], table[f"{column}_high"] = speedup, low, high
    table[f"{column}_significant"], table[f"{column}_vs"] = significant, versus
    table[f"{column}_accuracy_change"], table[f"{column}_accuracy_change_low"] = change, change_low
    table[f"{column}_accuracy_change_high"], table[f"{column}_win"] = change_high, win
    return lines


def _figure(row: pd.Series, samples: Callable[[pd.Series], list[float]], what: str) -> str:
    """A row's figure in a speedup line, as its table cell shows it (the median over its runs), and
    how many runs the speedup counts."""
    runs = len(samples(row))
    figure = f"{row[STEADY_EPOCH]:.3f} s/epoch" if what == "epoch time" else f"{row['time_to_target_s']:.3f} s"
    return f"{figure}, {runs} run{'s' if runs != 1 else ''}"


def _basis(reference: pd.Series, what: str) -> str:
    if what == "epoch time":
        return f"each run's median epoch time, timed on {reference['timed']}"
    return f"{what} of the runs that reached it"


def _value(axis: str, value: Any) -> str:
    """A twin axis's value as a speedup line names it: cuda, bf16, compile=true, num_workers=0."""
    return str(value) if axis in ("device", "precision") else f"{axis}={format_value(value)}"


def verdict(estimate: float, low: float, high: float, compact: bool = False,
            worse: stats.Difference | None = None, runs: tuple[int, int] | None = None,
            significance: bool = False) -> str:
    """A speedup in words: "2.41x faster [2.30-2.52]", "1.02x slower [0.97-1.08] (n.s.)", or "(n too
    small (1 run))" where there is no interval (`runs`: each side's runs, for the count). Slower is
    said as the inverse ratio (never "x0.42"), its interval inverted with it. `worse`: the faster
    row's accuracy change where it is below the reference's by more than the margin: ", but less
    accurate by 0.012 [0.005-0.020]". `compact`: each part on its own line (a terminal cell).
    `significance` (the verdict's lines): a significant one says so too, "(significant)", and one
    without an interval says why it is withheld: "(significance withheld: n too small (1 run))"."""
    if math.isnan(estimate):
        return ""
    faster = estimate >= 1
    words = f"{estimate:.2f}x faster" if faster else f"{1 / estimate:.2f}x slower"
    gap = "\n" if compact else " "  # a terminal cell: the interval on its second line
    if math.isnan(low) or math.isnan(high):
        why = stats.too_small(runs) if runs is not None and not compact else stats.TOO_SMALL
        why = f"significance withheld: {why}" if significance and not compact else why
        text = f"{words}{gap}" + (why if compact else f"({why})")
    else:
        lo, hi = (low, high) if faster else (1 / high, 1 / low)
        text = f"{words}\n{lo:.2f}-{hi:.2f}" if compact else f"{words} [{lo:.2f}-{hi:.2f}]"
        if not (low > 1 or high < 1):
            text = f"{text}\nn.s." if compact else f"{text} (n.s.)"
        elif significance and not compact:
            text = f"{text} (significant)"
    if worse is not None:
        shortfall = f"{-worse.estimate:.4f}"
        if worse.has_interval:
            shortfall += f"\n{-worse.high:.4f}-{-worse.low:.4f}" if compact else f" [{-worse.high:.4f}-{-worse.low:.4f}]"
        text += f"\nless accurate by {shortfall}" if compact else f", but less accurate by {shortfall}"
    return text


def headline(comparison: Comparison) -> list[str]:
    """The answer first, in a few plain lines: the best setting by the one rule (pick) and the run
    whose model stands for it; the fastest and the most accurate where they are other settings; the
    first to the target among settings that reach it in at least half their runs; each axis's speedup
    with its interval (device, precision, compile, --versus). Where every run is contended, the speed
    claims are withheld and the lines say why. The sweep's end, `pipeline compare` and the parent
    run's description all open with these lines."""
    t = comparison.table
    if t.empty:
        return []
    lines = []
    withheld = withheld_line(comparison)
    if withheld:
        lines += withheld
    best, fastest, accurate = (pick(comparison, rule) for rule in (BEST, SPEED, ACCURACY))
    if best is not None:
        lines.append(f"Best: {best.words()}" + _best_is(comparison, best, fastest, accurate))
    if fastest is not None and best is not None and fastest.index != best.index:
        lines.append(f"Fastest: {fastest.label} ({_figures(t.loc[fastest.index])}), but less accurate than "
                     f"the most accurate by more than {comparison.quality_margin:g}")
    if accurate is not None and (best is None or accurate.index != best.index):
        lines.append(f"Most accurate: {accurate.label} ({_figures(t.loc[accurate.index], accuracy_first=True)})")
    if comparison.target is not None and "target_runs" in t:
        lines += _target_lines(comparison)
    for axis, reference, column, what in _axes(comparison):
        lines += _axis_lines(comparison, axis, reference, column, what)
    return lines


def short_verdict(comparison: Comparison, reason: bool = True) -> str:
    """The verdict in one short line, for where one line is all a reader sees (the MLflow UI shows an
    experiment's description folded to its first line): "Best: cpu bs128 (0.412 s/epoch, test acc
    0.8123): the fastest and the most accurate" (without `reason`, up to the colon); the first
    withheld line where every run is contended."""
    t = comparison.table
    if t.empty:
        return ""
    withheld = withheld_line(comparison)
    if withheld:
        return withheld[0]
    best, fastest, accurate = (pick(comparison, rule) for rule in (BEST, SPEED, ACCURACY))
    if best is None:
        return ""
    said = f"Best: {best.label} ({best.figure_words()})"
    return said + _best_is(comparison, best, fastest, accurate) if reason else said


def claims(comparison: Comparison) -> list[str]:
    """Each setting's part of the verdict, one text per row of the table: which of its picks the
    setting is (best, fastest, most accurate) and each speedup it has over its reference twin, in the
    verdict's words with its significance ("bf16 vs fp32, epoch time: 1.52x faster [1.40-1.65]
    (significant)"). The UI's view shows it beside each setting's figures (names.TAG_VERDICT)."""
    t = comparison.table
    said: dict[Any, list[str]] = {index: [] for index in t.index}
    for rule, word in ((BEST, "best"), (SPEED, "fastest"), (ACCURACY, "most accurate")):
        chosen = pick(comparison, rule)
        if chosen is not None:
            said[chosen.index].append(word)
    for axis, reference, column, what in _axes(comparison):
        if column not in t:
            continue
        for index, row in t[t[column].notna() & (t[f"{column}_vs"] != "")].iterrows():
            said[index].append(f"{_value(axis, row[axis])} vs {_value(axis, reference)}, {what}: "
                               f"{cell(comparison, row, column, significance=True)}")
    return ["; ".join(parts) for parts in said.values()]


def _best_is(comparison: Comparison, best: Pick, fastest: Pick | None, accurate: Pick | None) -> str:
    """Why the best is the best, in words: ": the fastest and the most accurate", ": the fastest,
    within 0.005 test acc of the most accurate", ..."""
    if len(comparison.table) == 1:
        return ""
    is_fastest = fastest is not None and fastest.index == best.index
    is_accurate = accurate is not None and accurate.index == best.index
    within = f"within {comparison.quality_margin:g} test acc of the most accurate"
    if is_fastest and is_accurate:
        return ": the fastest and the most accurate"
    if is_accurate:
        return ": the most accurate (every faster setting is less accurate by more than the margin)"
    return f": the fastest, {within}" if is_fastest else f": the fastest {within}"


def withheld_line(comparison: Comparison) -> list[str]:
    """Where every run is contended and not counted: why no speed claim is made, and what to do."""
    runs = comparison.runs
    if comparison.include_contended or runs.empty or not runs["contended"].all():
        return []
    share = runs[OTHERS_CPU_SHARE].median()
    took = f" (others took {100 * share:.0f}% of the cores)" if not math.isnan(share) else ""
    return [f"Speed withheld: {len(runs)} of {len(runs)} runs contended{took}",
            "Rerun on a quiet machine, or pass --include-contended to count them"]


def _target_lines(comparison: Comparison) -> list[str]:
    """The first to the target among the settings that rank on it, and the ones that rarely get there."""
    t = comparison.table
    ranked = t[t["target_ranked"]]
    timed = t[t["target_runs"] > 0]
    lines = []
    if len(ranked):
        first = ranked.loc[ranked["time_to_target_s"].idxmin()]
        lines.append(f"First to {comparison.target}: {comparison.label(first)} in {first['time_to_target_s']:.2f} s "
                     f"({first['target_reached']}/{first['target_runs']} runs)")
    elif len(timed):
        lines.append(f"No setting reached {comparison.target} in at least half its runs")
    rare = timed[(timed["target_reached"] > 0) & ~timed["target_ranked"]]
    if len(rare):
        names = ", ".join(f"{comparison.label(row)} ({row['target_reached']}/{row['target_runs']})"
                          for _, row in rare.head(5).iterrows())
        lines.append(f"Reached {comparison.target} in fewer than half their runs (not ranked): {names}"
                     + (f" and {len(rare) - 5} more" if len(rare) > 5 else ""))
    return lines


def _figures(row: pd.Series, accuracy_first: bool = False) -> str:
    """A setting's two headline figures: "0.123 s/epoch, test acc 0.8123" ("speed withheld" where
    every run of it was contended)."""
    speed = row[STEADY_EPOCH]
    time = "speed withheld" if math.isnan(speed) else f"{speed:.3f} s/epoch"
    accuracy = f"test acc {row[FINAL_ACCURACY]:.4f}"
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
        said = [cell(comparison, r, column, significance=True) for _, r in group.iterrows()]
        head = f"{_value(axis, value)} vs {_value(axis, reference)}, {what}"
        if len(group) == 1:
            where = _where(comparison, group.iloc[0], axis)
            lines.append(f"{head}: {said[0]}" + (f" ({where})" if where else ""))
        else:
            low, high = group.iloc[0], group.iloc[-1]
            lines.append(f"{head}: from {said[0]} ({_where(comparison, low, axis)}) to {said[-1]} "
                         f"({_where(comparison, high, axis)}), over {len(group)} settings")
    return lines


def cell(comparison: Comparison, row: pd.Series, column: str, compact: bool = False,
         significance: bool = False) -> str:
    """A row's speedup in `column` in words (verdict), with its runs and its accuracy shortfall."""
    change = row.get(f"{column}_accuracy_change", math.nan)
    worse = None
    if not math.isnan(change):
        worse = stats.Difference(change, row[f"{column}_accuracy_change_low"], row[f"{column}_accuracy_change_high"])
        worse = worse if less_accurate(change, comparison.quality_margin) else None
    runs = None
    if row.get(f"{column}_vs"):
        # The reference's runs: its run ids are in `_vs`; it ranked on the target, or there would be no speedup.
        samples = comparison.to_target if column == TARGET_SPEEDUP else comparison.epochs
        runs = (len(samples({"run_ids": row[f"{column}_vs"], "target_ranked": True})), len(samples(row)))
    return verdict(row[column], row[f"{column}_low"], row[f"{column}_high"], compact, worse, runs, significance)


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
            notes.append(f"{len(contended)} contended run(s) counted in the speed figures (--include-contended): "
                         f"{figures}")
        else:
            notes.append(f"{len(contended)} of {len(runs)} runs contended (other processes took the cores), left out "
                         f"of every speed figure, ranking, speedup and the best setting: {figures}; "
                         "--include-contended counts them")
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
    return pd.concat([out, speedup_columns(comparison, t, always=("speedup",), compact=stacked)], axis=1)


def decision_frame(comparison: Comparison) -> pd.DataFrame:
    """What a decision rests on, narrow enough for a 120-column terminal (a narrower one folds it into
    tables that each repeat the settings: report.frame_tables): the device and the settings that vary,
    n where a setting was repeated, the epoch time with its interquartile range under it, time to
    target where timed, the speedups this sweep has (each interval on its cell's second line), test
    accuracy and images/s. Columns with nothing in them for this sweep are left out. Fastest first,
    unless --sort said otherwise (with a target the table already ranks by it)."""
    t = comparison.table
    if comparison.sorted_by is None and comparison.target is None:
        t = t.sort_values("epoch_duration_s", kind="stable", na_position="last")
    out = t[comparison.setting_columns].copy()
    if (t["n"] > 1).any():
        out["n"] = t["n"]
    if t["contended"].any():
        out["contended"] = _contended(t)
    out[LABELS["epoch_duration_s"]] = _spreads(t, compact=True)
    if t["timed"].nunique() > 1:
        out["timed"] = t["timed"]
    if comparison.target is not None:
        out[LABELS["time_to_target_s"]] = [_to_target(row, True) for _, row in t.iterrows()]
    out = pd.concat([out, speedup_columns(comparison, t, compact=True)], axis=1)
    out[LABELS["test_accuracy"]] = t[FINAL_ACCURACY].map(lambda v: "-" if math.isnan(v) else f"{v:.4f}")
    out[LABELS["images_per_s"]] = _images(t)
    return out


def _contended(t: pd.DataFrame) -> list[str]:
    return [f"{c}/{n}" if c else "" for c, n in zip(t["contended"], t["n"])]


def _spreads(t: pd.DataFrame, compact: bool) -> list[str]:
    return [spread(m, q1, q3, compact) for m, q1, q3 in
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


def spread(median: float, q1: float, q3: float, compact: bool) -> str:
    """A median epoch time and its interquartile range: "0.300 [0.290-0.310]" (none where they agree;
    "-" where every run was contended and the figure is withheld)."""
    if math.isnan(median):
        return "-"
    if math.isnan(q1) or f"{q1:.3f}" == f"{q3:.3f}":
        return f"{median:.3f}"
    return f"{median:.3f}\n{q1:.3f}-{q3:.3f}" if compact else f"{median:.3f} [{q1:.3f}-{q3:.3f}]"


def _to_target(row: pd.Series, compact: bool) -> str:
    """A row's median time to target and how many of its timed runs reached it: "1.23 (3/4)"; "not
    reached (1/4)" where fewer than half did (it does not rank on it); "-" where its runs were
    trained without the target."""
    if not row["target_runs"]:
        return "-"
    reached = f"({row['target_reached']}/{row['target_runs']})"
    time = f"{row['time_to_target_s']:.2f}" if ranks_on_target(row) else "not reached"
    return f"{time}\n{reached}" if compact else f"{time} {reached}"


def speedup_columns(comparison: Comparison, frame: pd.DataFrame | None = None, always: tuple[str, ...] = (),
                    compact: bool = False) -> pd.DataFrame:
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
