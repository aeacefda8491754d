"""Compare a sweep's settings: one row per setting (its repeats aggregated), speedups with 95%
intervals, time to a target, where the time went, and the one best setting, as data.

Works on plain RunRecords (records.read_sweep), so it needs no MLflow calls of its own. Runs that
differ only in `repeat` (names.REPEAT) are one row. The run is the unit: each run gives one value
per figure (its median steady-state epoch, its time to target, its final accuracy); a row's epoch
time, images/s and time to target are geometric means over its runs (the estimate speedups take),
its other figures medians, and every speedup is the ratio of the two rows' geometric means with
Welch's 95% interval on the logs (stats.ratio): none below two runs a side ("n too small"). A
speedup is a win only if the faster row is no less accurate than its reference by more than the
quality margin. Runs recorded while other processes took the cores (names.TAG_CONTENDED) are
counted in their row but left out of every speed figure, ranking, speedup and the best setting
unless asked for (accuracy does not depend on the machine's load, so it counts every run).

Analysis only: numbers, labels and picks, never text for a reader. What a comparison says in words
is sentences.py's (the verdict, the speedup lines, the notes), its tables are tables.py's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pipeline.analysis.figures import DATA, END, EVERY, METRIC, OWN, TIMED, figures, named
from pipeline.base.names import (
    END_FIGURES,
    FINAL_ACCURACY,
    REPEAT,
    STEADY_ENERGY,
    STEADY_EPOCH,
    STEADY_IMAGES,
    TAG_CONTENDED,
    TAG_DEVICE,
    TAG_ENERGY,
    TAG_HARDWARE,
    TAG_HOST,
    TAG_TARGET,
    TAG_TARGET_STATUS,
    TRAINED_EPOCHS,
    WALL_TO_TARGET,
)
from pipeline.errors import UserError
from pipeline.measures import stats
from pipeline.measures.sequential import Design
from pipeline.measures.timing import FIGURE_HISTORIES, has_end_figures, run_figures, significant, timed_label
from pipeline.settings.config import DEFAULT_QUALITY_MARGIN, DEFAULTS, KEYS, LATER_KEYS
from pipeline.settings.grid import format_value, short

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pipeline.base.runs import RunRecord, SweepRecord

# Runs equal in all of these but the device are "twins" whose epoch times compare devices: every
# grid key that changes what a run measures (config.Key.twin), and the data sizes.
GRID_TWIN_KEYS = tuple(name for name, key in KEYS.items() if key.twin)
TWIN_KEYS = (*GRID_TWIN_KEYS, "train_size", "test_size")
# What makes one row: a setting on one device of one kind of hardware. Its repeats are its runs.
ROW_KEYS = ("device", "hardware", *TWIN_KEYS)
# The axes whose twins get a speedup (config.Key.speedup): the column, its reference value, the speedup column.
TWIN_AXES: tuple[tuple[str, str, str], ...] = tuple((name, *key.speedup) for name, key in KEYS.items() if key.speedup)
VERSUS = "versus_speedup"  # --versus KEY=VALUE: each row over its twin with KEY=VALUE
TARGET_SPEEDUP = "target_speedup"  # the device speedup on time to target
_LATER_DEFAULTS = {key: format_value(DEFAULTS[key]) for key in LATER_KEYS}  # as params are logged
# A run's steady-state summary, as each child logs it and as every view of the sweep shows it.
SUMMARY = (STEADY_EPOCH, STEADY_IMAGES, FINAL_ACCURACY)
SPEEDUPS = (*(column for _, _, column in TWIN_AXES), VERSUS, TARGET_SPEEDUP)
INTERVAL_SUFFIXES = ("_low", "_high", "_significant")
# With each speedup, the faster row's accuracy against its reference's (a difference, with its
# interval) and whether the speedup is a win: significant, and not less accurate beyond the margin.
QUALITY_SUFFIXES = (
    "_accuracy_change",
    "_accuracy_change_low",
    "_accuracy_change_high",
    "_accuracy_change_identical",  # where a side's repeats all scored the same: their count (no interval)
    "_win",
)
# Per-epoch histories, read for a run only where needed (records.read_sweep): a run's figures come
# from what it logged at its end, or from HISTORIES for a run made before children logged them; the
# charts draw CHART_HISTORIES (`pipeline compare --out`; a sweep's end has them from its own epochs).
HISTORIES = FIGURE_HISTORIES
CHART_HISTORIES = ("test_accuracy",)
# The data's first columns (csv, json): which setting, its runs, the results people compare.
KEY_COLUMNS = (
    "run_name",
    "device",
    *TWIN_KEYS,
    "n",
    "timed_runs",
    *SUMMARY,
    "epoch_duration_s",
    "epoch_duration_s_q1",
    "epoch_duration_s_q3",
    "timed",
    "images_per_s",
    "test_accuracy",
    *(f"{c}{s}" for c in SPEEDUPS for s in ("", *INTERVAL_SUFFIXES, *QUALITY_SUFFIXES)),
    "peak_memory_mb",
    "best",
    "best_run_id",
    "run_ids",
)


@dataclass(frozen=True)
class CompareOptions:
    """What `pipeline compare` was asked for, beyond which sweep."""

    sort: str | None = None  # a column or its label; default: time to target when there is one, else run order
    versus: str | None = None  # "KEY=VALUE": a speedup of every row over its twin with KEY=VALUE
    include_contended: bool = False  # count contended runs in the speed figures, speedups and the gate
    target: str | None = None  # the sweep's target (its parent's TAG_TARGET); None: the runs' own
    quality_margin: float = DEFAULT_QUALITY_MARGIN  # the accuracy a faster setting may lose and still win
    # A `repeats: auto` sweep's (rounds reached, max_repeats): its intervals are its sequential design's
    # at that round (measures/sequential.py). None: a fixed count, judged once at 95%.
    rounds: tuple[int, int] | None = None


def sweep_options(
    params: Mapping[str, str],
    tags: Mapping[str, str],
    options: CompareOptions,
    quality_margin: float | None = None,
    rounds: int | None = None,
) -> CompareOptions:
    """`options` with what the sweep's parent run recorded (its `params` and `tags`, read by the
    caller): its target (TAG_TARGET), its grid's quality margin (the `quality_margin` param; 0.005
    for sweeps made before it was recorded) unless `quality_margin` overrides it, and for a `repeats:
    auto` sweep the round it reached (`rounds`, read by the caller) of its max_repeats."""
    recorded = params.get("quality_margin")
    margin = quality_margin if quality_margin is not None else float(recorded or DEFAULT_QUALITY_MARGIN)
    design = None
    if params.get("repeats") == "auto" and params.get("max_repeats") and rounds:
        design = (int(rounds), int(params["max_repeats"]))
    return replace(options, target=tags.get(TAG_TARGET), quality_margin=margin, rounds=design)


Row = dict[str, Any]  # one row of the comparison's table, as a plain dict (with its index under "index")


@dataclass(frozen=True)
class TwinSpeedup:
    """One row's speedup over the reference row of its twin group (TwinGroup)."""

    row: Row  # the row's settings, runs and figures, as _twins reads them
    ratio: stats.Ratio  # the reference's figure over the row's: > 1 is faster
    worse: stats.Difference | None  # a faster row's accuracy change, where it is a loss beyond the margin
    runs: int  # the runs its figure counts


