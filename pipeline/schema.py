"""The JSON Schema of a grid file, built from the one table of grid keys (pipeline.config.KEYS), so
that an editor can check a grid while it is written (`pipeline schema`, and the committed
pipeline/examples/grid.schema.json that the example grids name in their first line).

What the schema can say, it takes from the code: the grid keys, their types (RunConfig's field
types), their help and defaults; the top-level and `data.` keys (`config.settable_keys()`); the
target metrics (`target.METRICS`). A value's bounds live in config.py as code (a check function
per key), so they are restated below in JSON Schema's words, and tests/test_schema.py feeds the
same values to both so that the two cannot drift apart unnoticed. A key added to RunConfig without
its bounds here is an error when the schema is built, not a schema that silently accepts anything.

The schema is an editor's first line, never the judge: `pipeline validate` is. It may accept what
the loader refuses (a number written as text, such as `"-1"`, is checked only by the loader; so
are rules that tie keys together, such as `data_on_device` with `num_workers: 0`), but it must not
refuse a grid the loader accepts. Never imports torch or mlflow.
"""

from __future__ import annotations

import json
from typing import Any, get_type_hints

from pipeline.config import (AUTO, DEFAULT_MAX_REPEATS, DEFAULT_QUALITY_MARGIN, DEFAULTS, KEYS, MAX_REPEATS, MIN_RUNS,
                             PRECISIONS, SETTABLE, RunConfig, settable_keys)
from pipeline.target import ACCURACIES, METRICS

# Draft 7: the newest draft the VS Code YAML extension's language server supports.
DRAFT = "http://json-schema.org/draft-07/schema#"
FILE_NAME = "grid.schema.json"  # beside the example grids (pipeline init writes it too)
MODELINE = f"# yaml-language-server: $schema={FILE_NAME}"

# YAML 1.1 (PyYAML, the loader) reads `1e-3` as text, and the loader turns text into a number
# deliberately; an editor reads YAML 1.2, where it is a number. Numbers written as text are
# accepted here, and their bounds are the loader's to check.
NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


def _any_case(word: str) -> str:
    """A regex for `word` in any case: the loader lower-cases words (`CPU` is `cpu`), and JSON
    Schema's regexes (ECMA 262) have no case-insensitive flag."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


def _text(*alternatives: str) -> dict[str, Any]:
    """A string matching one of the regexes, with the blanks around it the loader strips."""
    return {"type": "string", "pattern": rf"^\s*({'|'.join(alternatives)})\s*$"}


def _words(*words: str) -> dict[str, Any]:
    return _text(*map(_any_case, words))


def _number(minimum: float | None = None, exclusive_minimum: float | None = None,
            maximum: float | None = None, exclusive_maximum: float | None = None,
            integer: bool = False) -> dict[str, Any]:
    """A number within bounds, or a number written as text (checked by the loader)."""
    bounds = {"minimum": minimum, "exclusiveMinimum": exclusive_minimum, "maximum": maximum,
              "exclusiveMaximum": exclusive_maximum}
    number = {"type": "integer" if integer else "number", **{k: v for k, v in bounds.items() if v is not None}}
    return {"anyOf": [number, {"type": "string", "pattern": NUMBER_TEXT}]}


def _integer(minimum: int, maximum: int) -> dict[str, Any]:
    return _number(minimum=minimum, maximum=maximum, integer=True)


BOOLEAN = {"type": "boolean"}
NULL = {"type": "null"}

# The bounds of each grid key that is not a plain true/false: what its check in config.py accepts.
# tests/test_schema.py probes each key with the same values through both.
GRID_VALUES: dict[str, dict[str, Any]] = {
    "lr": _number(exclusive_minimum=0),
    "batch_size": _integer(1, 2**31 - 1),
    "num_workers": _integer(0, 1024),
    "device": _text(*map(_any_case, ("cpu", "mps", "auto")), _any_case("cuda") + r"(:\d+)?"),  # DEVICE_PATTERN
    "epochs": _integer(1, 1_000_000),
    "seed": _integer(0, 2**32 - 1),
    "gpus_per_run": _number(exclusive_minimum=0),
    "precision": _words(*PRECISIONS),
    "weight_decay": _number(minimum=0),
    "threads": _integer(0, 1024),
}


def _grid_value(name: str) -> dict[str, Any]:
    """One grid key's value: a boolean key by its field type, any other by its bounds above."""
    if get_type_hints(RunConfig)[name] is bool:
        return dict(BOOLEAN)
    if name not in GRID_VALUES:
        raise LookupError(f"grid key {name!r} has no bounds in pipeline/schema.py GRID_VALUES; add what its "
                          "check in config.py accepts")
    return GRID_VALUES[name]


