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
from typing import Any

from pipeline.config import GridSpec, RunConfig


@dataclass(frozen=True)
class GridPoint:
    index: int  # 1-based position in the grid
    config: RunConfig
    name: str  # e.g. "batch_size=1000 num_workers=0 device=cpu"


def grid_size(spec: GridSpec) -> int:
    """Number of points, without expanding."""
    return math.prod(len(values) for _, values in spec.axes)


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def expand(spec: GridSpec) -> list[GridPoint]:
    """Every grid point, in deterministic file order."""
    keys = [key for key, _ in spec.axes]
    # Names show what varies; a one-point grid names itself after the keys it sets.
    named = [key for key, values in spec.axes if len(values) > 1] or keys
    points = []
    for index, combo in enumerate(itertools.product(*(values for _, values in spec.axes)), start=1):
        values = dict(zip(keys, combo))
        name = " ".join(f"{key}={format_value(values[key])}" for key in named) or "defaults"
        points.append(GridPoint(index=index, config=RunConfig(**values), name=name))
    return points


def config_hash(config: RunConfig, **identity: Any) -> str:
    """Stable short hash of a run's resolved settings plus any extra identity (e.g. data sizes)."""
    payload = json.dumps({"config": config.identity(), **identity}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
