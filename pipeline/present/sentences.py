"""What a comparison says in words: the verdict (the best setting and why, each speedup with its
interval and significance), each setting's part of it, the speedup lines and the notes; and the
regression gate's verdict. Presentation: it reads compare.py's and gate.py's results and computes
nothing they do not hold (tables.py lays the same figures out as tables).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pandas as pd

from pipeline.analysis.compare import (
    ACCURACY,
    BEST,
    ROW_KEYS,
    SPEED,
    TARGET,
    TARGET_SPEEDUP,
    TWIN_AXES,
    VERSUS,
    Comparison,
    Lead,
    Pick,
    Row,
    lead,
    less_accurate,
    pick,
    ranking,
)
from pipeline.analysis.gate import FASTER, INCONCLUSIVE, NO_CHANGE, SLOWER, Change, GateResult
from pipeline.analysis.rounds import ALL_CLEAR, MAX_REPEATS, NOTHING_TO_JUDGE, Judgement, Speedup, decide
from pipeline.base.names import FINAL_ACCURACY, OTHERS_CPU_SHARE, STEADY_EPOCH
from pipeline.base.runs import SweepRecord
from pipeline.measures import stats
from pipeline.settings.config import KEYS, GridSpec
from pipeline.settings.grid import format_value, short


def speedup_lines(comparison: Comparison) -> list[str]:
    """One line per group of twins with a speedup (Comparison.twin_groups), in the order they were
    found: "batch_size=64: cuda:0 1.95x faster [1.90-2.00] (0.513 s/epoch, 4 runs) vs cpu (1.000
    s/epoch, 4 runs); each run's median epoch time, timed on epochs 2-3". The group is named by the
    reference's settings that vary in the sweep, but for its own axis and the hardware."""
    table = comparison.table
    lines = []
    for group in comparison.twin_groups:
        axis = group.axis
        varying = [k for k in ROW_KEYS if k in table and k not in (axis, "hardware") and table[k].nunique() > 1]
        label = " ".join(f"{k}={format_value(group.reference[k])}" for k in varying) or "all settings equal"
        parts = [
            f"{_value(axis, s.row[axis])} "
            f"{verdict(s.ratio.estimate, s.ratio.low, s.ratio.high, worse=s.worse, runs=s.ratio.runs)} "
            f"({_figure(s.row, s.runs, group.what)})"
            for s in group.speedups
        ]
        lines.append(
            f"{label}: {', '.join(parts)} vs {_value(axis, group.reference_value)} "
            f"({_figure(group.reference, group.reference_runs, group.what)}); "
            f"{_basis(group.reference, group.what)}"
        )
    return lines


def _figure(row: Row, runs: int, what: str) -> str:
    """A row's figure in a speedup line, as its table cell shows it (the median over its runs), and
    how many runs the speedup counts."""
    figure = f"{row[STEADY_EPOCH]:.3f} s/epoch" if what == "epoch time" else f"{row['time_to_target_s']:.3f} s"
    return f"{figure}, {runs} run{'s' if runs != 1 else ''}"


def _basis(reference: Row, what: str) -> str:
    if what == "epoch time":
        return f"each run's median epoch time, timed on {reference['timed']}"
    return f"{what} of the runs that reached it"


def _value(axis: str, value: Any) -> str:
    """A twin axis's value as a speedup line names it: cuda, bf16, compile=true, num_workers=0."""
    return str(value) if axis in KEYS and KEYS[axis].name == "" else f"{axis}={format_value(value)}"


def verdict(
    estimate: float,
    low: float,
    high: float,
    compact: bool = False,
    worse: stats.Difference | None = None,
    runs: tuple[int, int] | None = None,
    significance: bool = False,
) -> str:
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
            shortfall += (
                f"\n{-worse.high:.4f}-{-worse.low:.4f}" if compact else f" [{-worse.high:.4f}-{-worse.low:.4f}]"
            )
        elif worse.identical and not compact:
            shortfall += f" ({worse.why_no_interval})"
        text += f"\nless accurate by {shortfall}" if compact else f", but less accurate by {shortfall}"
    return text