@dataclass(frozen=True)
class TwinGroup:
    """Rows equal in everything but `axis`, each with its speedup over the one with `reference_value`
    there (the cpu row for devices, the fp32 row for precisions): what a speedup line says."""

    axis: str
    reference_value: str
    column: str  # the table's speedup column: "speedup", "precision_speedup", ...
    what: str  # the figure compared: "epoch time", or "time to TARGET"
    reference: Row
    reference_runs: int  # the runs the reference's figure counts
    speedups: tuple[TwinSpeedup, ...]


@dataclass
class Comparison:
    sweep: SweepRecord
    table: pd.DataFrame  # one row per setting (its repeats aggregated); columns above
    # Each group of twin rows with a reference row and another, per speedup column, in build order.
    twin_groups: list[TwinGroup] = field(default_factory=list)
    # One row per finished run, indexed by run id: the rows' material (one value per run and figure).
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    include_contended: bool = False
    target: str | None = None  # "test_accuracy >= 0.85" when the sweep was timed against one
    versus: tuple[str, str] | None = None  # --versus KEY=VALUE, checked: (KEY, VALUE)
    sorted_by: str | None = None  # --sort, where one was asked for
    quality_margin: float = DEFAULT_QUALITY_MARGIN
    rounds: tuple[int, int] | None = None  # a `repeats: auto` sweep's (round reached, max_repeats)

    @property
    def confidence(self) -> float:
        """The confidence of every interval of the comparison: 95%, or for a `repeats: auto` sweep its
        sequential design's at the round it stopped (a repeated 95% interval, wider than a plain one)."""
        if self.rounds is None:
            return stats.CONFIDENCE
        reached, most = self.rounds
        return Design(most).confidence(reached)

    def ratio(self, numerator: list[float], denominator: list[float]) -> stats.Ratio:
        """stats.ratio at the comparison's confidence: every speedup, lead and headline takes this one."""
        return stats.ratio(numerator, denominator, self.confidence)

    def label(self, row: pd.Series) -> str:
        """A setting as people name it: its device and the settings that vary ("cpu bs128 w0"),
        as run names spell them but without a repeat's number."""

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
        """The time to target of each timed run of `row`, one value per run; none unless the row ranks
        on time to target (every timed run reached it: a figure from the survivors alone would favour
        a setting that often misses)."""
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
    """Whether a row's time to target counts (ranks, headlines, speedups): every one of its timed runs
    reached the target (the table's `target_ranked`). A setting that missed it in some shows "reached
    in k of n runs" and ranks by epoch time instead."""
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


