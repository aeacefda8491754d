"""A regression gate: a sweep's epoch times against a baseline sweep's, point by point.

Each row of the sweep (compare.py: one setting, its repeats aggregated) is paired with the baseline
row that has the same settings (every grid key and the data sizes), device and hardware, and by
default the same host. The change is the ratio of the two rows' per-run epoch times (each run's
median steady epoch; stats.ratio: geometric means, Welch's 95% interval on the logs), minus one.

The gate judges the build, not each point alone: with 18 points each judged at 2.5%, a build with
no real change would fail about a third of the time. Every judged point gets two one-sided Welch
tests on the logs, "slower by more than PCT" (against 1 + PCT/100) and "faster" (against 1), and
Holm's step-down corrects each family across the judged points at 2.5% (ALPHA), so that noise alone
fails a build of any size at most 2.5% of the time (tests/test_calibration.py measures 4 and 18
points). A point that fails is slower than PCT by its own 95% interval too (its lower bound beyond
1 + PCT/100), and by more at the Holm level of its step. Every point gets one state:
- SLOWER: slower by more than `--fail-if-slower PCT` (0 without it), Holm-corrected;
- FASTER: faster, Holm-corrected;
- NO CHANGE: judged, and neither;
- INCONCLUSIVE, with its reason: n too small (fewer than two runs a side), only in the baseline, only
  in this sweep, every run contended on one side, or other hardware.

With `--fail-if-slower` the exit code says it: 0 when every point was judged and none is SLOWER, 1 on
a slowdown, 3 when some point is INCONCLUSIVE and none is SLOWER (`--allow-inconclusive`: 0).

Analysis only: the states and numbers, from two sweeps read by the caller (the baseline:
records.baseline_sweep). The gate's verdict in words is sentences.gate_verdict, its tables (terminal,
markdown, csv, json) tables.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from pipeline.analysis.compare import ROW_KEYS, TWIN_KEYS
from pipeline.errors import UserError
from pipeline.measures import stats
from pipeline.settings.grid import format_value

if TYPE_CHECKING:
    from pipeline.analysis.compare import Comparison
    from pipeline.base.runs import SweepRecord

FASTER, SLOWER, NO_CHANGE, INCONCLUSIVE = "FASTER", "SLOWER", "NO CHANGE", "INCONCLUSIVE"
EXIT_SLOWER, EXIT_INCONCLUSIVE = 1, 3
ONLY_BASELINE, ONLY_CURRENT = "only in the baseline", "only in this sweep"
ALPHA = 0.025  # family-wise, one-sided, each way: a failing point's 95% interval is above +PCT too
CORRECTION = "Holm"


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's adjusted p-values along the last axis: a hypothesis is rejected with family-wise error
    at most alpha where its adjusted p-value is at most alpha. NaN (a point not judged) stays NaN and
    does not count in the family. Many builds at once take one row each (the calibration)."""
    p = np.atleast_2d(np.asarray(p_values, dtype=float))
    judged = ~np.isnan(p)
    family = judged.sum(axis=-1, keepdims=True)
    order = np.argsort(np.where(judged, p, np.inf), axis=-1, kind="stable")
    ascending = np.take_along_axis(p, order, axis=-1)
    step = np.arange(p.shape[-1])
    scaled = np.minimum(1.0, np.maximum(family - step, 1) * ascending)
    adjusted_ascending = np.fmax.accumulate(np.where(np.isnan(scaled), -np.inf, scaled), axis=-1)
    adjusted = np.empty_like(p)
    np.put_along_axis(adjusted, order, adjusted_ascending, axis=-1)
    return np.where(judged, adjusted, np.nan)


def states(slower_p: np.ndarray, faster_p: np.ndarray) -> np.ndarray:
    """Each judged point's state from its one-sided p-values (slower than PCT, faster), Holm-adjusted
    across the points of its build (along the last axis) at ALPHA; NaN p-values are INCONCLUSIVE."""
    slower, faster = holm(slower_p), holm(faster_p)
    found = np.where(faster <= ALPHA, FASTER, NO_CHANGE)
    found = np.where(slower <= ALPHA, SLOWER, found)
    return np.where(np.isnan(slower), INCONCLUSIVE, found)


