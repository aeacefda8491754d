"""Grid expansion: a pure function from a validated GridSpec to an ordered list of grid points.

The order is the tutorial's `itertools.product` over an OrderedDict: the file's keys in file order,
the last key varying fastest. Keys the file does not mention take RunConfig's defaults.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any, Iterator

from pipeline.config import KEYS, GridSpec, RunConfig
from pipeline.errors import UserError


@dataclass(frozen=True)
class GridPoint:
    index: int  # 1-based position in the grid
    config: RunConfig
    name: str  # what varies, device first: e.g. "cpu bs1000 w0"


# `pipeline run` refuses a grid of more points than this unless given --max-points: a grid that
# big is most likely a typo (a list of seeds pasted into every key), and each point is a training
# run. `validate` and `--dry-run` count any grid without expanding it and show its first points.
MAX_POINTS = 10_000
SHOWN_POINTS = 50


def grid_size(spec: GridSpec) -> int:
    """Number of points, without expanding."""
    return math.prod(len(values) for _, values in spec.axes)


def check_size(spec: GridSpec, max_points: int = MAX_POINTS) -> int:
    """The grid's size; UserError naming the count, the limit and the option when it is past `max_points`."""
    size = grid_size(spec)
    if size > max_points:
        raise UserError(f"{spec.path}: {size} grid points is more than --max-points {max_points}; pass "
                        f"--max-points {size} to train them all, or make the grid smaller "
                        f"(`pipeline validate {spec.path}` counts it)")
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


def expand(spec: GridSpec, limit: int | None = None) -> list[GridPoint]:
    """Every grid point (or the first `limit`), in deterministic file order."""
    return list(itertools.islice(iter_points(spec), limit))


def iter_points(spec: GridSpec) -> Iterator[GridPoint]:
    """The grid points one at a time, in deterministic file order: a huge grid is never held whole."""
    keys = [key for key, _ in spec.axes]
    # Names show what varies, led by the device whenever the grid names one (what this tool
    # compares); a one-point grid names itself after the keys it sets. Every setting is also a param.
    named = [key for key, values in spec.axes if len(values) > 1] or list(keys)
    if "device" in keys and "device" not in named:
        named.append("device")
    named.sort(key=lambda key: key != "device")  # stable: the others keep file order
    for index, combo in enumerate(itertools.product(*(values for _, values in spec.axes)), start=1):
        values = dict(zip(keys, combo))
        name = " ".join(short(key, values[key]) for key in named) or "defaults"
        yield GridPoint(index=index, config=RunConfig(**values), name=name)


def config_hash(config: RunConfig, **identity: Any) -> str:
    """Stable short hash of a run's resolved settings plus any extra identity (e.g. data sizes)."""
    payload = json.dumps({"config": config.identity(), **identity}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