def _run_row(run: RunRecord) -> dict[str, Any]:
    """One finished run's figures: its settings, final metrics, steady-state speed and shares."""
    row: dict[str, Any] = {"run_id": run.run_id, "run_name": run.name}
    row["device"] = run.tags.get(TAG_DEVICE) or run.params.get("device")
    row["requested_device"] = run.params.get("device")
    row["hardware"] = run.tags.get(TAG_HARDWARE, "")
    row["host"] = run.tags.get(TAG_HOST, "")
    row["repeat"] = int(run.params.get(REPEAT, "1"))  # runs made before repeats existed are repeat 1
    for key in TWIN_KEYS:  # a setting added later is at its default in runs made before it
        row[key] = _number(run.params.get(key, _LATER_DEFAULTS.get(key)))
    ended = run_summary(run)
    row.update({name: ended.get(name, math.nan) for name in SUMMARY})
    row["timed"] = timed_label(int(ended[TRAINED_EPOCHS]))
    for figure in figures():  # the table's figures: as logged, or from its end figures
        if figure.source == METRIC:
            row[figure.name] = run.metrics.get(figure.key, math.nan)
        elif figure.source == END:
            row[figure.name] = ended.get(figure.key, math.nan)
    row["images_per_s"] = row[STEADY_IMAGES]
    # Counters advance in steps (NVML's every 100 ms): an epoch shorter than a step can read 0 J,
    # and the mean over the steady epochs is right to one step. Zero in all of them is unknown.
    energy = ended.get(STEADY_ENERGY, math.nan)
    source = run.tags.get(TAG_ENERGY, "not measured: recorded before energy was")
    if energy == 0:
        energy, source = (
            math.nan,
            (
                f"not measured: the counter ({source}) did not advance in the steady "
                "epochs, each shorter than its update interval; train longer epochs"
            ),
        )
    row["energy_j"], row["energy_source"] = energy, source
    row["images_per_j"] = int(run.params.get("train_size") or 0) / energy if energy > 0 else math.nan
    row["contended"] = TAG_CONTENDED in run.tags
    row["contended_detail"] = run.tags.get(TAG_CONTENDED, "")
    row["target"] = run.tags.get(TAG_TARGET)
    row["target_status"] = run.tags.get(TAG_TARGET_STATUS, "")
    row["wall_to_target_s"] = run.metrics.get(WALL_TO_TARGET, math.nan)
    return row