def headline(comparison: Comparison) -> list[str]:
    """The answer first, in a few plain lines: the best setting by the one rule (pick) and the run
    whose model stands for it, "the fastest" only where its lead over the next is significant (lead;
    else which settings it is within noise of); the first on speed where it is another, less
    accurate setting, with its speedup over the best; the most accurate where it is another; the
    first to the target among settings that reached it in every run; each axis's speedup with its
    interval (device, precision, compile, --versus). Every claim takes the estimate and the test the
    speedups take. Where every run is contended, the speed claims are withheld and the lines say why.
    The sweep's end, `pipeline compare` and the parent run's description all open with these lines."""
    t = comparison.table
    if t.empty:
        return []
    lines = []
    withheld = withheld_line(comparison)
    if withheld:
        lines += withheld
    best, fastest, accurate = (pick(comparison, rule) for rule in (BEST, SPEED, ACCURACY))
    if best is not None:
        lines.append(f"Best: {pick_words(best)}" + _best_is(comparison, best, fastest, accurate))
    if fastest is not None and best is not None and fastest.index != best.index:
        over_best = comparison.ratio(comparison.epochs(t.loc[best.index]), comparison.epochs(t.loc[fastest.index]))
        said = verdict(over_best.estimate, over_best.low, over_best.high, runs=over_best.runs, significance=True)
        lines.append(
            f"First on speed: {fastest.label} ({_figures(t.loc[fastest.index])}): over the best, {said}; but "
            f"less accurate than the most accurate by more than {comparison.quality_margin:g}"
        )
    if accurate is not None and (best is None or accurate.index != best.index):
        lines.append(f"Most accurate: {accurate.label} ({_figures(t.loc[accurate.index], accuracy_first=True)})")
    if comparison.target is not None and "target_runs" in t:
        lines += _target_lines(comparison)
    for axis, reference, column, what in _axes(comparison):
        lines += _axis_lines(comparison, axis, reference, column, what)
    return lines


def short_verdict(comparison: Comparison) -> str:
    """The verdict whole in one short line, for where one line is all a reader sees (the MLflow UI
    shows an experiment's description folded to its first line): the best setting and its main
    claim held to the speedups' test ("Best: cpu bs128: fastest, 1.52x [1.40-1.65] over cpu bs64",
    "Best: cpu bs128: within noise of cpu bs64 (1.02x, n.s.)"), "under load" where contended runs were counted
    (--include-contended), and "partial" for a sweep still running. Where every run is contended,
    the most accurate setting, its speed withheld ("Most accurate: cpu bs32 (test acc 0.6914, speed
    withheld: 2 of 2 runs contended)"). The headline's lines say the same at length."""
    t = comparison.table
    if t.empty:
        return ""
    best, fastest, accurate = (pick(comparison, rule) for rule in (BEST, SPEED, ACCURACY))
    runs = comparison.runs
    contended = f"{int(runs['contended'].sum())} of {len(runs)} runs contended"
    if best is not None:
        said = f"Best: {best.label}"  # its figures are the view's first row, right below
        claim = _brief_claim(comparison, best, fastest, accurate)
        said += f": {claim}" if claim else ""
        if comparison.include_contended and runs["contended"].any():
            said += f"; under load ({contended}, counted)"
    elif accurate is not None:  # every run contended, none counted: no speed claim
        accuracy = t.loc[accurate.index, FINAL_ACCURACY]
        said = f"Most accurate: {accurate.label} (test acc {accuracy:.4f}, speed withheld: {contended})"
    else:
        return ""
    if comparison.sweep.partial:
        said += f"; partial: {_finished_of(comparison.sweep)}"
    return said


