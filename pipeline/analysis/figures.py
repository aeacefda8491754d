"""The figures of a comparison row, each once: where a run's value comes from, how a setting's runs
make the row's value, and how a person reads it.

compare.py reads this table to build a row (the csv and json columns), to take a median over the
right runs, and for `--sort` (a figure's name or its label, and which way is better). tables.py
lays out the human view (`pipeline compare --wide`, markdown) from it. A figure added here is
compared, sorted and shown by all of them; the speedups, the settings and the counts are not
figures of this kind (compare.py's own columns).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.base.names import (
    ACHIEVED_TFLOPS,
    BANDWIDTH_SHARE,
    COMPILE,
    FIRST_EPOCH,
    LOAD_AVERAGE,
    MFU,
    OTHERS_CPU_SHARE,
    PEAK_BANDWIDTH,
    PEAK_MEMORY,
    PEAK_TFLOPS,
    RUN_DURATION,
    TIME_TO_TARGET,
    TRAIN_BYTES,
    TRAIN_FLOPS,
    WARMUP,
)

# How a setting's runs make its value.
TIMED = "timed"  # the median over its timed runs: a speed, which a contended run would skew
EVERY = "every"  # the median over all its runs: what was learnt, the work, the machine's load
OWN = "own"  # compare.py works it out itself (a geometric mean, the time to target)
# Where a run's value comes from.
METRIC = "metric"  # the metric the run logged (Figure.logged)
END = "end"  # its end figures (names.END_FIGURES; worked out from the history for a run that logged none)
WORKED_OUT = "worked out"  # compare.py's _run_row (energy, images per joule)
# Where the human view (`--wide`, markdown) shows it.
LEAD = "lead"  # first, before the epoch time
ALWAYS = "always"  # after the epoch time, in every table
SOME = "some"  # after the epoch time, where some row has it
DATA = "data"  # in the csv and json only


def fixed(digits: int) -> Callable[[float], str]:
    """A number to `digits` decimals, thousands separated; "-" where unknown."""
    return lambda value: "-" if math.isnan(value) else f"{value:,.{digits}f}"


def tflops(value: float) -> str:
    """TFLOP/s to 3 significant digits ("-" where unknown): 0.0412 on a CPU, 3.21 on a GPU."""
    return "-" if math.isnan(value) else f"{value:.3g}"


def percent(share: float) -> str:
    """A share as a percentage, "-" where unknown: one decimal from 1% (12.3, 4.8, 100.0), 2
    significant digits below it (0.37, 0.0041)."""
    if math.isnan(share):
        return "-"
    value = 100 * share
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def share_of_epoch(share: float) -> str:
    """A share of the epoch as a percentage to one decimal; "-" where unknown."""
    return "-" if math.isnan(share) else f"{100 * share:.1f}"


@dataclass(frozen=True)
class Figure:
    """One figure of a comparison row."""

    name: str  # its column in the row (csv, json), and --sort's name for it
    over: str  # TIMED, EVERY or OWN: how a setting's runs make its value
    source: str = METRIC  # METRIC, END or WORKED_OUT: where a run's value comes from
    logged: str = ""  # the run's metric or end figure, where it is not `name`
    label: str = ""  # the human view's heading, which --sort takes too ("": the name)
    shown: str = DATA  # LEAD, ALWAYS, SOME or DATA: where the human view shows it
    text: Callable[[float], str] = fixed(3)  # how the human view writes it
    higher_is_better: bool = False  # --sort puts the highest first
    in_view: bool = False  # the MLflow UI's view of a sweep has it as a column (setting_NAME on each child)

    @property
    def key(self) -> str:
        """What the run holds it as."""
        return self.logged or self.name

    @property
    def heading(self) -> str:
        return self.label or self.name


FIGURES = (
    Figure("train_loss", EVERY, label="train loss", shown=LEAD, text=fixed(4)),
    Figure("train_accuracy", EVERY, label="train acc", shown=LEAD, text=fixed(4), higher_is_better=True),
    Figure("test_loss", EVERY, label="test loss", shown=LEAD, text=fixed(4)),
    Figure("test_accuracy", EVERY, label="test acc", shown=LEAD, text=fixed(4), higher_is_better=True),
    Figure("epoch_duration_s", OWN, source=WORKED_OUT, label="epoch_s"),
    Figure(TIME_TO_TARGET, OWN, label="to target s"),
    Figure(FIRST_EPOCH, TIMED, source=END, label="epoch1_s", shown=ALWAYS),
    Figure(WARMUP, TIMED),
    Figure(COMPILE, TIMED, shown=SOME, text=fixed(1)),  # compiling: a one-off cost, in neither epoch
    Figure("images_per_s", OWN, source=WORKED_OUT, label="img/s", shown=ALWAYS, text=fixed(0), higher_is_better=True),
    Figure("peak_memory_mb", TIMED, source=END, logged=PEAK_MEMORY, label="peak MiB", shown=ALWAYS, text=fixed(0)),
    Figure("energy_j", TIMED, source=WORKED_OUT, label="J/epoch", shown=SOME, text=fixed(1)),
    Figure("images_per_j", TIMED, source=WORKED_OUT, label="img/J", shown=SOME, text=fixed(0), higher_is_better=True),
    Figure(ACHIEVED_TFLOPS, TIMED, label="TFLOP/s", shown=SOME, text=tflops, higher_is_better=True),
    Figure(PEAK_TFLOPS, TIMED),
    Figure(MFU, TIMED, label="MFU %", shown=SOME, text=percent, higher_is_better=True, in_view=True),
    Figure(PEAK_BANDWIDTH, TIMED),
    Figure(BANDWIDTH_SHARE, TIMED, label="BW %", shown=SOME, text=percent, higher_is_better=True),
    Figure(RUN_DURATION, TIMED, label="run_s", shown=ALWAYS, text=fixed(2)),
    Figure("data_share", TIMED, source=END, label="data %", shown=ALWAYS, text=share_of_epoch),
    Figure("transfer_share", TIMED, source=END, label="transfer %", shown=ALWAYS, text=share_of_epoch),
    Figure("compute_share", TIMED, source=END, label="compute %", shown=ALWAYS, text=share_of_epoch),
    # The arithmetic and the counted bytes of an epoch: the same for every run of a setting.
    Figure(TRAIN_FLOPS, EVERY),
    Figure(TRAIN_BYTES, EVERY),
    # How busy the machine was.
    Figure(LOAD_AVERAGE, EVERY),
    Figure(OTHERS_CPU_SHARE, EVERY),
)


def figures(over: str | None = None, shown: str | None = None) -> list[Figure]:
    """The table's figures, those made `over` some runs or `shown` somewhere only where asked. Every
    reader calls this (never FIGURES at import), so that the table is read where it is used."""
    return [f for f in FIGURES if (over is None or f.over == over) and (shown is None or f.shown == shown)]


def named(name_or_label: str) -> Figure | None:
    """The figure of that name or label."""
    return next((f for f in FIGURES if name_or_label in (f.name, f.label)), None)