def run_summary(run: RunRecord) -> dict[str, float]:
    """A run's per-run figures, its summary (SUMMARY) and its end figures (names.END_FIGURES), as it
    logged them at its end. For a run logged before children did, the same figures from its history
    (timing.run_figures; a summary it did log is kept), so that old and new runs agree. A figure
    that cannot be told is left out; the epoch count is always there."""
    if has_end_figures(run.metrics):
        return {name: run.metrics[name] for name in (*SUMMARY, *END_FIGURES) if name in run.metrics}
    # A history that was not read falls back to the metric's last value, as the store returns it.
    history = {
        name: run.histories.get(name) or ([run.metrics[name]] if name in run.metrics else []) for name in HISTORIES
    }
    computed = run_figures(history, run.metrics.get("test_accuracy"))
    return {**computed, **{name: run.metrics[name] for name in SUMMARY if name in run.metrics}}


def _geometric_means(values: pd.Series, groups: pd.Series) -> pd.Series:
    """The geometric mean of each group's positive values (stats.geometric_mean, all groups at once)."""
    logs = np.log(values.where(values > 0))
    return np.exp(logs.groupby(groups).mean())


def _settings(runs: pd.DataFrame, target: str | None, include_contended: bool) -> pd.DataFrame:
    """One row per setting from its runs (the repeats), one value per run and figure, all settings at
    once (a sweep of 10,000 runs is a few group-wise reductions, not 10,000 small frames). The epoch
    time and the time to target are geometric means over the runs, the estimate every speedup is a
    ratio of (so the figures, the ranking and the speedups agree), with the quartiles of the epoch
    times as their spread; every other figure is the median over the runs. Speed figures count the
    timed runs (contended ones left out unless `include_contended`); a row with none has no speed
    figure (NaN: withheld). The summary is rounded as timing.summary rounds a run's, so a one-run
    setting shows its run's own figures."""
    group = runs.groupby(list(ROW_KEYS), dropna=False, sort=False).ngroup().rename("group")
    runs = runs.assign(group=group.values)
    timed = runs if include_contended else runs[~runs["contended"]]
    every, timed_groups = runs.groupby("group"), timed.groupby("group")
    table = every[["run_name", *ROW_KEYS, "timed", "energy_source", "requested_device"]].first()
    table["n"] = every.size()
    table["timed_runs"] = timed_groups.size().reindex(table.index, fill_value=0)
    levels = [0.25, 0.5, 0.75]
    quartiles = timed_groups[STEADY_EPOCH].quantile(levels).unstack() if len(timed) else pd.DataFrame()
    quartiles = quartiles.reindex(index=table.index, columns=levels)  # every run contended: all NaN
    table["epoch_duration_s_q1"], table["epoch_duration_s_q3"] = quartiles[0.25], quartiles[0.75]
    table["epoch_duration_s"] = _geometric_means(timed[STEADY_EPOCH], timed["group"]).reindex(table.index)
    speed = [f.name for f in figures(over=TIMED)]
    table[speed] = timed_groups[speed].median().reindex(table.index)[speed]
    learnt = [f.name for f in figures(over=EVERY)]
    table[learnt] = every[learnt].median()
    table[STEADY_EPOCH] = table["epoch_duration_s"].map(lambda v: v if math.isnan(v) else significant(v, 4))
    # Images per second is the images of an epoch over the epoch time beside it, never a median of
    # rates beside a mean of times: the runs of a setting train the same images an epoch, so the
    # geometric mean of their rates is those images over the geometric mean of their times.
    table["images_per_s"] = _geometric_means(timed[STEADY_IMAGES], timed["group"]).reindex(table.index)
    table[STEADY_IMAGES] = table["images_per_s"].round(0)
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
        # Every timed run reached it, or the row does not rank on it: a time from the runs that made it
        # alone would favour a setting that often misses.
        table["target_ranked"] = (table["target_reached"] > 0) & (table["target_reached"] == table["target_runs"])
        reached = timed[timed["target"].notna()]
        table["time_to_target_s"] = (
            _geometric_means(reached["time_to_target_s"], reached["group"])
            .reindex(table.index)
            .where(table["target_ranked"])
            .map(lambda v: v if math.isnan(v) else significant(v, 4))
        )  # as read: 4 significant digits, like the epoch
        table["wall_to_target_s"] = (
            _geometric_means(reached["wall_to_target_s"], reached["group"])
            .reindex(table.index)
            .where(table["target_ranked"])
        )
    table["run_ids"] = [",".join(ids[number]) for number in table.index]
    return table.reset_index(drop=True)


