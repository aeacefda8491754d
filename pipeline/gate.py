"""A regression gate: a sweep's epoch times against a baseline sweep's, point by point.

Each row of the sweep (compare.py: one setting, its repeats aggregated) is paired with the baseline
row that has the same settings (every grid key and the data sizes), device and hardware, and by
default the same host. The change is median epoch time over the baseline's, minus one, with a 95%
hierarchical bootstrap interval (stats.median_ratio). A point fails `--fail-if-slower PCT` when it
is slower by more than PCT and its interval lies above no change: noise alone never fails a build.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from pipeline import stats
from pipeline.compare import ROW_KEYS, TWIN_KEYS, markdown
from pipeline.errors import UserError
from pipeline.grid import format_value

if TYPE_CHECKING:
    from pipeline.compare import Comparison
    from pipeline.records import SweepRecord

_RUN_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Change:
    """One point's median epoch time in the sweep against the baseline's."""

    point: str  # its settings, as a row label: "cpu batch_size=128"
    baseline_s: float
    current_s: float
    ratio: stats.Ratio  # current / baseline: > 1 is slower
    runs: tuple[int, int]  # timed runs: this sweep's, the baseline's

    @property
    def percent(self) -> tuple[float, float, float]:
        """The change and its interval, in percent of the baseline (+ is slower)."""
        return tuple(100 * (v - 1) for v in (self.ratio.estimate, self.ratio.low, self.ratio.high))

    def words(self) -> str:
        """"+12.4% slower [+8.1%, +16.9%]", "-3.0% faster [-5.2%, +0.9%] (n.s.)"."""
        change, low, high = self.percent
        text = f"{change:+.1f}% {'slower' if change > 0 else 'faster'}"
        if not self.ratio.has_interval:
            return f"{text} ({stats.TOO_SMALL})"
        return f"{text} [{low:+.1f}%, {high:+.1f}%]" + ("" if self.ratio.significant else " (n.s.)")

    def slower_than(self, percent: float) -> bool:
        """Slower by more than `percent`, with the interval's lower end above no change."""
        change, low, _ = self.percent
        return change > percent and self.ratio.has_interval and low > 0


@dataclass(frozen=True)
class GateResult:
    current: "SweepRecord"
    baseline: "SweepRecord"
    changes: list[Change]
    threshold: float | None  # --fail-if-slower PCT, or None: report only
    unpaired: int  # this sweep's points with no baseline twin

    @property
    def failing(self) -> list[Change]:
        if self.threshold is None:
            return []
        return [c for c in self.changes if c.slower_than(self.threshold)]

    @property
    def exit_code(self) -> int:
        return 1 if self.failing else 0

    def verdict(self) -> str:
        compared = f"{len(self.changes)} point{'s' if len(self.changes) != 1 else ''} compared"
        if self.unpaired:
            compared += f", {self.unpaired} without a baseline point"
        if self.threshold is None:
            return f"{compared}; no --fail-if-slower, so the gate does not fail"
        if self.failing:
            names = ", ".join(c.point for c in self.failing)
            return (f"FAIL: {len(self.failing)} of {len(self.changes)} points slower by more than "
                    f"{self.threshold:g}% with the interval above no change: {names}")
        return (f"PASS: no point slower by more than {self.threshold:g}% with its interval above no change "
                f"({compared})")


def baseline_sweep(client, baseline: str, histories: tuple[str, ...]) -> "SweepRecord":
    """`--baseline`: a parent run id, or an experiment name for its latest sweep."""
    from pipeline.records import read_sweep

    by_id = bool(_RUN_ID.fullmatch(baseline))
    try:
        sweep = read_sweep(client, None if by_id else baseline, baseline if by_id else None, histories=histories)
    except UserError as exc:
        raise UserError(f"--baseline {baseline}: {exc}") from None
    if not sweep.children:
        raise UserError(f"--baseline {baseline}: sweep {sweep.name!r} has no FINISHED runs")
    return sweep


def _keys(across_hosts: bool) -> list[str]:
    return [*ROW_KEYS, *([] if across_hosts else ["host"])]


def _label(row: pd.Series, shown: list[str]) -> str:
    return " ".join([str(row["device"]), *(f"{k}={format_value(row[k])}" for k in shown)])


def _pairing(row: pd.Series, keys: list[str]) -> tuple[str, ...]:
    return tuple(format_value(row[k]) for k in keys)