def _brief_claim(comparison: Comparison, best: Pick, fastest: Pick | None, accurate: Pick | None) -> str:
    """_best_is in a few words, the same test behind it: "fastest, 1.52x [1.40-1.65] over cpu bs64",
    "within noise of cpu bs64 (1.02x, n.s.)", "not yet told from cpu bs64 (n too small)", "most
    accurate; cpu bs256 is faster, less accurate"."""
    if len(comparison.table) == 1:
        return ""
    is_fastest = fastest is not None and fastest.index == best.index
    is_accurate = accurate is not None and accurate.index == best.index
    if is_accurate and not is_fastest:
        return f"most accurate; {fastest.label} is faster, less accurate" if fastest is not None else "most accurate"
    rule = SPEED if is_fastest else BEST
    found = lead(comparison, ranking(comparison, rule))
    prefix = "" if is_fastest else f"fastest within {comparison.quality_margin:g} acc of the most accurate, "
    if found is None or found.runner_up is None:
        said = (prefix or "fastest, ").removesuffix(", ")
    elif found.ratio is None:
        said = f"{prefix}first, the only one to reach {comparison.target} in every run"
    else:
        ratio, next_one = found.ratio, comparison.label(comparison.table.loc[found.runner_up])
        if found.clear:
            said = f"{prefix or 'fastest, '}{ratio.estimate:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}] over {next_one}"
        elif not ratio.has_interval:
            said = f"{prefix}not yet told from {next_one} (n too small)"
        else:
            said = f"{prefix}within noise of {next_one} ({ratio.estimate:.2f}x, n.s.)"
    return f"{said}; most accurate" if is_fastest and is_accurate else said


def claims(comparison: Comparison) -> list[str]:
    """Each setting's part of the verdict, one text per row of the table: which of its picks the
    setting is (best; fastest where its lead is significant, else first on speed within noise; most
    accurate) and each speedup it has over its reference twin, in the verdict's words with its
    significance ("bf16 vs fp32, epoch time: 1.52x faster [1.40-1.65] (significant)"). The UI's view
    shows it beside each setting's figures (names.TAG_VERDICT)."""
    t = comparison.table
    said: dict[Any, list[str]] = {index: [] for index in t.index}
    speed = lead(comparison, ranking(comparison, SPEED))
    for rule, word in ((BEST, "best"), (SPEED, "fastest"), (ACCURACY, "most accurate")):
        chosen = pick(comparison, rule)
        if chosen is None:
            continue
        if rule == SPEED and speed is not None and not speed.clear:
            word = "first on speed, " + ("within noise of the next" if speed.runner_up is not None else "alone")
        said[chosen.index].append(word)
    for axis, reference, column, what in _axes(comparison):
        if column not in t:
            continue
        for index, row in t[t[column].notna() & (t[f"{column}_vs"] != "")].iterrows():
            said[index].append(
                f"{_value(axis, row[axis])} vs {_value(axis, reference)}, {what}: "
                f"{cell(comparison, row, column, significance=True)}"
            )
    return ["; ".join(parts) for parts in said.values()]


def _best_is(comparison: Comparison, best: Pick, fastest: Pick | None, accurate: Pick | None) -> str:
    """Why the best is the best, in words, each speed claim held to the speedups' test (lead): ":
    the fastest (1.52x [1.40-1.65] over cpu bs64), and the most accurate"; ": first on epoch time,
    within noise of cpu bs64 (1.02x faster [0.95-1.09] (n.s.)), within 0.005 test acc of the most
    accurate"; ": the most accurate (every faster setting is less accurate by more than the margin)"."""
    if len(comparison.table) == 1:
        return ""
    is_fastest = fastest is not None and fastest.index == best.index
    is_accurate = accurate is not None and accurate.index == best.index
    within = f"within {comparison.quality_margin:g} test acc of the most accurate"
    if is_accurate and not is_fastest:
        return ": the most accurate (every faster setting is less accurate by more than the margin)"
    if is_fastest:
        speed = _speed_claim(comparison, lead(comparison, ranking(comparison, SPEED)), "the fastest")
        return f": {speed}, and the most accurate" if is_accurate else f": {speed}, {within}"
    return ": " + _speed_claim(comparison, lead(comparison, ranking(comparison, BEST)), f"the fastest {within}")