def build(sweep: SweepRecord, options: CompareOptions | None = None) -> Comparison:
    """The comparison of `sweep`'s finished children: one row per setting, speedups with intervals,
    the one best setting marked (`best`, with the run whose model stands for it in `best_run_id`)."""
    options = options or CompareOptions()
    runs = pd.DataFrame([_run_row(run) for run in sweep.children])
    if runs.empty:
        return Comparison(
            sweep,
            pd.DataFrame(),
            [],
            runs,
            options.include_contended,
            options.target,
            quality_margin=options.quality_margin,
            rounds=options.rounds,
        )
    runs = runs.set_index("run_id", drop=False)
    known = runs["target"].dropna()
    target = options.target or (known.iloc[0] if len(known) else None)
    table = _settings(runs, target, options.include_contended)
    comparison = Comparison(
        sweep,
        table,
        [],
        runs,
        options.include_contended,
        target,
        quality_margin=options.quality_margin,
        rounds=options.rounds,
    )
    versus = comparison.versus = _versus(comparison, options.versus) if options.versus else None
    for axis, reference, column in TWIN_AXES:
        comparison.twin_groups += _speedups(comparison, axis, reference, column, comparison.epochs)
    if versus is not None:
        comparison.twin_groups += _speedups(comparison, *versus, VERSUS, comparison.epochs)
    if target is not None:
        comparison.twin_groups += _speedups(
            comparison, "device", "cpu", TARGET_SPEEDUP, comparison.to_target, what=f"time to {target}"
        )
    comparison.sorted_by = options.sort
    chosen = pick(comparison, BEST)
    table["best"] = [chosen is not None and index == chosen.index for index in table.index]
    table["best_run_id"] = [
        chosen.run_id if chosen is not None and index == chosen.index else "" for index in table.index
    ]
    first = [c for c in KEY_COLUMNS if c in table]
    table = table[first + [c for c in table.columns if c not in first]]
    if options.sort is None:
        table = table.loc[verdict_order(table, target, chosen.index if chosen is not None else None)]
    else:
        table = _sorted(table, options.sort)
    comparison.table = table.reset_index(drop=True)
    return comparison


# --- the one best setting -------------------------------------------------------------------------

BEST, SPEED, ACCURACY = "best", "speed", "accuracy"
TARGET = "target"  # a ranking only (ranking): the settings that rank on the target
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


def fastest_first(table: pd.DataFrame, target: str | None) -> pd.Index:
    """The rows' index, fastest first: rows that rank on time to target (where the sweep has a target)
    by it, then the rest by epoch time, each the geometric mean over the runs (the speedups' estimate);
    rows with no speed figure (withheld) last."""
    ranked = (
        table["target_ranked"]
        if target is not None and "target_ranked" in table
        else pd.Series(False, index=table.index)
    )
    keys = pd.DataFrame(
        {
            "unranked": ~ranked,
            "time": table["time_to_target_s"].where(ranked) if ranked.any() else math.nan,
            "epoch": table["epoch_duration_s"],
        },
        index=table.index,
    )
    return keys.sort_values(["unranked", "time", "epoch"], na_position="last", kind="stable").index


