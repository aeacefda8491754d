"""`repeats: auto`: whether a sweep's speedups are settled yet, and why its rounds stop.

The runner trains a `repeats: auto` sweep in rounds (every point once a round, interleaved): the
first MIN_RUNS together, then one at a time. After each it hands this module the comparison of the
runs so far (compare.build, with the round reached: its intervals are the sequential design's at
that round, measures/sequential.py). Every grid key that varies is an axis, and every row with a
twin at the axis's reference value has a speedup over it (compare.axis_ratios): the reference is cpu
for the device when the grid lists it, else the first value listed. A speedup is settled (clear)
when it is significant at the round's confidence; when, from round 3, it could only become so by
max_repeats with a chance under 10% at the trend so far (no difference found: the design's futility
rule); or, with `half_width`, when its interval's half-width is within that share of its estimate.
The rounds stop when every speedup is settled, when there is none to judge, or once `max_repeats`
rounds ran.

Analysis only: it reads a Comparison and returns the judgement and whether the rounds stop (and on
what); sentences.py says it in words, the runner trains and records, the reporter prints. Never
imports torch or mlflow, nor anything that renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.analysis.compare import axis_ratios
from pipeline.measures.sequential import Design
from pipeline.settings.config import KEYS
from pipeline.settings.grid import format_value, short

if TYPE_CHECKING:
    from pipeline.analysis.compare import Comparison
    from pipeline.measures.stats import Ratio
    from pipeline.settings.config import GridSpec

# Why the rounds stop after a round (decide), or CONTINUE to train another.
CONTINUE, NOTHING_TO_JUDGE, ALL_CLEAR, MAX_REPEATS = "continue", "nothing to judge", "all clear", "max repeats"


@dataclass(frozen=True)
class Speedup:
    """One speedup on a grid axis: the row and the twin it is measured against, and its ratio."""

    label: str  # "cuda:0 bs128 vs cpu", "cpu bs256 vs bs64"
    ratio: Ratio
    half_width: float | None = None  # the grid's half-width target, when it has one
    no_difference: bool = False  # settled without one: the design's futility rule (Design.futile)

    @property
    def clear(self) -> bool:
        """Significant, settled without a difference, or within the half-width target
        (Ratio.half_width: NaN without an interval)."""
        if self.ratio.significant or self.no_difference:
            return True
        return self.within_half_width

    @property
    def within_half_width(self) -> bool:
        return self.half_width is not None and self.ratio.half_width <= self.half_width


@dataclass(frozen=True)
class Judgement:
    """The speedups on the grid's axes after a round, or why there is none to judge."""

    speedups: tuple[Speedup, ...] = ()
    why_none: str = ""  # set when `speedups` is empty

    @property
    def unclear(self) -> list[Speedup]:
        return [s for s in self.speedups if not s.clear]


def references(axes: Sequence[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, Any]]:
    """Each grid key that varies and changes what a run measures (the device, or a twin key: not
    gpus_per_run, which only says where a point runs), with the value its speedups are measured
    against: for the device, cpu when the grid lists it, else the first listed; for any other key,
    the first value listed."""
    return [
        (key, "cpu" if key == "device" and "cpu" in values else values[0])
        for key, values in axes
        if len(values) > 1 and (key == "device" or KEYS[key].twin)
    ]


def judge(
    comparison: Comparison, axes: Sequence[tuple[str, tuple[Any, ...]]], half_width: float | None = None
) -> Judgement:
    """Every speedup on the varying keys of `axes` (a grid's) in `comparison`, each judged clear or not:
    at the comparison's confidence, and for a comparison of a round of a `repeats: auto` sweep
    (comparison.rounds) with the design's futility rule too."""
    varying = references(axes)
    if not varying:
        return Judgement(why_none="the grid varies no setting: nothing to compare")
    speedups = []
    for key, reference in varying:
        value = _compared_value(comparison, key, reference)
        if value is None:  # no run of the reference finished: nothing on this axis to measure against
            continue
        against = value if key == "device" else short(key, reference)
        speedups += [
            Speedup(f"{label} vs {against}", ratio, half_width, _no_difference(comparison, ratio))
            for label, ratio in axis_ratios(comparison, key, value)
        ]
    if speedups:
        return Judgement(tuple(speedups))
    return Judgement(why_none=_why_no_speedup(comparison, [key for key, _ in varying]))


def _no_difference(comparison: Comparison, ratio: Ratio) -> bool:
    """Whether a speedup that is not significant is settled without a difference (Design.futile) at
    the round the comparison was built at; never outside `repeats: auto`."""
    if comparison.rounds is None or ratio.significant is not False:
        return False
    reached, most = comparison.rounds
    return bool(Design(most).futile(ratio.p_value, reached))


def _compared_value(comparison: Comparison, key: str, reference: Any) -> str | None:
    """`reference` as the comparison's rows hold it, or None when no row has it. A device is the one
    the runs used ("cuda:0" for the grid's "cuda"), which the rows hold beside the one requested."""
    table = comparison.table
    if table.empty:
        return None
    if key != "device":
        return format_value(reference)
    used = table.loc[table["requested_device"].astype(str) == str(reference), "device"]
    return str(used.iloc[0]) if len(used) else None


def _why_no_speedup(comparison: Comparison, keys: list[str]) -> str:
    """Why the comparison holds no speedup on `keys`: its runs' twins did not finish, or were contended."""
    runs = comparison.runs
    contended = int(runs["contended"].sum()) if not runs.empty and not comparison.include_contended else 0
    if contended:
        return (
            f"no speedup to judge: {contended} of {len(runs)} runs were contended (other processes took the "
            "cores) and speedups leave them out; rerun on a quiet machine"
        )
    return f"no speedup to judge: no run finished beside its twin on {', '.join(keys)}"


def decide(judgement: Judgement, rounds: int, spec: GridSpec) -> str:
    """After round `rounds`: NOTHING_TO_JUDGE (the grid varies nothing, or no twins finished),
    ALL_CLEAR (every speedup is settled), MAX_REPEATS (spec.most_repeats rounds ran, some not
    significant: no difference found within them), or CONTINUE."""
    if judgement.why_none:
        return NOTHING_TO_JUDGE
    if not judgement.unclear:
        return ALL_CLEAR
    if rounds >= spec.most_repeats:
        return MAX_REPEATS
    return CONTINUE
