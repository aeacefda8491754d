"""How often the comparison's statistics call a difference where there is none, and find one that is
there: A/A and A/B simulated at the numbers of runs users make, through the very code the
comparison and the gate use (pipeline.measures.stats.log_ratios under stats.ratio; gate.judge).

Each trial draws one value per run for two settings, `n` runs a side, from lognormal distributions
(timings are positive with multiplicative noise) whose coefficient of variation is `cv`:
- A/A: both sides from one distribution. A correct 95% procedure calls about 5% of them significant.
- A/B: the reference 1.25x slower than the other side (a true speedup of 1.25x); power is the share
  of trials that call it significant and faster.
- the gate's A/A false FAIL: `gate.judge` at --fail-if-slower 0 (its strictest), on the same A/A draws.

Deterministic: one numpy Generator with a fixed seed. tests/test_calibration.py runs this with
TRIALS trials a cell and fails when an A/A rate passes its bound; docs/benchmarks.md holds the table
it prints:

    python benchmarks/calibration.py            # the markdown table
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.analysis import gate  # noqa: E402
from pipeline.measures import stats

SEED = 20_261_201
TRIALS = 4000  # per cell: a rate's standard error at 5% is 0.34 points
RUNS = (2, 3, 4, 5, 8)  # runs a side
CVS = (0.03, 0.10, 0.30)
SPEEDUP, POWER_CVS = 1.25, (0.03, 0.10, 0.30)


def _draws(rng: np.random.Generator, n: int, cv: float, trials: int, scale: float = 1.0) -> np.ndarray:
    """`trials` x `n` lognormal values around `scale` with coefficient of variation `cv`."""
    sigma = math.sqrt(math.log(1 + cv * cv))
    return scale * np.exp(rng.normal(0.0, sigma, size=(trials, n)))


def rates(trials: int = TRIALS, seed: int = SEED) -> dict[str, dict[tuple[int, float], float]]:
    """Each cell's rate, by what it measures: "aa" (significant on A/A), "power" (significant and
    faster at a true 1.25x), "gate" (the gate's false FAIL on A/A at --fail-if-slower 0)."""
    rng = np.random.default_rng(seed)
    found: dict[str, dict[tuple[int, float], float]] = {"aa": {}, "power": {}, "gate": {}}
    for cv in CVS:
        for n in RUNS:
            reference, other = _draws(rng, n, cv, trials), _draws(rng, n, cv, trials)
            estimate, low, high = stats.log_ratios(reference, other)
            found["aa"][(n, cv)] = float(np.mean((low > 1) | (high < 1)))
            # The gate: current / baseline, judged as it judges a point.
            slower = [
                gate.judge(stats.Ratio(1 / e, 1 / h, 1 / lo, (n, n)), 0.0)[0] == gate.SLOWER
                for e, lo, h in zip(estimate, low, high)
            ]
            found["gate"][(n, cv)] = float(np.mean(slower))
    for cv in POWER_CVS:
        for n in RUNS:
            reference, other = _draws(rng, n, cv, trials, SPEEDUP), _draws(rng, n, cv, trials)
            _, low, _ = stats.log_ratios(reference, other)
            found["power"][(n, cv)] = float(np.mean(low > 1))
    return found


def table(found: dict[str, dict[tuple[int, float], float]]) -> str:
    """The rates as a markdown table: one row per measure and CV, one column per runs a side."""
    header = "| runs per side | " + " | ".join(str(n) for n in RUNS) + " |"
    rule = "|---|" + "---|" * len(RUNS)
    rows = []
    for kind, cvs, what in (
        ("aa", CVS, "A/A called significant"),
        ("gate", CVS, "gate's A/A false FAIL (--fail-if-slower 0)"),
        ("power", POWER_CVS, f"power at a true {SPEEDUP}x"),
    ):
        for cv in cvs:
            cells = " | ".join(f"{100 * found[kind][(n, cv)]:.1f}%" for n in RUNS)
            rows.append(f"| {what}, CV {100 * cv:.0f}% | {cells} |")
    return "\n".join([header, rule, *rows]) + "\n"


def main() -> None:
    print(f"{TRIALS} trials a cell, seed {SEED}; lognormal values, one per run")
    print(table(rates()), end="")


if __name__ == "__main__":
    main()