def ranking(comparison: Comparison, rule: str = SPEED) -> list[Any]:
    """The rows a speed rule ranks, fastest first (fastest_first), as table indexes: SPEED every row
    with a speed figure (not withheld), BEST those of them no more than the quality margin less
    accurate than the most accurate setting, TARGET those that rank on the sweep's target."""
    t = comparison.table
    if t.empty:
        return []
    order = t.loc[fastest_first(t, comparison.target)]
    order = order[order[STEADY_EPOCH].notna()]
    if rule == BEST:
        top = t[FINAL_ACCURACY].max()
        order = order[
            [not less_accurate(accuracy - top, comparison.quality_margin) for accuracy in order[FINAL_ACCURACY]]
        ]
    elif rule == TARGET:
        order = (
            order[order["target_ranked"]] if comparison.target is not None and "target_ranked" in order else order[:0]
        )
    return list(order.index)


def pick(comparison: Comparison, rule: str = BEST) -> Pick | None:
    """The setting `rule` picks, or None when no row has a speed figure (every run contended) for a
    rule that needs one. BEST: of the settings whose accuracy is no more than the quality margin
    below the most accurate setting's, the first in fastest_first's order (by time to target where
    the sweep has one and the setting reached it in every run, else by epoch time). SPEED: the first
    of all. ACCURACY: the most accurate, the fastest of equals. The verdict, the parent's model,
    `pipeline register` and the UI's first row all name this one. Whether the first is clearly the
    fastest, or within noise of the next, is lead's to say."""
    t = comparison.table
    if t.empty:
        return None
    if rule == ACCURACY:
        order = t.loc[fastest_first(t, comparison.target)]
        candidates = list(order[order[FINAL_ACCURACY] == t[FINAL_ACCURACY].max()].index)
    else:
        candidates = ranking(comparison, rule)
    if not candidates:
        return None
    chosen = candidates[0]
    row = t.loc[chosen]
    on_target = comparison.target is not None and ranks_on_target(row)
    speed = "time_to_target_s" if on_target else STEADY_EPOCH
    figures = {
        STEADY_EPOCH: float(row[STEADY_EPOCH]),
        FINAL_ACCURACY: float(row[FINAL_ACCURACY]),
        "n": int(row["n"]),
        "timed_runs": int(row["timed_runs"]),
    }
    if speed == "time_to_target_s":
        figures["time_to_target_s"] = float(row["time_to_target_s"])
    return Pick(rule, chosen, comparison.label(row), model_run(comparison, row), speed, figures)


def verdict_order(table: pd.DataFrame, target: str | None, best: Any) -> list[Any]:
    """The one order of settings on every surface (the table, csv and json, the descriptions, the
    view, the report): the best setting first (`best`, pick's index; None where there is none),
    then the rest fastest first (fastest_first), those with no speed figure last."""
    order = list(fastest_first(table, target))
    if best is not None:
        order.remove(best)
        order.insert(0, best)
    return order


def run_order(comparison: Comparison) -> list[str]:
    """Every run of the comparison in the verdict's order (verdict_order, whatever --sort did to the
    table), each setting's runs most accurate first: the best setting's model run is the first."""
    t = comparison.table
    if t.empty:
        return []
    accuracy = comparison.per_run[FINAL_ACCURACY]
    run_ids = t["run_ids"].to_dict()
    best = pick(comparison, BEST)
    ordered = []
    for index in verdict_order(t, comparison.target, best.index if best is not None else None):
        ids = str(run_ids[index]).split(",")
        # Most accurate first (a run without the figure last), the earliest of equals first.
        ordered += sorted(ids, key=lambda r: -accuracy[r] if not math.isnan(accuracy[r]) else math.inf)
    return [str(run_id) for run_id in ordered]


def offered(comparison: Comparison) -> Pick | None:
    """The setting whose model a sweep offers: the best (pick); where every run is contended and no
    speed figure counts, the most accurate, as the verdict then names it. The parent's linked model
    and TAG_BEST_RUN, the UI's "its model" and `pipeline register`'s default rule all take this one."""
    return pick(comparison, BEST) or pick(comparison, ACCURACY)


def model_run(comparison: Comparison, row: pd.Series) -> str:
    """The run whose model stands for a setting: its most accurate run (the earliest of equals)."""
    ids = str(row["run_ids"]).split(",")
    accuracy = comparison.runs.loc[ids, FINAL_ACCURACY].fillna(-math.inf)
    return str(accuracy.idxmax())