def check(current: "Comparison", baseline: "Comparison", threshold: float | None,
          across_hosts: bool = False) -> GateResult:
    """Pair `current`'s rows with `baseline`'s and measure each change in median epoch time.

    Raises UserError when the baseline ran on other hardware, or when no point pairs (naming the
    settings each side has)."""
    ours, theirs = current.table, baseline.table
    hardware, base_hardware = set(ours["hardware"]), set(baseline.table["hardware"])
    if not hardware & base_hardware:
        raise UserError(f"--baseline {baseline.sweep.name}: it ran on {', '.join(sorted(base_hardware))}, this sweep "
                        f"on {', '.join(sorted(hardware))}; a baseline from other hardware is refused")
    keys = _keys(across_hosts)
    shown = [k for k in TWIN_KEYS if pd.concat([ours[k], theirs[k]]).map(format_value).nunique() > 1]
    base_rows = {_pairing(row, keys): row for _, row in theirs.iterrows()}
    changes, unpaired, untimed = [], 0, 0
    for _, row in ours.iterrows():
        twin = base_rows.get(_pairing(row, keys))
        if twin is None:
            unpaired += 1
            continue
        mine, base = current.epochs(row), baseline.epochs(twin)
        ratio = stats.median_ratio(mine, base)
        if math.isnan(ratio.estimate):  # paired, but one side has no epochs left to time (contended runs)
            unpaired, untimed = unpaired + 1, untimed + 1
            continue
        changes.append(Change(_label(row, shown), stats.pooled_median(base), stats.pooled_median(mine), ratio,
                              (len(mine), len(base))))
    if not changes and untimed:
        raise UserError(f"--baseline {baseline.sweep.name}: {untimed} point(s) pair, but on one side or both every "
                        "run is contended (other processes took the cores) and left out; rerun on a quiet machine, "
                        "or --include-contended counts them")
    if not changes:
        raise UserError(_no_pairs(current, baseline, shown, across_hosts))
    return GateResult(current.sweep, baseline.sweep, changes, threshold, unpaired)


def _no_pairs(current: "Comparison", baseline: "Comparison", shown: list[str], across_hosts: bool) -> str:
    def points(comparison: "Comparison") -> str:
        labels = list(dict.fromkeys(_label(row, shown) + ("" if across_hosts else f" on {row['host'] or '?'}")
                                    for _, row in comparison.table.iterrows()))
        return ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")

    hint = "" if across_hosts else "; --across-hosts pairs points from other hosts"
    return (f"--baseline {baseline.sweep.name}: no point has the same settings, device and hardware"
            f"{'' if across_hosts else ' and host'} on both sides; this sweep has {points(current)}; "
            f"the baseline has {points(baseline)}{hint}")


def frame(result: GateResult) -> pd.DataFrame:
    """The points as data (csv, json): medians, the change in percent, its interval, runs."""
    rows = []
    for c in result.changes:
        change, low, high = c.percent
        rows.append({"point": c.point, "baseline_epoch_s": c.baseline_s, "epoch_s": c.current_s,
                     "change_pct": change, "change_pct_low": low, "change_pct_high": high,
                     "significant": c.ratio.significant, "runs": c.runs[0], "baseline_runs": c.runs[1],
                     "fails": c in result.failing})
    return pd.DataFrame(rows)


def display_frame(result: GateResult) -> pd.DataFrame:
    """The human view: one row per point."""
    return pd.DataFrame({
        "point": [c.point for c in result.changes],
        "baseline s/epoch": [f"{c.baseline_s:.3f}" for c in result.changes],
        "s/epoch": [f"{c.current_s:.3f}" for c in result.changes],
        "change": [c.words() for c in result.changes],
        "runs": [f"{c.runs[0]} vs {c.runs[1]}" for c in result.changes],
    })


def title(result: GateResult) -> str:
    return f"Epoch time of {result.current.name} against the baseline {result.baseline.name}"


def render(result: GateResult, fmt: str) -> str:
    """csv, json or markdown (a CI comment: a heading, one row per point, the verdict)."""
    if fmt == "csv":
        return frame(result).to_csv(index=False)
    if fmt == "json":
        return json.dumps({"verdict": result.verdict(), "exit_code": result.exit_code,
                           "points": json.loads(frame(result).to_json(orient="records"))}, indent=2) + "\n"
    if fmt == "markdown":
        return f"### {title(result)}\n\n{markdown(display_frame(result))}\n**{result.verdict()}**\n"
    raise ValueError(fmt)