@dataclass(frozen=True)
class Change:
    """One point of either sweep: its state, and where both sides have it, the change in epoch time."""

    point: str  # its settings, as a row label: "cpu batch_size=128"
    state: str  # FASTER, SLOWER, NO CHANGE or INCONCLUSIVE
    reason: str = ""  # why INCONCLUSIVE
    baseline_s: float = math.nan  # the geometric mean over its timed runs
    current_s: float = math.nan
    ratio: stats.Ratio | None = None  # current / baseline: > 1 is slower
    runs: tuple[int, int] = (0, 0)  # timed runs: this sweep's, the baseline's
    slower_p: float = math.nan  # Holm-adjusted p-value of "slower by more than PCT" (NaN: not judged)

    @property
    def percent(self) -> tuple[float, float, float]:
        """The change and its interval, in percent of the baseline (+ is slower)."""
        if self.ratio is None:
            return math.nan, math.nan, math.nan
        return 100 * (self.ratio.estimate - 1), 100 * (self.ratio.low - 1), 100 * (self.ratio.high - 1)


@dataclass(frozen=True)
class GateResult:
    current: SweepRecord
    baseline: SweepRecord
    changes: list[Change]  # every point of either sweep, this sweep's first
    threshold: float | None  # --fail-if-slower PCT, or None: report only
    allow_inconclusive: bool = False

    @property
    def judged(self) -> int:
        return len(self.changes) - len(self.inconclusive)

    @property
    def correction(self) -> str:
        """The correction in words: "Holm over 18 judged points, 2.5% family-wise"."""
        points = f"{self.judged} judged point{'s' if self.judged != 1 else ''}"
        return f"{CORRECTION} over {points}, {100 * ALPHA:g}% family-wise"

    def in_state(self, state: str) -> list[Change]:
        """The points in `state` (FASTER, SLOWER, NO CHANGE or INCONCLUSIVE)."""
        return [c for c in self.changes if c.state == state]

    @property
    def failing(self) -> list[Change]:
        return self.in_state(SLOWER) if self.threshold is not None else []

    @property
    def inconclusive(self) -> list[Change]:
        return self.in_state(INCONCLUSIVE)

    @property
    def exit_code(self) -> int:
        if self.threshold is None:
            return 0
        if self.failing:
            return EXIT_SLOWER
        return EXIT_INCONCLUSIVE if self.inconclusive and not self.allow_inconclusive else 0


def _keys(across_hosts: bool) -> list[str]:
    return [*ROW_KEYS, *([] if across_hosts else ["host"])]


def _label(row: pd.Series, shown: list[str]) -> str:
    return " ".join([str(row["device"]), *(f"{k}={format_value(row[k])}" for k in shown)])


def _pairing(row: pd.Series, keys: list[str]) -> tuple[str, ...]:
    return tuple(format_value(row[k]) for k in keys)


def check(
    current: Comparison,
    baseline: Comparison,
    threshold: float | None,
    across_hosts: bool = False,
    allow_inconclusive: bool = False,
) -> GateResult:
    """Pair `current`'s rows with `baseline`'s and judge each point (judge), naming the points only
    one side has. Raises UserError when the baseline ran on other hardware altogether, or when no
    point pairs (naming the settings each side has)."""
    ours, theirs = current.table, baseline.table
    hardware, base_hardware = set(ours["hardware"]), set(theirs["hardware"])
    if not hardware & base_hardware:
        raise UserError(
            f"--baseline {baseline.sweep.name}: it ran on {', '.join(sorted(base_hardware))}, this sweep "
            f"on {', '.join(sorted(hardware))}; a baseline from other hardware is refused"
        )
    keys = _keys(across_hosts)
    settings = [k for k in keys if k not in ("hardware", "host")]
    shown = [k for k in TWIN_KEYS if pd.concat([ours[k], theirs[k]]).map(format_value).nunique() > 1]
    base_rows = {_pairing(row, keys): row for _, row in theirs.iterrows()}
    base_settings = {_pairing(row, settings): row for _, row in theirs.iterrows()}
    changes, paired = [], set()
    for _, row in ours.iterrows():
        label = _label(row, shown)
        twin = base_rows.get(_pairing(row, keys))
        if twin is None:
            other = base_settings.get(_pairing(row, settings))
            changes.append(Change(label, INCONCLUSIVE, _unpaired(row, other)))
            continue
        paired.add(_pairing(twin, keys))
        changes.append(_change(label, current, row, baseline, twin))
    if not paired:
        raise UserError(_no_pairs(current, baseline, shown, across_hosts))
    for _, row in theirs.iterrows():
        if _pairing(row, keys) not in paired:
            changes.append(Change(_label(row, shown), INCONCLUSIVE, ONLY_BASELINE))
    return GateResult(current.sweep, baseline.sweep, _judged(changes, threshold), threshold, allow_inconclusive)