def _sorted(table: pd.DataFrame, sort: str) -> pd.DataFrame:
    """`--sort`'s order (higher first for accuracies and speedups), instead of the verdict's."""
    figure = named(sort)
    sort = figure.name if figure is not None else sort
    if sort not in table.columns:
        # The figures people sort by; the settings and every other csv/json column work as well.
        shown = [f.name for f in figures() if f.shown != DATA or f.over == OWN]
        choices = [c for c in (*SUMMARY, *shown, *SPEEDUPS) if c in table.columns]
        raise UserError(
            f"--sort {sort}: no such column; choose a setting or a figure such as {', '.join(choices)} "
            "(`pipeline compare --format csv | head -1` lists every column)"
        )
    higher = figure.higher_is_better if figure is not None else sort in SPEEDUPS
    return table.sort_values(sort, ascending=not higher, kind="stable", na_position="last")


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
        raise UserError(
            f"--versus {versus}: runs that differ only in {key} are one setting; compare on one of {', '.join(keys)}"
        )
    if key not in keys:
        raise UserError(f"--versus {versus}: {key} is not a grid key; grid keys: {', '.join(keys)}")
    column = comparison.table[key]
    present = list(dict.fromkeys(format_value(v) for v in column))
    if len(present) < 2:
        raise UserError(
            f"--versus {versus}: {key} does not vary in this sweep (every run has {key}={present[0]}); "
            f"vary it in the grid, or compare on a key that varies"
        )
    if not _same(column, value).any():
        raise UserError(f"--versus {versus}: no run has {key}={value}; values in this sweep: {', '.join(present)}")
    return key, value


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
    needed = [
        c for c in (*ROW_KEYS, "run_ids", "timed", STEADY_EPOCH, "time_to_target_s", "target_ranked") if c in table
    ]
    # As plain objects first: pandas' Arrow-backed strings are slow to iterate one by one.
    rows = table[needed].astype(object).reset_index().to_dict("records")
    groups: dict[tuple[str, ...], list[Row]] = {}
    for row, key in zip(rows, table[keys].astype(object).astype(str).itertuples(index=False, name=None)):
        groups.setdefault(key, []).append(row)
    for members in groups.values():
        references = [row for row in members if is_reference[row["index"]]]
        others = [row for row in members if not is_reference[row["index"]]]
        if references and others:
            yield references[0], others


def axis_ratios(
    comparison: Comparison, axis: str, reference_value: str, samples: Callable[[pd.Series], list[float]] | None = None
) -> list[tuple[str, stats.Ratio]]:
    """Each row's speedup over its twin that differs only in `axis` and has `reference_value` there
    (a speedup > 1: the row is faster), as (the row's label, its Ratio with the interval); rows with no
    such twin are left out. `samples`: one value per run (default: the timed runs' steady epochs).
    `repeats: auto` stops once every ratio of the grid's axes is clear."""
    samples = samples or comparison.epochs
    found = []
    for reference, others in _twins(comparison, axis, reference_value):
        for row in others:
            ratio = comparison.ratio(samples(reference), samples(row))
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


