"""A sweep's comparison from the store: its runs read back, then built with the options its parent
run recorded (quality margin, grid axes), as `pipeline compare`, `pipeline register` and
`pipeline.api.compare` all need it; and the regression gate against a baseline sweep.

The analysis (analysis/compare.py, analysis/gate.py) reads no store: this is where the reading and
the analysis meet.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.analysis import gate
from pipeline.analysis.compare import HISTORIES, CompareOptions, build, sweep_options
from pipeline.base.names import REPEAT, ROUNDS
from pipeline.tracking.records import baseline_sweep, read_sweep

if TYPE_CHECKING:
    from pipeline.analysis.compare import Comparison
    from pipeline.analysis.gate import GateResult
    from pipeline.base.runs import SweepRecord


def comparison_of(
    client,
    experiment: str | None = None,
    parent_run: str | None = None,
    options: CompareOptions | None = None,
    quality_margin: float | None = None,
    charted: tuple[str, ...] = (),
) -> Comparison:
    """The comparison of the sweep `parent_run`, else the latest sweep of `experiment`, else the
    store's latest: its FINISHED runs with HISTORIES (and the `charted` histories a chart draws),
    built with `options` and the settings its parent recorded (`quality_margin` overrides the
    recorded margin). UserError where there is no such sweep; a sweep with no FINISHED run gives an
    empty comparison (`comparison.sweep.children` is empty), which each caller words."""
    sweep = read_sweep(client, experiment, parent_run, histories=HISTORIES, charted=charted)
    return build(sweep, _options(client, sweep, options or CompareOptions(), quality_margin))


def gate_against(
    client,
    comparison: Comparison,
    baseline: str,
    options: CompareOptions,
    quality_margin: float | None,
    threshold: float | None,
    across_hosts: bool = False,
    allow_inconclusive: bool = False,
) -> GateResult:
    """`comparison` (built with `options` and `quality_margin`) against the sweep `baseline` names
    (a parent run id, or an experiment for its latest sweep), built the same way but for the sort
    and --versus, which order and pair rows and change no point: gate.check's states for every point."""
    base_sweep = baseline_sweep(client, baseline, HISTORIES, comparison.sweep)
    base_options = replace(options, sort=None, versus=None)
    base = build(base_sweep, _options(client, base_sweep, base_options, quality_margin))
    return gate.check(comparison, base, threshold, across_hosts, allow_inconclusive)


def _options(client, sweep: SweepRecord, options: CompareOptions, quality_margin: float | None) -> CompareOptions:
    """`options` with what the sweep's parent recorded, and for a `repeats: auto` sweep the round it
    reached: its `rounds` metric, or where it ended before recording one (interrupted), the highest
    repeat among its runs."""
    parent = client.get_run(sweep.run_id).data
    rounds = parent.metrics.get(ROUNDS)
    if rounds is None:
        rounds = max((int(run.params.get(REPEAT, "1")) for run in sweep.children), default=None)
    return sweep_options(parent.params, parent.tags, options, quality_margin, None if rounds is None else int(rounds))
