"""One table of grid keys (config.KEYS, RunConfig's field metadata): every place that lists grid
keys follows it, and a key that the table misses somewhere fails here, not silently in a sweep."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from conftest import REPO
from pipeline.cli import main
from pipeline.compare import build, display_frame
from pipeline.config import DEFAULTS, KEYS, load_grid
from pipeline.grid import expand, format_value
from pipeline.records import RunRecord, SweepRecord

# Two values of every grid key, as a grid file writes them. A key added to RunConfig needs a line
# here (test_every_key_has_two_values_here), and then every test below covers it.
TWO_VALUES: dict[str, tuple] = {
    "lr": (0.01, 0.1),
    "batch_size": (64, 128),
    "num_workers": (0, 2),
    "device": ("cpu", "cuda"),
    "epochs": (1, 3),
    "seed": (0, 7),
    "shuffle": (True, False),
    "gpus_per_run": (1, 0.5),
    "data_on_device": (False, True),
    "cuda_graph": (False, True),
    "precision": ("fp32", "bf16"),
    "compile": (False, True),
    "prefetch": (False, True),
}


def test_every_key_has_two_values_here():
    assert list(TWO_VALUES) == list(KEYS)


@pytest.mark.parametrize("key", list(TWO_VALUES))
def test_every_key_names_its_runs(write_grid, key):
    """Run names come from the table's short names: two values of any key make two run names."""
    spec = load_grid(write_grid(yaml.safe_dump({"grid": {key: list(TWO_VALUES[key])}})))
    names = [point.name for point in expand(spec)]
    assert len(names) == 2 and names[0] != names[1], names


def _run(run_id: str, device: str, seconds: float, params: dict[str, str]) -> RunRecord:
    return RunRecord(run_id, run_id, {"batch_size": "64", **params}, {"test_accuracy": 0.8},
                     {"pipeline.device": device}, histories={"epoch_duration_s": [9.0, seconds]})


@pytest.mark.parametrize("key", [k for k in TWO_VALUES if KEYS[k].twin])
def test_runs_that_differ_in_a_twin_key_are_no_twins(key):
    """A cpu and a cuda run differing in a setting measure different things: no device speedup
    (seeds aside, whose repeats compare by their medians). The same two runs equal in it are twins."""
    first, second = (format_value(v) for v in TWO_VALUES[key])
    apart = build(SweepRecord("p", "p", "1", "x", [_run("c", "cpu", 4.0, {key: first}),
                                                   _run("g", "cuda:0", 1.0, {key: second})]))
    assert apart.table["speedup"].isna().all()
    assert key in apart.varying
    together = build(SweepRecord("p", "p", "1", "x", [_run("c", "cpu", 4.0, {key: first}),
                                                      _run("g", "cuda:0", 1.0, {key: first})]))
    assert together.table.set_index("run_id").loc["g", "speedup"] == 4.0


@pytest.mark.parametrize("key", [k for k in TWO_VALUES if KEYS[k].shown == "varying"])
def test_the_table_shows_a_setting_where_runs_differ_in_it(key):
    first, second = (format_value(v) for v in TWO_VALUES[key])
    runs = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: second})]
    assert key in display_frame(build(SweepRecord("p", "p", "1", "x", runs))).columns
    same = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: first})]
    assert key not in display_frame(build(SweepRecord("p", "p", "1", "x", same))).columns


def test_runs_recorded_before_a_later_key_are_at_its_default():
    """A run logged before a later key existed has no param for it: the comparison reads its default,
    so it stays the twin of a new run at the default and no twin of one that sets the key."""
    for key in (k for k in KEYS if KEYS[k].later):
        default = format_value(DEFAULTS[key])
        other = next(format_value(v) for v in TWO_VALUES[key] if format_value(v) != default)
        old, new = _run("old", "cpu", 4.0, {}), _run("new", "cuda:0", 1.0, {key: default})
        assert build(SweepRecord("p", "p", "1", "x", [old, new])).table.set_index("run_id").loc["new", "speedup"] == 4.0
        changed = _run("new", "cuda:0", 1.0, {key: other})
        assert math.isnan(build(SweepRecord("p", "p", "1", "x", [old, changed])).table.set_index("run_id").loc[
            "new", "speedup"]), key


def test_chart_bars_split_by_the_variant_keys_only():
    from pipeline.charts import variants

    for key in TWO_VALUES:
        first, second = (format_value(v) for v in TWO_VALUES[key])
        runs = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: second})]
        labels = variants(build(SweepRecord("p", "p", "1", "x", runs)))
        assert (labels[0] != labels[1]) == (KEYS[key].variant and KEYS[key].twin), (key, labels)


def test_pipeline_train_offers_an_option_per_setting_of_the_table():
    options = {p.name: p for p in main.commands["train"].params}
    for name, key in KEYS.items():
        assert (name in options) == key.train, name
        if key.train:
            assert options[name].opts == ["--" + name.replace("_", "-")] and options[name].default == DEFAULTS[name]


def test_mlproject_train_declares_every_setting_of_the_table():
    """MLflow reads MLproject as written: its train entry point must declare each setting that
    `pipeline train` takes, with the same default, and pass it on."""
    spec = yaml.safe_load((REPO / "MLproject").read_text())["entry_points"]["train"]
    declared = {name: p["default"] for name, p in spec["parameters"].items() if name in KEYS}
    assert set(declared) == {name for name, key in KEYS.items() if key.train}
    for name, default in declared.items():
        assert str(default) == format_value(DEFAULTS[name]), name
        assert f"--{name.replace('_', '-')} {{{name}}}" in spec["command"], name


def test_the_readme_lists_every_grid_key_with_its_default():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| key | values | default |"):].split("\n\n")[0]
    rows = dict(re.findall(r"^\| `(\w+)` \|.*\| ([^|]+) \|$", table, re.MULTILINE))
    assert set(rows) == set(KEYS)
    assert {key: text.strip() for key, text in rows.items()} == {key: format_value(DEFAULTS[key]) for key in KEYS}