def _speedups(
    comparison: Comparison,
    axis: str,
    reference_value: str,
    column: str,
    samples: Callable[[pd.Series], list[float]],
    what: str = "epoch time",
) -> list[TwinGroup]:
    """Each row's speedup over its twin row that differs only in `axis`, where that twin has
    `reference_value` (the cpu row for devices, the fp32 row for precisions), with its 95% interval
    over one value per run (stats.ratio), and for a faster row its accuracy against the reference's;
    columns `column` and its INTERVAL_SUFFIXES, QUALITY_SUFFIXES and _vs are added to the table. One
    TwinGroup per group of twins with a speedup (sentences.speedup_lines says each in a line)."""
    table = comparison.table
    size = len(table)
    speedup, low, high = ([math.nan] * size for _ in range(3))
    change, change_low, change_high = ([math.nan] * size for _ in range(3))
    change_identical = [0] * size
    significant: list[bool | None] = [None] * size
    win: list[bool | None] = [None] * size
    versus = [""] * size
    groups = []
    for reference, others in _twins(comparison, axis, reference_value):
        found = []
        for row in others:
            index = row["index"]
            ratio = comparison.ratio(samples(reference), samples(row))
            if math.isnan(ratio.estimate):
                continue
            speedup[index], low[index], high[index] = ratio.estimate, ratio.low, ratio.high
            significant[index], versus[index] = ratio.significant, reference["run_ids"]
            worse = None
            if ratio.estimate > 1:  # faster: a win only if it learnt as well
                accuracy = accuracy_change(comparison, row, reference)
                change[index], change_low[index], change_high[index] = accuracy.estimate, accuracy.low, accuracy.high
                change_identical[index] = accuracy.identical
                worse = accuracy if less_accurate(accuracy.estimate, comparison.quality_margin) else None
                win[index] = bool(ratio.significant) and worse is None
            else:
                win[index] = False
            found.append(TwinSpeedup(row, ratio, worse, len(samples(row))))
        if not found:
            continue
        speedup[reference["index"]] = 1.0
        groups.append(TwinGroup(axis, reference_value, column, what, reference, len(samples(reference)), tuple(found)))
    table[column], table[f"{column}_low"], table[f"{column}_high"] = speedup, low, high
    table[f"{column}_significant"], table[f"{column}_vs"] = significant, versus
    table[f"{column}_accuracy_change"], table[f"{column}_accuracy_change_low"] = change, change_low
    table[f"{column}_accuracy_change_high"], table[f"{column}_win"] = change_high, win
    table[f"{column}_accuracy_change_identical"] = change_identical
    return groups


# --- the first of a ranking, against the rest ----------------------------------------------------

LEAD_CHECKED = 10  # rows a lead tests against the first, down the ranking, before it stops looking


@dataclass(frozen=True)
class Lead:
    """The first setting of a ranking against the next ones, on the figure they rank by, with the
    comparison's test: whether it is clearly the fastest, or which settings are within noise of it."""

    top: Any  # the first row's index
    what: str  # "epoch time", "time to TARGET" where both rank on it, or "reaching TARGET in every run"
    runner_up: Any = None  # the second row's index (None: the ranking has one row)
    ratio: stats.Ratio | None = None  # the runner-up's figure over the top's: > 1, the top is faster
    tied: tuple[Any, ...] = ()  # rows down the ranking not significantly slower than the top, in order

    @property
    def clear(self) -> bool:
        """The top is significantly faster than the runner-up (and so than every row after it)."""
        return self.ratio is not None and bool(self.ratio.significant) and self.ratio.estimate > 1


def lead(comparison: Comparison, ranking: list[Any]) -> Lead | None:
    """How the first of `ranking` (table indexes, fastest first) stands against the rest: its speedup
    over the second, at the comparison's confidence, on time to target where both rank on it, else on
    epoch time; and the rows within noise of it, from the second down until one is significantly
    slower (at most LEAD_CHECKED looked at). Where only the first ranks on the target, it is first by
    reaching it in every run, with no ratio. None for an empty ranking. "The fastest" is said only
    where the lead is clear; otherwise the top and its ties are within noise of each other."""
    if not ranking:
        return None
    table = comparison.table
    top = table.loc[ranking[0]]
    if len(ranking) == 1:
        return Lead(ranking[0], "epoch time")
    top_on_target = comparison.target is not None and ranks_on_target(top)
    if top_on_target and not ranks_on_target(table.loc[ranking[1]]):
        # The only one of the ranking to reach the target in every run: first on that, not on a figure.
        return Lead(ranking[0], f"reaching {comparison.target} in every run", ranking[1])
    tied, first = [], None
    for index in ranking[1 : 1 + LEAD_CHECKED]:
        row = table.loc[index]
        on_target = top_on_target and ranks_on_target(row)
        samples = comparison.to_target if on_target else comparison.epochs
        ratio = comparison.ratio(samples(row), samples(top))
        if first is None:
            first = (index, ratio, f"time to {comparison.target}" if on_target else "epoch time")
        if ratio.significant and ratio.estimate > 1:
            break
        tied.append(index)
    assert first is not None
    return Lead(ranking[0], first[2], first[0], first[1], tuple(tied))