def _speed_claim(comparison: Comparison, found: Lead | None, fastest: str) -> str:
    """A ranking's first in words: `fastest` with its lead over the next where that is significant
    ("the fastest (1.52x [1.40-1.65] over cpu bs64)"); else first on the figure it ranks by, and
    which settings it is within noise of, or that the runs are too few to tell."""
    if found is None or found.runner_up is None:
        return fastest
    if found.ratio is None:
        return f"first, as the only one to reach {comparison.target} in every run"
    t = comparison.table
    ratio, next_one = found.ratio, comparison.label(t.loc[found.runner_up])
    if found.clear:
        return f"{fastest} ({ratio.estimate:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}] over {next_one})"
    first = f"first on {found.what}"
    if not ratio.has_interval:
        return f"{first}, not yet told from {next_one}: {ratio.why_no_interval}"
    tied = [comparison.label(t.loc[index]) for index in found.tied]
    names = ", ".join(tied[:3]) + (f" and {len(tied) - 3} more" if len(tied) > 3 else "")
    said = verdict(ratio.estimate, ratio.low, ratio.high, runs=ratio.runs)
    return f"{first}, within noise of {names} (over {next_one}: {said})"


def withheld_line(comparison: Comparison) -> list[str]:
    """Where every run is contended and not counted: why no speed claim is made, and what to do."""
    runs = comparison.runs
    if comparison.include_contended or runs.empty or not runs["contended"].all():
        return []
    share = runs[OTHERS_CPU_SHARE].median()
    took = f" (others took {100 * share:.0f}% of the cores)" if not math.isnan(share) else ""
    return [
        f"Speed withheld: {len(runs)} of {len(runs)} runs contended{took}",
        "Rerun on a quiet machine, or pass --include-contended to count them",
    ]


def _target_lines(comparison: Comparison) -> list[str]:
    """The first to the target among the settings that reached it in every run, held to the
    speedups' test against the next, and the settings that reached it in only some of their runs."""
    t = comparison.table
    ranked = ranking(comparison, TARGET)
    timed = t[t["target_runs"] > 0]
    lines = []
    if ranked:
        first = t.loc[ranked[0]]
        found = lead(comparison, ranked)
        claim = (
            "" if found is None or found.runner_up is None else ": " + _speed_claim(comparison, found, "clearly first")
        )
        lines.append(
            f"First to {comparison.target}: {comparison.label(first)} in {first['time_to_target_s']:.2f} s "
            f"({first['target_reached']}/{first['target_runs']} runs){claim}"
        )
    elif len(timed):
        lines.append(f"No setting reached {comparison.target} in every run")
    some = timed[(timed["target_reached"] > 0) & ~timed["target_ranked"]]
    if len(some):
        names = ", ".join(
            f"{comparison.label(row)} ({row['target_reached']} of {row['target_runs']})"
            for _, row in some.head(5).iterrows()
        )
        lines.append(
            f"Reached {comparison.target} in only some of their runs (ranked by epoch time instead): {names}"
            + (f" and {len(some) - 5} more" if len(some) > 5 else "")
        )
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
            lines.append(
                f"{head}: from {said[0]} ({_where(comparison, low, axis)}) to {said[-1]} "
                f"({_where(comparison, high, axis)}), over {len(group)} settings"
            )
    return lines


def cell(comparison: Comparison, row: pd.Series, column: str, compact: bool = False, significance: bool = False) -> str:
    """A row's speedup in `column` in words (verdict), with its runs and its accuracy shortfall."""
    change = row.get(f"{column}_accuracy_change", math.nan)
    worse = None
    if not math.isnan(change):
        worse = stats.Difference(
            change,
            row[f"{column}_accuracy_change_low"],
            row[f"{column}_accuracy_change_high"],
            identical=int(row.get(f"{column}_accuracy_change_identical", 0) or 0),
        )
        worse = worse if less_accurate(change, comparison.quality_margin) else None
    runs = None
    if row.get(f"{column}_vs"):
        # The reference's runs: its run ids are in `_vs`; it ranked on the target, or there would be no speedup.
        samples = comparison.to_target if column == TARGET_SPEEDUP else comparison.epochs
        runs = (len(samples({"run_ids": row[f"{column}_vs"], "target_ranked": True})), len(samples(row)))
    return verdict(row[column], row[f"{column}_low"], row[f"{column}_high"], compact, worse, runs, significance)


