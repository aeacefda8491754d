"""The grid files' JSON Schema (pipeline.settings.schema): the committed file is what the code generates, it
accepts every shipped grid, it refuses the mistakes an editor should flag, and it never refuses a
value the grid loader accepts (probed key by key with the same values through both)."""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from conftest import invoke
from pipeline.errors import UserError
from pipeline.settings.config import KEYS, load_grid
from pipeline.settings.schema import FILE_NAME, MODELINE, grid_schema

EXAMPLES = resources.files("pipeline").joinpath("examples")  # the shipped grids (package data)


@pytest.fixture(scope="module")
def validator():
    schema = grid_schema()
    jsonschema.Draft7Validator.check_schema(schema)  # a well-formed draft-7 schema
    return jsonschema.Draft7Validator(schema)


def schema_accepts(validator, document: Any) -> bool:
    return not list(validator.iter_errors(document))


def loader_accepts(document: Any) -> bool:
    try:
        load_grid(document)
    except UserError:
        return False
    return True


def test_the_committed_schema_is_the_generated_one():
    printed = invoke("schema")
    assert printed.exit_code == 0
    assert json.loads(printed.output) == grid_schema()
    committed = EXAMPLES.joinpath(FILE_NAME).read_text(encoding="utf-8")
    assert committed == printed.output, "regenerate it: pipeline schema > pipeline/examples/grid.schema.json"


@pytest.mark.parametrize("name", sorted(item.name for item in EXAMPLES.iterdir() if item.name.endswith(".yaml")))
def test_every_shipped_grid_names_the_schema_and_passes_it(validator, name):
    text = EXAMPLES.joinpath(name).read_text(encoding="utf-8")
    assert text.splitlines()[0] == MODELINE  # relative to the grid: the schema file beside it
    errors = [error.message for error in validator.iter_errors(yaml.safe_load(text))]
    assert errors == []


# What an editor should flag, and `pipeline validate` refuses too.
BAD = {
    "unknown top-level key": "epoch: 3\n",
    "unknown grid key": "grid: {lrr: [0.01]}\n",
    "unknown data key": "data: {trainsize: 100}\n",
    "text for a number": "grid: {batch_size: [big]}\n",
    "text for a boolean": "grid: {shuffle: [sometimes]}\n",
    "a list of lists": "grid: {lr: [[0.01]]}\n",
    "no such device": "grid: {device: [gpu]}\n",
    "no such precision": "grid: {precision: [fp8]}\n",
    "below the minimum": "grid: {batch_size: [0]}\n",
    "above the maximum": "grid: {num_workers: [2000]}\n",
    "empty list": "grid: {epochs: []}\n",
    "repeated value": "grid: {lr: [0.01, 0.01]}\n",
    "null value": "grid: {lr: }\n",
    "checkpoint not a boolean": "checkpoint: sometimes\n",
    "repeats zero": "repeats: 0\n",
    "max_repeats without auto": "max_repeats: 4\n",
    "an accuracy above 1": "target: {test_accuracy: 1.5}\n",
    "two target metrics": "target: {test_accuracy: 0.8, test_loss: 0.4}\n",
    "stop without a target": "stop_at_target: true\n",
    "not a mapping": "- lr: 0.01\n",
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_the_schema_refuses_what_validate_refuses(validator, write_grid, text):
    assert not schema_accepts(validator, yaml.safe_load(text))
    result = invoke("validate", str(write_grid(text)))
    assert result.exit_code == 2, result.output


# Written the ways the loader accepts them, some of which a strict schema would wrongly flag.
GOOD = {
    "scalars for lists": "grid: {lr: 0.01, batch_size: 100, device: cpu}\n",
    "1e-3, text to YAML 1.1": "grid: {lr: [1e-3, 0.01]}\n",
    "words in any case": "grid: {device: [CUDA:1, Cpu], precision: [BF16]}\n",
    "empty sections": "experiment: 42\ndata:\ngrid:\n",
    "auto repeats": "repeats: auto\nmax_repeats: 4\nhalf_width: 0.1\n",
    "target and stop": "target: {test_loss: 0.4}\nstop_at_target: true\n",
    "every section": (
        "experiment: x\ndata: {root: null, train_size: 100, test_size: 50}\ncheckpoint: true\n"
        "repeats: 2\nquality_margin: 0\ngrid: {seed: [0, 1], weight_decay: [0, 1.0e-4]}\n"
    ),
}


@pytest.mark.parametrize("text", GOOD.values(), ids=GOOD.keys())
def test_the_schema_accepts_what_validate_accepts(validator, write_grid, text):
    errors = [error.message for error in validator.iter_errors(yaml.safe_load(text))]
    assert errors == []
    result = invoke("validate", str(write_grid(text)))
    assert result.exit_code == 0, result.output


PROBES = [
    0,
    1,
    -1,
    0.5,
    1.0,
    2,
    2.5,
    8,
    1024,
    1025,
    10_000,
    10_001,
    1_000_000,
    1_000_001,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    1e-3,
    True,
    False,
    None,
    "",
    " ",
    "abc",
    "1e-3",
    "0.5",
    "-1",
    "100",
    "auto",
    "AUTO",
    "cpu",
    "CUDA:1",
    "cuda:x",
    "gpu",
    "mps",
    " fp16 ",
    "bf16",
    "fp8",
    [0.5],
    {"a": 1},
]


def _documents() -> list[tuple[Any, dict]]:
    """(probed value, grid document) for each probe in each place a value goes."""
    places = [lambda v, k=key: {"grid": {k: [v]}} for key in KEYS]
    places += [
        lambda v: {"experiment": v},
        lambda v: {"data": {"root": v}},
        lambda v: {"data": {"train_size": v}},
        lambda v: {"checkpoint": v},
        lambda v: {"repeats": v},
        lambda v: {"repeats": "auto", "max_repeats": v},
        lambda v: {"repeats": "auto", "half_width": v},
        lambda v: {"quality_margin": v},
        lambda v: {"target": {"test_accuracy": v}},
        lambda v: {"target": {"train_loss": v}},
        lambda v: {"target": {"test_accuracy": 0.8}, "stop_at_target": v},
    ]
    return [(value, place(value)) for place in places for value in PROBES]


def _number_text(value: Any) -> bool:
    """Text the loader reads as a number: the schema accepts it and leaves its bounds to the loader."""
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


def test_the_schema_and_the_loader_agree_on_every_probe(validator):
    false_alarms, missed = [], []
    for value, document in _documents():
        by_loader, by_schema = loader_accepts(document), schema_accepts(validator, document)
        if by_loader and not by_schema:
            false_alarms.append(document)
        if by_schema and not by_loader and not _number_text(value):
            missed.append(document)
    assert false_alarms == []  # an editor must never flag a grid that runs
    assert missed == []