def _judged(changes: list[Change], threshold: float | None) -> list[Change]:
    """The points with a change and an interval, judged together (states); INCONCLUSIVE where a ratio
    has no interval (n too small), with the reason."""
    bound = 1 + (threshold or 0.0) / 100
    slower = np.array([c.ratio.p_above(bound) if c.ratio and c.ratio.has_interval else math.nan for c in changes])
    faster = np.array([c.ratio.p_below(1.0) if c.ratio and c.ratio.has_interval else math.nan for c in changes])
    found = states(slower, faster)[0] if changes else []
    adjusted = holm(slower)[0] if changes else []
    judged = []
    for change, state, p in zip(changes, found, adjusted):
        if change.ratio is not None and not change.ratio.has_interval:
            judged.append(replace(change, state=INCONCLUSIVE, reason=change.ratio.why_no_interval))
        elif change.ratio is not None:
            judged.append(replace(change, state=str(state), slower_p=float(p)))
        else:
            judged.append(change)
    return judged


def _change(label: str, current: Comparison, row: pd.Series, baseline: Comparison, twin: pd.Series) -> Change:
    """A paired point judged: its change, or INCONCLUSIVE where one side has no timed run left."""
    mine, base = current.epochs(row), baseline.epochs(twin)
    # The geometric means the change is the ratio of.
    baseline_s, current_s = stats.geometric_mean(base), stats.geometric_mean(mine)
    runs = (len(mine), len(base))
    if not mine or not base:
        side = "this sweep" if not mine else "the baseline"
        return Change(
            label,
            INCONCLUSIVE,
            f"every run contended in {side} (--include-contended counts them)",
            baseline_s,
            current_s,
            runs=runs,
        )
    # NO CHANGE until the points are judged together (_judged).
    return Change(label, NO_CHANGE, "", baseline_s, current_s, stats.ratio(mine, base), runs)


def _unpaired(row: pd.Series, same_settings: pd.Series | None) -> str:
    """Why a point of this sweep has no baseline twin: the settings are missing there, or they ran on
    other hardware or another host."""
    if same_settings is None:
        return ONLY_CURRENT
    if same_settings["hardware"] != row["hardware"]:
        return f"other hardware (the baseline's ran on {same_settings['hardware']})"
    return f"another host (the baseline's ran on {same_settings['host'] or '?'}; --across-hosts pairs them)"


def _no_pairs(current: Comparison, baseline: Comparison, shown: list[str], across_hosts: bool) -> str:
    def points(comparison: Comparison) -> str:
        labels = list(
            dict.fromkeys(
                _label(row, shown) + ("" if across_hosts else f" on {row['host'] or '?'}")
                for _, row in comparison.table.iterrows()
            )
        )
        return ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")

    hint = "" if across_hosts else "; --across-hosts pairs points from other hosts"
    return (
        f"--baseline {baseline.sweep.name}: no point has the same settings, device and hardware"
        f"{'' if across_hosts else ' and host'} on both sides; this sweep has {points(current)}; "
        f"the baseline has {points(baseline)}{hint}"
    )


def frame(result: GateResult) -> pd.DataFrame:
    """The points as data (csv, json): state and reason, medians, the change in percent, its interval, runs."""
    rows = []
    for c in result.changes:
        change, low, high = c.percent
        rows.append(
            {
                "point": c.point,
                "state": c.state,
                "reason": c.reason,
                "baseline_epoch_s": c.baseline_s,
                "epoch_s": c.current_s,
                "change_pct": change,
                "change_pct_low": low,
                "change_pct_high": high,
                "significant": c.ratio.significant if c.ratio is not None else None,
                "slower_p_holm": c.slower_p,
                "runs": c.runs[0],
                "baseline_runs": c.runs[1],
                "fails": c in result.failing,
            }
        )
    return pd.DataFrame(rows)