def _where(comparison: Comparison, row: pd.Series, axis: str) -> str:
    """The settings that place a speedup, but for its own axis: "bs128 w0"."""
    devices = [str(row["device"])] if axis != "device" and comparison.table["device"].nunique() > 1 else []
    return " ".join(devices + [short(k, row[k]) for k in comparison.varying if k != axis and k in KEYS])


def _names(names: pd.Series, total: int, limit: int = 5) -> str:
    """Run names for a note: all of them up to `limit`, else the first few and a count."""
    names = list(names)
    if len(names) == total and total > 1:
        return f"all {total}"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _coverage(sweep: SweepRecord) -> list[str]:
    """Which runs the comparison covers: a sweep still running, or one that ended before its grid
    did, says how many of its runs finished; DONE runs say which earlier sweep trained them."""
    said, finished = [], len(sweep.children)
    if sweep.partial:
        said.append(f"partial: {_finished_of(sweep)}; the sweep is still running, and this verdict covers those")
    elif sweep.planned and finished < sweep.planned and sweep.status in ("FAILED", "KILLED"):
        said.append(
            f"{finished} of {sweep.planned} runs finished: the sweep ended {sweep.status}; running its grid again "
            "trains only the rest, and that sweep's verdict covers them all"
        )
    earlier = Counter(run.parent_run_id for run in sweep.from_earlier())
    if earlier:
        sources = "; ".join(f"{count} from {_source(sweep, parent)}" for parent, count in earlier.items())
        said.append(
            f"{sum(earlier.values())} of {finished} runs are DONE points trained before (same settings, data, host "
            f"and hardware), counted here and not trained again: {sources}"
        )
    return said


def _finished_of(sweep: SweepRecord) -> str:
    """ "3 of 8 runs finished" (of the runs its grid plans, where the parent says)."""
    of = f" of {sweep.planned}" if sweep.planned else ""
    return f"{len(sweep.children)}{of} runs finished"


def _source(sweep: SweepRecord, parent: str) -> str:
    """Where a DONE run came from: "sweep 'grid 2026-12-05 10:00' (1a2b3c4d)", or `pipeline train`."""
    if not parent:
        return "`pipeline train` (no sweep)"
    name = sweep.earlier.get(parent)
    return f"sweep {name!r} ({parent[:8]})" if name and name != parent[:8] else f"sweep {parent[:8]}"


def notes(comparison: Comparison) -> list[str]:
    """Why a figure is missing or which runs were left out: energy, untargeted and contended runs.
    Settings are named in the sweep's run order, whichever way the table is sorted."""
    table, runs, notes = _in_run_order(comparison), comparison.runs, []
    notes += _coverage(comparison.sweep)
    if comparison.rounds is not None:
        reached, most = comparison.rounds
        notes.append(
            f"repeats: auto, round {reached} of at most {most}: every interval is the sequential design's "
            f"repeated 95% interval, {100 * comparison.confidence:.1f}% at this round, so that the 95% holds "
            "whichever round the sweep stopped at"
        )
    if table["energy_j"].isna().any():
        for source, group in table[table["energy_j"].isna()].groupby("energy_source", sort=False):
            where = "every row" if len(group) == len(table) else ", ".join(group["run_name"])
            notes.append(f"energy of {where}: {source}")
    if comparison.target is not None and runs["target"].isna().any():
        untargeted = runs[runs["target"].isna()]
        notes.append(
            f"{_names(untargeted['run_name'], len(runs))} of {len(runs)} runs were trained without the "
            f'target ({comparison.target}): no time to target ("-"); `pipeline run GRID --rerun` times them'
        )
    contended = runs[runs["contended"]]
    if len(contended):
        figures = "; ".join(
            f"{name}: {detail}" for name, detail in zip(contended["run_name"][:5], contended["contended_detail"][:5])
        )
        if len(contended) > 5:
            figures += f"; and {len(contended) - 5} more"
        if comparison.include_contended:
            notes.append(
                f"{len(contended)} contended run(s) counted in the speed figures (--include-contended): {figures}"
            )
        else:
            notes.append(
                f"{len(contended)} of {len(runs)} runs contended (other processes took the cores), left out "
                f"of every speed figure, ranking, speedup and the best setting: {figures}; "
                "--include-contended counts them"
            )
    return notes