def _grid_key(name: str) -> dict[str, Any]:
    """A grid key: one value, or a non-empty list of distinct values (a scalar is a one-element list)."""
    value = _grid_value(name)
    return {"description": KEYS[name].help, "default": [DEFAULTS[name]],
            "anyOf": [value, {"type": "array", "items": value, "minItems": 1, "uniqueItems": True}]}


def _data() -> dict[str, Any]:
    size = _integer(1, 2**31 - 1)
    values = {
        "root": {"description": "Folder with the Fashion-MNIST IDX files, relative to the grid file "
                                "(default: search).",
                 "anyOf": [{"type": "string", "pattern": r"\S"}, {"type": "number"}, NULL]},
        "train_size": {"description": "The first N training images (default: all 60000).", "anyOf": [size, NULL]},
        "test_size": {"description": "The first N test images (default: all 10000).", "anyOf": [size, NULL]},
    }
    _same_keys("data.", values, [key.removeprefix("data.") for key in settable_keys() if key.startswith("data.")])
    return {"description": "Where the data comes from and how much of it is used.", "type": ["object", "null"],
            "properties": values, "additionalProperties": False}


def _target() -> dict[str, Any]:
    # An accuracy is reached at or above a threshold in (0, 1], a loss at or below one above 0.
    thresholds = {metric: _number(exclusive_minimum=0, maximum=1) if metric in ACCURACIES else
                  _number(exclusive_minimum=0) for metric in METRICS}
    return {"description": "Time each run to this quality: one metric and its threshold, e.g. {test_accuracy: 0.85}.",
            "anyOf": [{"type": "object", "properties": thresholds, "additionalProperties": False,
                       "minProperties": 1, "maxProperties": 1}, NULL]}


def _top_level() -> dict[str, dict[str, Any]]:
    from pipeline.store import MAX_EXPERIMENT_NAME_LENGTH

    top = {
        "experiment": {"description": "MLflow experiment name (default: the file's name).",
                       "anyOf": [{"type": "string", "pattern": r"\S", "maxLength": MAX_EXPERIMENT_NAME_LENGTH},
                                 {"type": "number"}, NULL]},
        "data": _data(),
        "grid": {"description": "Each setting and the values to try; every combination is one run.",
                 "type": ["object", "null"], "properties": {name: _grid_key(name) for name in KEYS},
                 "additionalProperties": False},
        "checkpoint": {"description": "Save model and optimizer state each epoch; an interrupted point resumes "
                                      "from it.", "default": False, **BOOLEAN},
        "repeats": {"description": "Train each point N times, interleaved; or auto: rounds until every speedup "
                                   "is clear.", "default": 1,
                    "anyOf": [_integer(1, MAX_REPEATS), _words(AUTO)]},
        "max_repeats": {"description": "With repeats: auto, the most rounds.", "default": DEFAULT_MAX_REPEATS,
                        "anyOf": [_integer(MIN_RUNS, MAX_REPEATS), NULL]},
        "half_width": {"description": "With repeats: auto, also stop once every speedup's 95% interval is within "
                                      "this share of its estimate.",
                       "anyOf": [_number(exclusive_minimum=0, exclusive_maximum=1), NULL]},
        "quality_margin": {"description": "The test accuracy (absolute) a faster setting may lose and still win.",
                           "default": DEFAULT_QUALITY_MARGIN, **_number(minimum=0, exclusive_maximum=1)},
        "target": _target(),
        "stop_at_target": {"description": "End each run at the epoch that reaches the target (epochs is the cap).",
                           "default": False, **BOOLEAN},
    }
    _same_keys("", top, [*SETTABLE, "data", "grid", "target"])
    return top


def _same_keys(where: str, described: dict[str, Any], loader_keys: list[str]) -> None:
    """The schema describes exactly the keys the loader takes, or building it fails naming the difference."""
    if set(described) != set(loader_keys):
        raise LookupError(f"the schema's {where}keys differ from the loader's: "
                          f"{sorted(set(described) ^ set(loader_keys))}; update pipeline/schema.py")


def _requires(key: str, when: dict[str, Any], needs: str, value: dict[str, Any]) -> dict[str, Any]:
    """`key` matching `when` requires `needs` matching `value`: the loader refuses it otherwise."""
    return {"if": {"required": [key], "properties": {key: when}},
            "then": {"required": [needs], "properties": {needs: value}}}


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
        "allOf": [_requires("max_repeats", {"not": NULL}, "repeats", _words(AUTO)),
                  _requires("half_width", {"not": NULL}, "repeats", _words(AUTO)),
                  _requires("stop_at_target", {"const": True}, "target", {"type": "object"})],
    }


def schema_text() -> str:
    """The schema as the committed file holds it (and `pipeline schema` prints it)."""
    return json.dumps(grid_schema(), indent=2) + "\n"
