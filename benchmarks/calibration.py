"""How often the comparison's statistics call a difference where there is none, and find one that is
there: A/A and A/B simulated at the numbers of runs users make, through the very code the
comparison, `repeats: auto` and the gate use (pipeline.measures.stats.log_ratios under stats.ratio;
pipeline.measures.sequential.Design under rounds.judge; gate.states under gate.check).

Each trial draws one value per run for two settings from lognormal distributions (timings are
positive with multiplicative noise) whose coefficient of variation is `cv`. Three tables:

- **Fixed n** (`repeats: N`): `n` runs a side. A/A: both sides from one distribution (a correct 95%
  procedure calls about 5% of them significant); A/B: the reference 1.25x slower than the other side
  (power: the share called significant and faster); the gate's false FAIL on one point.
- **`repeats: auto`**: rounds of one more run a side, judged after each from round 2 on, stopped as
  the runner stops them: every speedup significant at the round's confidence or settled without a
  difference (the futility rule), or max_repeats. A/A and A/B as above, over whole sequences, with
  the rounds spent; "4 equal pairs" is a grid whose four speedups are all A/A, which stops only when
  all four are settled. Beside it the rule it replaced, a plain 95% interval judged after every round.
- **The gate over a build**: 4 and 18 points, `n` runs a side each, judged together (Holm); a build
  FAILs when any point is SLOWER. A/A at --fail-if-slower 0 and 10; every point truly 5% slower at
  --fail-if-slower 10; one point truly 25% slower among the rest (power). Beside it the rule it
  replaced: each point alone, on its point estimate and its 95% interval.

Deterministic: one numpy Generator per table with a fixed seed. tests/test_calibration.py runs these
and fails when an error rate passes its bound; docs/benchmarks.md holds the tables they print:

    python benchmarks/calibration.py            # the markdown tables
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.analysis import gate  # noqa: E402
from pipeline.measures import stats  # noqa: E402
from pipeline.measures.sequential import Design  # noqa: E402

SEED = 20_261_201
TRIALS = 4000  # per cell: a rate's standard error at 5% is 0.34 points
RUNS = (2, 3, 4, 5, 8)  # runs a side
CVS = (0.03, 0.10, 0.30)
SPEEDUP, POWER_CVS = 1.25, (0.03, 0.10, 0.30)

# repeats: auto
MAX_REPEATS = (4, 8, 20)  # 8 is the default
SEQUENTIAL_CV = 0.10
CLEAR_SPEEDUP, CLEAR_CV = 2.0, 0.03  # a device speedup: clear at once
EQUAL_PAIRS = 4
DESIGN, NAIVE = "design", "naive"  # the sequential design; a plain 95% after every round (the rule before)

# the gate over a build
POINTS = (4, 18)
GATE_RUNS, MORE_RUNS = 4, 8
GATE_CV = 0.10
SLOWER_PCT, TRUE_SLOWDOWN, REGRESSION = 10.0, 1.05, 1.25
CORRECTED, UNCORRECTED = "corrected", "uncorrected"


def _draws(rng: np.random.Generator, n: int, cv: float, trials: int, scale: float = 1.0) -> np.ndarray:
    """`trials` x `n` lognormal values around `scale` with coefficient of variation `cv`."""
    sigma = math.sqrt(math.log(1 + cv * cv))
    return scale * np.exp(rng.normal(0.0, sigma, size=(trials, n)))


# --- fixed n -------------------------------------------------------------------------------------


def rates(trials: int = TRIALS, seed: int = SEED) -> dict[str, dict[tuple[int, float], float]]:
    """Each cell's rate, by what it measures: "aa" (significant on A/A), "power" (significant and
    faster at a true 1.25x), "gate" (the gate's false FAIL on A/A at --fail-if-slower 0, one point)."""
    rng = np.random.default_rng(seed)
    found: dict[str, dict[tuple[int, float], float]] = {"aa": {}, "power": {}, "gate": {}}
    for cv in CVS:
        for n in RUNS:
            reference, other = _draws(rng, n, cv, trials), _draws(rng, n, cv, trials)
            test = stats.log_ratios(reference, other)
            found["aa"][(n, cv)] = float(np.mean((test.low > 0) | (test.high < 0)))
            # The gate: current / baseline, judged as it judges a build of one point.
            current = stats.log_ratios(other, reference)
            slower = gate.states(current.p_above(0.0)[:, None], one_sided_faster(current)[:, None])
            found["gate"][(n, cv)] = float(np.mean(slower[:, 0] == gate.SLOWER))
    for cv in POWER_CVS:
        for n in RUNS:
            reference, other = _draws(rng, n, cv, trials, SPEEDUP), _draws(rng, n, cv, trials)
            found["power"][(n, cv)] = float(np.mean(stats.log_ratios(reference, other).low > 0))
    return found


def table(found: dict[str, dict[tuple[int, float], float]]) -> str:
    """The fixed-n rates as a markdown table: one row per measure and CV, one column per runs a side."""
    header = "| runs per side | " + " | ".join(str(n) for n in RUNS) + " |"
    rule = "|---|" + "---|" * len(RUNS)
    rows = []
    for kind, cvs, what in (
        ("aa", CVS, "A/A called significant"),
        ("gate", CVS, "gate's A/A false FAIL (one point, --fail-if-slower 0)"),
        ("power", POWER_CVS, f"power at a true {SPEEDUP}x"),
    ):
        for cv in cvs:
            cells = " | ".join(f"{100 * found[kind][(n, cv)]:.1f}%" for n in RUNS)
            rows.append(f"| {what}, CV {100 * cv:.0f}% | {cells} |")
    return "\n".join([header, rule, *rows]) + "\n"


# --- repeats: auto -------------------------------------------------------------------------------


def sequence(
    reference: np.ndarray, other: np.ndarray, most: int, rule: str = DESIGN
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`repeats: auto` over many sweeps at once. `reference` and `other` are pairs x trials x most
    runs (every speedup of a trial's grid is a pair); after each round r >= 2 each speedup is judged on
    the first r runs a side as rounds.judge judges it: significant at the design's confidence for
    round r (the naive rule: 95%), or settled without a difference (Design.futile; the naive rule has
    none). A trial stops once every pair is settled, or at `most`. Returns each pair's verdict at the
    stop (significant; significant and faster) and each trial's rounds."""
    design = Design(most)
    pairs, trials, _ = reference.shape
    stopped_at = np.full(trials, most)
    running = np.ones(trials, dtype=bool)
    significant = np.zeros((pairs, trials), dtype=bool)
    faster = np.zeros((pairs, trials), dtype=bool)
    for r in range(2, most + 1):
        confidence = design.confidence(r) if rule == DESIGN else stats.CONFIDENCE
        test = stats.log_ratios(
            reference[..., :r].reshape(-1, r), other[..., :r].reshape(-1, r), confidence
        )  # log(reference / other): > 0, the other is faster
        clear_now = ((test.low > 0) | (test.high < 0)).reshape(pairs, trials)
        faster_now = (test.low > 0).reshape(pairs, trials)
        settled = clear_now.copy()
        if rule == DESIGN:
            settled |= design.futile(test.p_value, r).reshape(pairs, trials)
        stop = running & (settled.all(axis=0) | (r == most))
        significant[:, stop], faster[:, stop] = clear_now[:, stop], faster_now[:, stop]
        stopped_at[stop] = r
        running &= ~stop
    return significant, faster, stopped_at


def sequential(trials: int = TRIALS, seed: int = SEED) -> dict[tuple[str, int], dict[str, float]]:
    """Each max_repeats' figures for the design and the naive rule: "aa" (an A/A speedup ends
    significant), "aa_rounds" and "aa_max" (its rounds, the share that ran to max_repeats),
    "pairs_rounds" and "pairs_max" (the same for a grid of EQUAL_PAIRS A/A speedups), "power" (a true
    1.25x at CV 10% ends significant and faster) and "power_rounds", "clear_rounds" (a 2x at CV 3%),
    and "fixed_power": a fixed `repeats: max_repeats` sweep's power at the same 1.25x."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    for most in MAX_REPEATS:
        for rule in (DESIGN, NAIVE):
            rng = np.random.default_rng(seed + most)  # both rules judge the same draws
            sigma = math.sqrt(math.log(1 + SEQUENTIAL_CV**2))
            aa = rng.lognormal(0.0, sigma, (2, 1, trials, most))
            pairs = rng.lognormal(0.0, sigma, (2, EQUAL_PAIRS, trials, most))
            ab = rng.lognormal(0.0, sigma, (2, 1, trials, most))
            ab[0] *= SPEEDUP
            clear = rng.lognormal(0.0, math.sqrt(math.log(1 + CLEAR_CV**2)), (2, 1, trials, most))
            clear[0] *= CLEAR_SPEEDUP
            cell: dict[str, float] = {}
            significant, _, rounds = sequence(aa[0], aa[1], most, rule)
            cell.update(
                aa=float(significant.mean()), aa_rounds=float(rounds.mean()), aa_max=float(np.mean(rounds == most))
            )
            _, _, rounds = sequence(pairs[0], pairs[1], most, rule)
            cell.update(pairs_rounds=float(rounds.mean()), pairs_max=float(np.mean(rounds == most)))
            _, faster, rounds = sequence(ab[0], ab[1], most, rule)
            cell.update(power=float(faster.mean()), power_rounds=float(rounds.mean()))
            _, _, rounds = sequence(clear[0], clear[1], most, rule)
            cell["clear_rounds"] = float(rounds.mean())
            cell["fixed_power"] = float(np.mean(stats.log_ratios(ab[0, 0], ab[1, 0]).low > 0))
            found[(rule, most)] = cell
    return found


def sequential_table(found: dict[tuple[str, int], dict[str, float]]) -> str:
    """The `repeats: auto` figures as a markdown table: one row per max_repeats and rule."""
    header = (
        "| max_repeats | rule | A/A ends significant | A/A: rounds (ran to max) | "
        f"{EQUAL_PAIRS} equal pairs: rounds (ran to max) | power at a true {SPEEDUP}x (rounds) | "
        f"a {CLEAR_SPEEDUP:g}x at CV {100 * CLEAR_CV:.0f}%: rounds | fixed `repeats: max_repeats`: power |"
    )
    rows = [header, "|---|---|---|---|---|---|---|---|"]
    for most in MAX_REPEATS:
        for rule, words in ((DESIGN, "the design"), (NAIVE, "95% every round (before)")):
            c = found[(rule, most)]
            rows.append(
                f"| {most} | {words} | {100 * c['aa']:.1f}% | {c['aa_rounds']:.2f} ({100 * c['aa_max']:.0f}%) | "
                f"{c['pairs_rounds']:.2f} ({100 * c['pairs_max']:.0f}%) | {100 * c['power']:.1f}% "
                f"({c['power_rounds']:.2f}) | {c['clear_rounds']:.2f} | {100 * c['fixed_power']:.1f}% |"
            )
    return "\n".join(rows) + "\n"


# --- the gate over a build -----------------------------------------------------------------------


def build_fails(current: np.ndarray, baseline: np.ndarray, threshold: float, rule: str = CORRECTED) -> np.ndarray:
    """Whether each build FAILs: `current` and `baseline` are trials x points x runs epoch times, each
    point judged as gate.check judges it (gate.states: Holm across the build's points), or, for the
    rule it replaced, each point alone (slower than `threshold` percent by its point estimate, its
    95% interval above no change)."""
    trials, points, runs = current.shape
    test = stats.log_ratios(current.reshape(-1, runs), baseline.reshape(-1, runs))  # log(current / baseline)
    if rule == UNCORRECTED:
        slower = (100 * (np.exp(test.difference) - 1) > threshold) & (test.low > 0)
        return np.asarray(slower.reshape(trials, points).any(axis=1))
    slower_p = test.p_above(math.log(1 + threshold / 100)).reshape(trials, points)
    faster_p = one_sided_faster(test).reshape(trials, points)
    return np.asarray((gate.states(slower_p, faster_p) == gate.SLOWER).any(axis=1))


def one_sided_faster(test: stats.Welch) -> np.ndarray:
    """One-sided p-values for "faster" (the difference of logs below 0)."""
    return stats.one_sided(-test.difference, test.se, test.df)


def gate_rates(trials: int = TRIALS, seed: int = SEED) -> dict[tuple[str, int], dict[str, float]]:
    """Each build size's FAIL rate, corrected and uncorrected: "aa_0" and "aa_10" (no change, at
    --fail-if-slower 0 and 10), "slower_5" (every point truly 5% slower, at --fail-if-slower 10),
    "power" (one point truly 25% slower, the rest unchanged, at --fail-if-slower 0), and "power_more"
    (the same with MORE_RUNS runs a side)."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    sigma = math.sqrt(math.log(1 + GATE_CV**2))
    for points in POINTS:
        rng = np.random.default_rng(seed + points)
        base, same = (rng.lognormal(0.0, sigma, (trials, points, MORE_RUNS)) for _ in range(2))
        one = same.copy()
        one[:, 0] *= REGRESSION
        more = (one, base)
        base, same, one = base[..., :GATE_RUNS], same[..., :GATE_RUNS], one[..., :GATE_RUNS]
        slower = same * TRUE_SLOWDOWN
        for rule in (CORRECTED, UNCORRECTED):
            found[(rule, points)] = {
                "aa_0": float(build_fails(same, base, 0.0, rule).mean()),
                "aa_10": float(build_fails(same, base, SLOWER_PCT, rule).mean()),
                "slower_5": float(build_fails(slower, base, SLOWER_PCT, rule).mean()),
                "power": float(build_fails(one, base, 0.0, rule).mean()),
                "power_more": float(build_fails(*more, 0.0, rule).mean()),
            }
    return found


def gate_table(found: dict[tuple[str, int], dict[str, float]]) -> str:
    """The build-level FAIL rates as a markdown table: one row per build size and rule."""
    header = (
        f"| points | rule | no change, PCT 0 | no change, PCT {SLOWER_PCT:g} | every point "
        f"{100 * (TRUE_SLOWDOWN - 1):.0f}% slower, PCT {SLOWER_PCT:g} | one point "
        f"{100 * (REGRESSION - 1):.0f}% slower, PCT 0 | the same, {MORE_RUNS} runs a side |"
    )
    rows = [header, "|---|---|---|---|---|---|---|"]
    for points in POINTS:
        for rule, words in ((CORRECTED, "Holm (the gate)"), (UNCORRECTED, "each point alone (before)")):
            c = found[(rule, points)]
            rows.append(
                f"| {points} | {words} | {100 * c['aa_0']:.1f}% | {100 * c['aa_10']:.1f}% | "
                f"{100 * c['slower_5']:.1f}% | {100 * c['power']:.1f}% | {100 * c['power_more']:.1f}% |"
            )
    return "\n".join(rows) + "\n"


def sequential_words(found: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    """What docs/grids.md says of `repeats: auto` in prose, from these figures (the test checks the
    page holds them): the rule it replaced, then the design's error rate, power and rounds."""
    naive = {most: 100 * found[(NAIVE, most)]["aa"] for most in MAX_REPEATS}
    d4, d8, d20 = (found[(DESIGN, most)] for most in MAX_REPEATS)
    return [
        f"would find a difference between two identical settings in {naive[8]:.0f}% of sweeps at "
        f"`max_repeats: 8` ({naive[20]:.0f}% at 20)",
        f"at `max_repeats: 8` two identical settings end significant in {100 * d8['aa']:.1f}% of sweeps, after "
        f"{d8['aa_rounds']:.1f} rounds on average ({100 * d8['aa_max']:.0f}% run to 8); a true {SPEEDUP}x is found "
        f"in {100 * d8['power']:.0f}% of sweeps after {d8['power_rounds']:.1f} rounds (a fixed 8 finds it in "
        f"{100 * d8['fixed_power']:.1f}%); a {CLEAR_SPEEDUP:g}x at a {100 * CLEAR_CV:.0f}% spread stops after "
        f"{d8['clear_rounds']:.1f} rounds. At `max_repeats: 20` a true {SPEEDUP}x is found in "
        f"{100 * d20['power']:.0f}% of sweeps after {d20['power_rounds']:.1f} rounds; at 4, in "
        f"{100 * d4['power']:.0f}% of them",
    ]


def gate_words(found: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    """What docs/comparing.md says of the gate's error rates and power in prose, from these figures."""
    small, large = found[(CORRECTED, 4)], found[(CORRECTED, 18)]
    alone_small, alone_large = found[(UNCORRECTED, 4)], found[(UNCORRECTED, 18)]
    return [
        f"builds of 4 and of 18 unchanged points fail {100 * small['aa_0']:.1f}% and {100 * large['aa_0']:.1f}% "
        f"of the time at PCT 0 (each point alone: {100 * alone_small['aa_0']:.0f}% and "
        f"{100 * alone_large['aa_0']:.0f}%); a true {100 * (TRUE_SLOWDOWN - 1):.0f}% slowdown at every point fails "
        f"a {SLOWER_PCT:g}% gate {100 * small['slower_5']:.1f}% and {100 * large['slower_5']:.1f}% of the time "
        f"(before: {100 * alone_small['slower_5']:.0f}% and {100 * alone_large['slower_5']:.0f}%)",
        f"one point truly {100 * (REGRESSION - 1):.0f}% slower among 18 fails the build "
        f"{100 * large['power']:.0f}% of the time at {GATE_RUNS} runs a side and {100 * large['power_more']:.0f}% "
        f"at {MORE_RUNS}",
    ]


def main() -> None:
    print(f"{TRIALS} trials a cell, seed {SEED}; lognormal values, one per run\n")
    print(table(rates()))
    print(f"repeats: auto, CV {100 * SEQUENTIAL_CV:.0f}% unless said\n")
    print(sequential_table(sequential()))
    print(f"the gate over a build: {GATE_RUNS} runs a side a point, CV {100 * GATE_CV:.0f}%\n")
    print(gate_table(gate_rates()), end="")


if __name__ == "__main__":
    main()
