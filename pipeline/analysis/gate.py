"""A regression gate: a sweep's epoch times against a baseline sweep's, point by point.

Each row of the sweep (compare.py: one setting, its repeats aggregated) is paired with the baseline
row that has the same settings (every grid key and the data sizes), device and hardware, and by
default the same host. The change is the ratio of the two rows' per-run epoch times (each run's
median steady epoch; stats.ratio: geometric means, Welch's 95% interval on the logs), minus one.

Every point gets one state:
- SLOWER: slower by more than `--fail-if-slower PCT` (0 without it), with its interval above no change;
- FASTER: its interval lies below no change;
- NO CHANGE: judged, and neither (within PCT, or the interval includes no change);
- INCONCLUSIVE, with its reason: n too small (fewer than two runs a side), only in the baseline, only
  in this sweep, every run contended on one side, or other hardware.

With `--fail-if-slower` the exit code says it: 0 when every point was judged and none is SLOWER, 1 on
a slowdown, 3 when some point is INCONCLUSIVE and none is SLOWER (`--allow-inconclusive`: 0). Noise
alone fails a build in at most 2.5% of A/A pairs (tests/test_calibration.py measures it).

Analysis only: the states and numbers, from two sweeps read by the caller (the baseline:
records.baseline_sweep). The gate's verdict in words is sentences.gate_verdict, its tables (terminal,
markdown, csv, json) tables.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


def judge(ratio: stats.Ratio, threshold: float | None) -> tuple[str, str]:
    """A point's state from its ratio (current / baseline: > 1 is slower) and its reason where the
    ratio cannot be judged. SLOWER needs the change beyond `threshold` percent (0 when None) and the
    interval above no change; FASTER the interval below it."""
    if not ratio.has_interval:
        return INCONCLUSIVE, ratio.why_no_interval
    if 100 * (ratio.estimate - 1) > (threshold or 0.0) and ratio.low > 1:
        return SLOWER, ""
    if ratio.high < 1:
        return FASTER, ""
    return NO_CHANGE, ""


@dataclass(frozen=True)
class Change:
    """One point of either sweep: its state, and where both sides have it, the change in epoch time."""

    point: str  # its settings, as a row label: "cpu batch_size=128"
    state: str  # FASTER, SLOWER, NO CHANGE or INCONCLUSIVE
    reason: str = ""  # why INCONCLUSIVE
    baseline_s: float = math.nan  # the median over its timed runs
    current_s: float = math.nan
    ratio: stats.Ratio | None = None  # current / baseline: > 1 is slower
    runs: tuple[int, int] = (0, 0)  # timed runs: this sweep's, the baseline's

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


def _median(values: list[float]) -> float:
    return stats.quartiles(values)[1]


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
        changes.append(_change(label, current, row, baseline, twin, threshold))
    if not paired:
        raise UserError(_no_pairs(current, baseline, shown, across_hosts))
    for _, row in theirs.iterrows():
        if _pairing(row, keys) not in paired:
            changes.append(Change(_label(row, shown), INCONCLUSIVE, ONLY_BASELINE))
    return GateResult(current.sweep, baseline.sweep, changes, threshold, allow_inconclusive)


def _change(
    label: str, current: Comparison, row: pd.Series, baseline: Comparison, twin: pd.Series, threshold: float | None
) -> Change:
    """A paired point judged: its change, or INCONCLUSIVE where one side has no timed run left."""
    mine, base = current.epochs(row), baseline.epochs(twin)
    baseline_s, current_s, runs = _median(base), _median(mine), (len(mine), len(base))
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
    ratio = stats.ratio(mine, base)
    state, reason = judge(ratio, threshold)
    return Change(label, state, reason, baseline_s, current_s, ratio, runs)


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
                "runs": c.runs[0],
                "baseline_runs": c.runs[1],
                "fails": c in result.failing,
            }
        )
    return pd.DataFrame(rows)
