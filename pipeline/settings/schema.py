"""The JSON Schema of a grid file, built from the one table of grid keys (pipeline.settings.config.KEYS), so
that an editor can check a grid while it is written (`pipeline schema`, and the committed
pipeline/examples/grid.schema.json that the example grids name in their first line).

What the schema can say, it takes from the code: the grid keys, their help and defaults; each
value's bounds from the check the loader runs on it (config.Check: the grid keys' checks, the data
sizes' and the numeric settings', each with its `schema()`), so a key cannot be added without
them; the top-level and `data.` keys (`config.settable_keys()`); the target metrics
(`target.METRICS`). tests/test_schema.py feeds the same values to the loader and the schema, so
that a check and its schema cannot drift apart unnoticed.

The schema is an editor's first line, never the judge: `pipeline validate` is. It may accept what
the loader refuses (a number written as text, such as `"-1"`, is checked only by the loader; so
are rules that tie keys together, such as `data_on_device` with `num_workers: 0`), but it must not
refuse a grid the loader accepts. Never imports torch or mlflow.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.base.names import MAX_NAME_LENGTH
from pipeline.measures.target import ACCURACIES, METRICS
from pipeline.settings.config import (
    AUTO,
    DATA_SIZE,
    DEFAULT_MAX_REPEATS,
    DEFAULT_QUALITY_MARGIN,
    DEFAULTS,
    KEYS,
    SETTABLE,
    SETTING_CHECKS,
    number_schema,
    settable_keys,
    words_schema,
)

# Draft 7: the newest draft the VS Code YAML extension's language server supports.
DRAFT = "http://json-schema.org/draft-07/schema#"
FILE_NAME = "grid.schema.json"  # beside the example grids (pipeline init writes it too)
MODELINE = f"# yaml-language-server: $schema={FILE_NAME}"

BOOLEAN = {"type": "boolean"}
NULL = {"type": "null"}


def _grid_key(name: str) -> dict[str, Any]:
    """A grid key: one value, or a non-empty list of distinct values (a scalar is a one-element list).
    The value's bounds are its check's (config.Check.schema), the check the loader runs."""
    value = KEYS[name].check.schema()
    return {
        "description": KEYS[name].help,
        "default": [DEFAULTS[name]],
        "anyOf": [value, {"type": "array", "items": value, "minItems": 1, "uniqueItems": True}],
    }


def _data() -> dict[str, Any]:
    size = DATA_SIZE.schema()
    values = {
        "root": {
            "description": "Folder with the Fashion-MNIST IDX files, relative to the grid file (default: search).",
            "anyOf": [{"type": "string", "pattern": r"\S"}, {"type": "number"}, NULL],
        },
        "train_size": {"description": "The first N training images (default: all 60000).", "anyOf": [size, NULL]},
        "test_size": {"description": "The first N test images (default: all 10000).", "anyOf": [size, NULL]},
    }
    _same_keys("data.", values, [key.removeprefix("data.") for key in settable_keys() if key.startswith("data.")])
    return {
        "description": "Where the data comes from and how much of it is used.",
        "type": ["object", "null"],
        "properties": values,
        "additionalProperties": False,
    }


def _target() -> dict[str, Any]:
    # An accuracy is reached at or above a threshold in (0, 1], a loss at or below one above 0.
    thresholds = {
        metric: number_schema(exclusive_minimum=0, maximum=1)
        if metric in ACCURACIES
        else number_schema(exclusive_minimum=0)
        for metric in METRICS
    }
    return {
        "description": "Time each run to this quality: one metric and its threshold, e.g. {test_accuracy: 0.85}.",
        "anyOf": [
            {
                "type": "object",
                "properties": thresholds,
                "additionalProperties": False,
                "minProperties": 1,
                "maxProperties": 1,
            },
            NULL,
        ],
    }


def _top_level() -> dict[str, dict[str, Any]]:
    top = {
        "experiment": {
            "description": "MLflow experiment name (default: the file's name).",
            "anyOf": [
                {"type": "string", "pattern": r"\S", "maxLength": MAX_NAME_LENGTH},
                {"type": "number"},
                NULL,
            ],
        },
        "data": _data(),
        "grid": {
            "description": "Each setting and the values to try; every combination is one run.",
            "type": ["object", "null"],
            "properties": {name: _grid_key(name) for name in KEYS},
            "additionalProperties": False,
        },
        "checkpoint": {
            "description": "Save model and optimizer state each epoch; an interrupted point resumes from it.",
            "default": False,
            **BOOLEAN,
        },
        "repeats": {
            "description": "Train each point N times, interleaved; or auto: rounds until every speedup is clear.",
            "default": 1,
            "anyOf": [SETTING_CHECKS["repeats"].schema(), words_schema(AUTO)],
        },
        "max_repeats": {
            "description": "With repeats: auto, the most rounds.",
            "default": DEFAULT_MAX_REPEATS,
            "anyOf": [SETTING_CHECKS["max_repeats"].schema(), NULL],
        },
        "half_width": {
            "description": "With repeats: auto, also stop once every speedup's 95% interval is within "
            "this share of its estimate.",
            "anyOf": [SETTING_CHECKS["half_width"].schema(), NULL],
        },
        "quality_margin": {
            "description": "The test accuracy (absolute) a faster setting may lose and still win.",
            "default": DEFAULT_QUALITY_MARGIN,
            **SETTING_CHECKS["quality_margin"].schema(),
        },
        "target": _target(),
        "stop_at_target": {
            "description": "End each run at the epoch that reaches the target (epochs is the cap).",
            "default": False,
            **BOOLEAN,
        },
    }
    _same_keys("", top, [*SETTABLE, "data", "grid", "target"])
    return top


def _same_keys(where: str, described: dict[str, Any], loader_keys: list[str]) -> None:
    """The schema describes exactly the keys the loader takes, or building it fails naming the difference."""
    if set(described) != set(loader_keys):
        raise LookupError(
            f"the schema's {where}keys differ from the loader's: "
            f"{sorted(set(described) ^ set(loader_keys))}; update pipeline/settings/schema.py"
        )


def _requires(key: str, when: dict[str, Any], needs: str, value: dict[str, Any]) -> dict[str, Any]:
    """`key` matching `when` requires `needs` matching `value`: the loader refuses it otherwise."""
    return {
        "if": {"required": [key], "properties": {key: when}},
        "then": {"required": [needs], "properties": {needs: value}},
    }


def grid_schema() -> dict[str, Any]:
    """The JSON Schema (draft 7) of a grid file."""
    return {
        "$schema": DRAFT,
        "title": "pipeline grid file",
        "description": "A grid of training runs for `pipeline run`; `pipeline validate` is the full check.",
        "type": "object",
        "properties": _top_level(),
        "additionalProperties": False,
        # The rules between top-level keys that the loader checks, so far as JSON Schema says them.
        "allOf": [
            _requires("max_repeats", {"not": NULL}, "repeats", words_schema(AUTO)),
            _requires("half_width", {"not": NULL}, "repeats", words_schema(AUTO)),
            _requires("stop_at_target", {"const": True}, "target", {"type": "object"}),
        ],
    }


def schema_text() -> str:
    """The schema as the committed file holds it (and `pipeline schema` prints it)."""
    return json.dumps(grid_schema(), indent=2) + "\n"
