"""Grid expansion: a pure function from a validated GridSpec to an ordered list of grid points.

The order is the tutorial's `itertools.product` over an OrderedDict: the file's keys in file order,
the last key varying fastest. Keys the file does not mention take RunConfig's defaults. With
`repeats: N` the whole grid comes N times, interleaved: every point's first repeat, then every
point's second, and so on, so that whatever drifts on the machine over a sweep (heat, other load)
falls on every point alike instead of on its last repeats. `repeats: auto` plans its first rounds
the same way and each later round on its own (round_points), once the runner decides to train it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.errors import UserError
from pipeline.settings.config import DEFAULTS, KEYS, GridSpec, RunConfig


@dataclass(frozen=True)
class GridPoint:
    index: int  # 1-based position in the sweep's order (repeats interleaved)
    config: RunConfig
    name: str  # what varies, device first: e.g. "cpu bs1000 w0"; with repeats, "cpu bs1000 w0 r2"
    repeat: int = 1  # which repeat of its settings this is, from 1


# `pipeline run` refuses a grid of more points than this unless given --max-points: a grid that
# big is most likely a typo (a list of seeds pasted into every key), and each point is a training
# run. `validate` and `--dry-run` count any grid without expanding it and show its first points.
MAX_POINTS = 10_000
SHOWN_POINTS = 50


def grid_size(spec: GridSpec) -> int:
    """Number of distinct points (settings), without expanding."""
    return math.prod(len(values) for _, values in spec.axes)


def run_count(spec: GridSpec) -> int:
    """Number of runs a sweep of `spec` trains (at most, with `repeats: auto`): points x repeats,
    without expanding."""
    return grid_size(spec) * spec.most_repeats


def check_size(spec: GridSpec, max_points: int = MAX_POINTS) -> int:
    """The sweep's run count; UserError naming the count, the limit and the option when it is past
    `max_points` (which counts runs: each repeat is a training run)."""
    size = run_count(spec)
    if size > max_points:
        most = f"up to {spec.most_repeats} repeats (auto)" if spec.auto_repeats else f"{spec.most_repeats} repeats"
        what = (
            f"{size} runs ({grid_size(spec)} grid points x {most})" if spec.most_repeats > 1 else f"{size} grid points"
        )
        raise UserError(
            f"{spec.path}: {what} is more than --max-points {max_points}; pass "
            f"--max-points {size} to train them all, or make the grid smaller "
            f"(`pipeline validate {spec.path}` counts it)"
        )
    return size


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def short(key: str, value: Any) -> str:
    """One setting as a run name shows it (config.Key.name), short enough to read where the MLflow UI
    cuts names (about 16 characters): cpu, bs1000, w0, lr0.01, noshuffle."""
    name = KEYS[key].name
    if isinstance(name, tuple):  # a flag's value, or its param as logged ("true")
        return name[0 if str(value).lower() == "true" else 1]
    return f"{name}{format_value(value)}"


def single_name(config: RunConfig) -> str:
    """A run's name outside a grid (`pipeline train`), as a grid names its points: the device, then
    each key set away from its default, in the table's order: "cpu", "cuda bs1000 w2 ep3"."""
    values = config.as_params()
    changed = [key for key in KEYS if key != "device" and values[key] != DEFAULTS[key]]
    return " ".join(short(key, values[key]) for key in ["device", *changed])


def expand(spec: GridSpec, limit: int | None = None) -> list[GridPoint]:
    """Every grid point (or the first `limit`), in deterministic file order."""
    return list(itertools.islice(iter_points(spec), limit))


def iter_points(spec: GridSpec) -> Iterator[GridPoint]:
    """The grid points one at a time, in deterministic file order, repeats interleaved (every
    point's repeat 1, then every point's repeat 2, ...): a huge grid is never held whole. With
    `repeats: auto` these are the first rounds; the runner plans each later one (round_points)."""
    for repeat in range(1, spec.repeats + 1):
        yield from round_points(spec, repeat)


def round_points(spec: GridSpec, repeat: int) -> Iterator[GridPoint]:
    """One round of the sweep: every point's `repeat`-th run, in file order, numbered after the
    rounds before it."""
    keys = [key for key, _ in spec.axes]
    # Names show what varies, led by the device whenever the grid names one (what this tool
    # compares); a one-point grid names itself after the keys it sets. Every setting is also a param.
    named = [key for key, values in spec.axes if len(values) > 1] or list(keys)
    if "device" in keys and "device" not in named:
        named.append("device")
    named.sort(key=lambda key: key != "device")  # stable: the others keep file order
    # Every run of a sweep that may repeat is named by its repeat, `repeats: auto`'s included.
    suffix = f" r{repeat}" if spec.most_repeats > 1 else ""
    first = (repeat - 1) * grid_size(spec)
    for position, combo in enumerate(itertools.product(*(values for _, values in spec.axes)), start=1):
        values = dict(zip(keys, combo))
        name = (" ".join(short(key, values[key]) for key in named) or "defaults") + suffix
        yield GridPoint(index=first + position, config=RunConfig(**values), name=name, repeat=repeat)


def config_hash(config: RunConfig, **identity: Any) -> str:
    """Stable short hash of a run's resolved settings plus any extra identity (e.g. data sizes)."""
    payload = json.dumps({"config": config.identity(), **identity}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