def _in_run_order(comparison: Comparison) -> pd.DataFrame:
    """The table's rows in the order of their first runs in the sweep (the order compare.build found
    the settings in), whichever way --sort or the target ordered the table."""
    table = comparison.table
    if table.empty:
        return table
    position = {run_id: place for place, run_id in enumerate(comparison.runs.index)}
    first = table["run_ids"].map(lambda ids: position[str(ids).split(",")[0]])
    return table.loc[first.sort_values(kind="stable").index]


# --- the pick and the gate in words -----------------------------------------------------------------


def pick_words(chosen: Pick) -> str:
    """ "cpu bs128 (0.412 s/epoch, test acc 0.8123, 3 runs; model from run 1a2b3c4d)"; "2 of 3 runs
    timed" where contended runs were left out of the speed figure."""
    runs, timed = int(chosen.figures["n"]), int(chosen.figures["timed_runs"])
    counted = f"{runs} run{'s' if runs != 1 else ''}" if timed == runs else f"{timed} of {runs} runs timed"
    return f"{chosen.label} ({pick_figures(chosen)}, {counted}; model from run {chosen.run_id[:8]})"


def pick_figures(chosen: Pick) -> str:
    """What it won on: "0.412 s/epoch, test acc 0.8123" ("1.19 s to target, ..." by time to target;
    "speed withheld, ..." where no run of it was timed, as when `--by accuracy` picks among
    contended runs)."""
    speed = chosen.figures.get(chosen.speed, math.nan)
    if math.isnan(speed):
        time = "speed withheld"
    elif chosen.speed == "time_to_target_s":
        time = f"{speed:.2f} s to target"
    else:
        time = f"{speed:.3f} s/epoch"
    return f"{time}, test acc {chosen.figures[FINAL_ACCURACY]:.4f}"


def change_words(change: Change) -> str:
    """A gate point's change: "+12.4% slower [+8.1%, +16.9%]", "-3.0% faster [-5.2%, +0.9%] (n.s.)",
    "+80.0% slower (n too small (1 run))", or the reason a point has no change to tell ("only in the
    baseline")."""
    percent, low, high = change.percent
    ratio = change.ratio
    if ratio is None or math.isnan(percent):
        return change.reason
    text = f"{percent:+.1f}% {'slower' if percent > 0 else 'faster'}"
    if not ratio.has_interval:
        return f"{text} ({ratio.why_no_interval})"
    return f"{text} [{low:+.1f}%, {high:+.1f}%]" + ("" if ratio.significant else " (n.s.)")


def gate_verdict(result: GateResult) -> str:
    """The gate's verdict in a line: FAIL naming the slower points, INCONCLUSIVE naming the points not
    judged, or PASS; without --fail-if-slower, the count of each state."""
    counts = ", ".join(
        f"{len(result.in_state(state))} {state}"
        for state in (SLOWER, FASTER, NO_CHANGE, INCONCLUSIVE)
        if result.in_state(state)
    )
    judged, correction = result.judged, f"({result.correction})"
    if result.threshold is None:
        return f"{counts} {correction}; no --fail-if-slower, so the gate does not fail"
    if result.failing:
        names = ", ".join(c.point for c in result.failing)
        unjudged = f"; {_unjudged(result)}" if result.inconclusive else ""
        return (
            f"FAIL: {len(result.failing)} of {judged} judged points slower by more than {result.threshold:g}% "
            f"{correction}: {names}{unjudged}"
        )
    if result.inconclusive:
        head = "PASS (--allow-inconclusive)" if result.allow_inconclusive else "INCONCLUSIVE"
        return (
            f"{head}: {_unjudged(result)}; none of the {judged} judged is slower by more than "
            f"{result.threshold:g}% {correction}"
        )
    return (
        f"PASS: none of the {judged} points is slower by more than {result.threshold:g}% "
        f"({counts}; {result.correction})"
    )


def _unjudged(result: GateResult) -> str:
    """ "1 of 3 points not judged (cpu batch_size=512: only in the baseline)"."""
    reasons = "; ".join(f"{c.point}: {c.reason}" for c in result.inconclusive[:5])
    more = f"; and {len(result.inconclusive) - 5} more" if len(result.inconclusive) > 5 else ""
    return f"{len(result.inconclusive)} of {len(result.changes)} points not judged ({reasons}{more})"


# --- repeats: auto in words (rounds.py decides) -----------------------------------------------------

ROUNDS_SHOWN = 3  # unclear speedups a line names; it counts the rest


def round_speedup(speedup: Speedup) -> str:
    """ "cuda:0 bs128 vs cpu: 1.95x faster [1.90-2.00] ±2.6%" (the ± only with a half-width target);
    "cpu seed1 vs seed0: no difference found within 3 runs a side, 1.01x faster [0.95-1.07] (n.s.)"
    where the design's futility rule settled it."""
    ratio = speedup.ratio
    said = verdict(ratio.estimate, ratio.low, ratio.high, runs=ratio.runs)
    if speedup.no_difference:
        said = f"no difference found within {_runs_a_side(ratio.runs)}, {said}"
    shown = speedup.half_width is not None and ratio.has_interval
    return f"{speedup.label}: {said}" + (f" ±{100 * ratio.half_width:.1f}%" if shown else "")


def _runs_a_side(runs: tuple[int, int]) -> str:
    fewer, more = sorted(runs)
    return f"{fewer} runs a side" if fewer == more else f"{runs[0]} runs vs {runs[1]}"


def stop_reason(judgement: Judgement, rounds: int, spec: GridSpec) -> str:
    """Why a `repeats: auto` sweep stops after `rounds` rounds (rounds.decide), or '' to train another:
    every speedup significant ("every speedup is significant (...)"), or settled some other way, each
    named with how ("every speedup is settled (...: no difference found within 3 runs a side, ...)");
    max_repeats, with the speedups in which no difference was found; or nothing to judge."""
    decision = decide(judgement, rounds, spec)
    if decision == NOTHING_TO_JUDGE:
        return judgement.why_none
    named = _round_named(list(judgement.speedups))
    if decision == ALL_CLEAR:
        if all(s.ratio.significant for s in judgement.speedups):
            return f"every speedup is significant ({named})"
        if spec.half_width is not None and not any(s.no_difference for s in judgement.speedups):
            return f"every speedup is significant or within ±{100 * spec.half_width:g}% ({named})"
        return f"every speedup is settled ({named})"
    if decision == MAX_REPEATS:
        unclear = judgement.unclear
        count = f"{len(unclear)} speedup{'s' if len(unclear) != 1 else ''}"
        return f"max_repeats {spec.most_repeats} reached; no difference found in {count}: {_round_named(unclear)}"
    return ""


def rounds_stopped(rounds: int, reason: str) -> str:
    """The line that ends a `repeats: auto` sweep (and its parent's names.TAG_REPEATS_STOPPED)."""
    return f"repeats: auto stopped after {rounds} round{'s' if rounds != 1 else ''}: {reason}"


def round_progress(judgement: Judgement, rounds: int, spec: GridSpec) -> str:
    """The line between rounds: what is still unclear after round `rounds`, and the next round."""
    return (
        f"repeats: auto, round {rounds} of at most {spec.most_repeats}: {_still_unclear(judgement.unclear)}; "
        f"training round {rounds + 1}"
    )


def _still_unclear(unclear: list[Speedup]) -> str:
    return f"{len(unclear)} speedup{'s' if len(unclear) != 1 else ''} still unclear: {_round_named(unclear)}"


def _round_named(speedups: list[Speedup]) -> str:
    """The first ROUNDS_SHOWN speedups in words, and how many more there are."""
    more = len(speedups) - ROUNDS_SHOWN
    return "; ".join(round_speedup(s) for s in speedups[:ROUNDS_SHOWN]) + (f"; and {more} more" if more > 0 else "")
