"""One table of grid keys (config.KEYS, RunConfig's field metadata): every place that lists grid
keys follows it, and a key that the table misses somewhere fails here, not silently in a sweep."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, children, invoke, runs_of
from pipeline.analysis.compare import CompareOptions, build
from pipeline.base import names
from pipeline.base.runs import RunRecord, SweepRecord
from pipeline.cli import main
from pipeline.errors import UserError
from pipeline.present.tables import display_frame
from pipeline.settings.config import DEFAULTS, KEYS, RunConfig, load_grid
from pipeline.settings.grid import config_hash, expand, format_value

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
    "weight_decay": (0, 0.01),
    "threads": (0, 1),
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
    return RunRecord(
        run_id,
        run_id,
        {"batch_size": "64", **params},
        {"test_accuracy": 0.8},
        {"pipeline.device": device},
        histories={"epoch_duration_s": [9.0, seconds]},
    )


@pytest.mark.parametrize("key", [k for k in TWO_VALUES if KEYS[k].twin])
def test_runs_that_differ_in_a_twin_key_are_no_twins(key):
    """A cpu and a cuda run differing in a setting measure different things: no device speedup
    (seeds aside, whose repeats compare by their medians). The same two runs equal in it are twins."""
    first, second = (format_value(v) for v in TWO_VALUES[key])
    apart = build(
        SweepRecord("p", "p", "1", "x", [_run("c", "cpu", 4.0, {key: first}), _run("g", "cuda:0", 1.0, {key: second})])
    )
    assert apart.table["speedup"].isna().all()
    assert key in apart.varying
    together = build(
        SweepRecord("p", "p", "1", "x", [_run("c", "cpu", 4.0, {key: first}), _run("g", "cuda:0", 1.0, {key: first})])
    )
    assert together.table.set_index("run_ids").loc["g", "speedup"] == 4.0


@pytest.mark.parametrize("key", [k for k in TWO_VALUES if KEYS[k].shown == "varying"])
def test_the_table_shows_a_setting_where_runs_differ_in_it(key):
    first, second = (format_value(v) for v in TWO_VALUES[key])
    runs = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: second})]
    assert key in display_frame(build(SweepRecord("p", "p", "1", "x", runs))).columns
    same = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: first})]
    assert key not in display_frame(build(SweepRecord("p", "p", "1", "x", same))).columns


@pytest.mark.parametrize("key", [k for k in TWO_VALUES if KEYS[k].column])
def test_a_worded_key_has_its_column_once_a_run_sets_it(key):
    """A key with words of its own (Key.column) shows under its heading, in its words, once a run sets
    it, and not at all while no run does."""
    heading, on, off = KEYS[key].column
    runs = [_run("a", "cpu", 4.0, {key: "true"}), _run("b", "cpu", 5.0, {key: "false"})]
    comparison = build(SweepRecord("p", "p", "1", "x", runs))
    shown = display_frame(comparison).set_index(comparison.table["run_ids"])
    assert (shown.loc["a", heading], shown.loc["b", heading]) == (on, off)
    unset = [_run("a", "cpu", 4.0, {key: "false"}), _run("b", "cuda:0", 5.0, {key: "false"})]
    assert heading not in display_frame(build(SweepRecord("p", "p", "1", "x", unset))).columns


@pytest.mark.parametrize("key", list(TWO_VALUES))
def test_a_run_records_each_key_where_it_means_something(key):
    """Every key is a param of a run, but one kept to a device type (Key.device_only: gpus_per_run on
    cuda), which a run on another device does not record."""
    from pipeline.execution.point import DataRef, PointJob, params_of
    from pipeline.settings.grid import GridPoint

    def params(device: str) -> dict:
        job = PointJob(GridPoint(1, RunConfig(), "x"), device, "k", "sqlite://", "1", "x", DataRef("data"))
        return params_of(job)

    only = KEYS[key].device_only
    assert key in params("cuda:0")
    assert (key in params("cpu")) == (not only or "cpu".startswith(only))


@pytest.mark.parametrize("key", [k for k in TWO_VALUES if KEYS[k].twin])
def test_versus_compares_on_every_twin_key(key):
    """`--versus KEY=VALUE` takes every key twins may differ in: each row over its twin at VALUE."""
    first, second = (format_value(v) for v in TWO_VALUES[key])
    runs = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: second})]
    table = build(SweepRecord("p", "p", "1", "x", runs), CompareOptions(versus=f"{key}={first}")).table
    assert table.set_index("run_ids").loc["b", "versus_speedup"] == 0.8


def test_versus_says_why_a_key_that_is_no_twin_key_cannot_be_compared_on():
    runs = [_run("a", "cpu", 4.0, {"gpus_per_run": "1"}), _run("b", "cpu", 5.0, {"gpus_per_run": "0.5"})]
    with pytest.raises(
        UserError,
        match="runs that differ only in gpus_per_run are one setting; compare on one of device, lr, batch_size",
    ):
        build(SweepRecord("p", "p", "1", "x", runs), CompareOptions(versus="gpus_per_run=1"))


def test_runs_recorded_before_a_later_key_are_at_its_default():
    """A run logged before a later key existed has no param for it: the comparison reads its default,
    so it stays the twin of a new run at the default and no twin of one that sets the key."""
    for key in (k for k in KEYS if KEYS[k].later):
        default = format_value(DEFAULTS[key])
        other = next(format_value(v) for v in TWO_VALUES[key] if format_value(v) != default)
        old, new = _run("old", "cpu", 4.0, {}), _run("new", "cuda:0", 1.0, {key: default})
        table = build(SweepRecord("p", "p", "1", "x", [old, new])).table.set_index("run_ids")
        assert table.loc["new", "speedup"] == 4.0
        changed = _run("new", "cuda:0", 1.0, {key: other})
        assert math.isnan(
            build(SweepRecord("p", "p", "1", "x", [old, changed])).table.set_index("run_ids").loc["new", "speedup"]
        ), key


def test_every_setting_is_a_bar_of_its_own_in_the_epoch_chart():
    """Settings that differ in any key have a bar each, never averaged into one; runs that differ only
    in a key that is no twin key (where a point runs) are one setting: one row, one bar."""
    from pipeline.present.charts import EPOCH_DURATION_PNG, plan

    for key in TWO_VALUES:
        first, second = (format_value(v) for v in TWO_VALUES[key])
        runs = [_run("a", "cpu", 4.0, {key: first}), _run("b", "cpu", 5.0, {key: second})]
        comparison = build(SweepRecord("p", "p", "1", "x", runs))
        bars = plan(comparison)[EPOCH_DURATION_PNG]["bars"]
        assert len(bars) == len(comparison.table) == (2 if KEYS[key].twin else 1), key
        assert len({bar["label"] for bar in bars}) == len(bars), (key, bars)


def test_pipeline_train_offers_an_option_per_setting_of_the_table():
    options = {p.name: p for p in main.commands["train"].params}
    for name, key in KEYS.items():
        assert (name in options) == key.train, name
        if key.train:
            option = options[name]  # a boolean's default is written as in a grid ("true"), which Click converts
            assert option.opts == ["--" + name.replace("_", "-")]
            assert option.type.convert(option.default, option, None) == DEFAULTS[name], name


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
    table = readme[readme.index("| key | values | default |") :].split("\n\n")[0]
    rows = dict(re.findall(r"^\| `(\w+)` \|.*\| ([^|]+) \|$", table, re.MULTILINE))
    assert set(rows) == set(KEYS)
    assert {key: text.strip() for key, text in rows.items()} == {key: format_value(DEFAULTS[key]) for key in KEYS}


# --- weight_decay: a key added through the table alone ----------------------------------------------

# Run keys computed by the code at d77a485, before weight_decay existed, with the identity a sweep
# gives them (the data's source and sizes, the host, the hardware). A grid that does not set
# weight_decay must keep them, or every point recorded before it would be trained again.
RECORDED = [
    (
        RunConfig(lr=0.01, batch_size=1000, num_workers=1, device="cuda", epochs=1),
        {
            "source": "fashion-mnist",
            "train_size": 60000,
            "test_size": 10000,
            "host": "gpu-box",
            "hardware": "NVIDIA H200",
        },
        "8920cd0181b76db7",
    ),
    (
        RunConfig(batch_size=64, epochs=2, device="cpu", precision="bf16", compile=True, seed=3),
        {"source": "/data/small", "train_size": 512, "test_size": 256, "host": "laptop", "hardware": "AMD EPYC 7B13"},
        "a07a48f81eb8cbc9",
    ),
    (
        RunConfig(batch_size=20000, device="cuda", cuda_graph=True, prefetch=True, shuffle=False),
        {
            "source": "fashion-mnist",
            "train_size": 60000,
            "test_size": 10000,
            "host": "gpu-box",
            "hardware": "NVIDIA H200",
        },
        "fd3d1c60b8d5be73",
    ),
]


@pytest.mark.parametrize("config, identity, recorded", RECORDED)
def test_grids_without_weight_decay_keep_the_run_keys_recorded_before_it(config, identity, recorded):
    assert config_hash(config, **identity) == recorded
    assert config_hash(config.__class__(**{**config.as_params(), "weight_decay": 0.0}), **identity) == recorded
    assert config_hash(config.__class__(**{**config.as_params(), "weight_decay": 1e-4}), **identity) != recorded
    assert config_hash(config.__class__(**{**config.as_params(), "threads": 0}), **identity) == recorded
    assert config_hash(config.__class__(**{**config.as_params(), "threads": 1}), **identity) != recorded


def test_weight_decay_from_a_grid_file_to_the_comparison(write_grid, data_dir, tracking_uri):
    """A grid that sets weight_decay: each point trains with its own (Adam gets it: same seed, other
    numbers), is named and keyed by it, logs it as a param, and the comparison shows it. Its 0 point
    is the one a grid without the key makes: that grid finds it DONE and trains nothing."""
    grid = write_grid("experiment: wd\ngrid:\n  batch_size: [128]\n  device: [cpu]\n  weight_decay: [0, 0.5]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0, out.output
    runs = {run.info.run_name: run for run in children(runs_of(tracking_uri, "wd"))}
    assert set(runs) == {"cpu wd0", "cpu wd0.5"}
    plain, decayed = runs["cpu wd0"], runs["cpu wd0.5"]
    assert (plain.data.params["weight_decay"], decayed.data.params["weight_decay"]) == ("0.0", "0.5")
    assert plain.data.tags[names.TAG_RUN_KEY] != decayed.data.tags[names.TAG_RUN_KEY]
    assert plain.data.metrics["train_loss"] != decayed.data.metrics["train_loss"]

    out = invoke("compare", "--experiment", "wd", "--format", "csv", "--tracking-uri", tracking_uri)
    assert out.exit_code == 0, out.output
    rows = {row["run_name"]: row for row in csv.DictReader(io.StringIO(out.stdout))}
    assert (float(rows["cpu wd0"]["weight_decay"]), float(rows["cpu wd0.5"]["weight_decay"])) == (0.0, 0.5)
    out = invoke("compare", "--experiment", "wd", "--format", "markdown", "--tracking-uri", tracking_uri)
    assert out.stdout.splitlines()[0].startswith("| device | lr | batch_size | num_workers | epochs | weight_decay |")

    without = write_grid("experiment: wd\ngrid:\n  batch_size: [128]\n  device: [cpu]\n", "plain.yaml")
    out = invoke("run", str(without), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0 and "DONE" in out.output, out.output
    assert len(children(runs_of(tracking_uri, "wd"))) == 2  # nothing trained again


def test_pipeline_train_weight_decay(data_dir, tracking_uri):
    out = invoke(
        "train",
        "--device",
        "cpu",
        "--batch-size",
        "128",
        "--weight-decay",
        "1.0e-3",
        "--data-dir",
        str(data_dir),
        "--tracking-uri",
        tracking_uri,
        "--experiment",
        "one",
    )
    assert out.exit_code == 0, out.output
    (run,) = runs_of(tracking_uri, "one")
    assert run.data.params["weight_decay"] == "0.001" and run.info.status == "FINISHED"


# --- threads: torch's intra-op pool, a measurable setting -------------------------------------------


def test_threads_is_the_pool_a_run_trains_with_and_the_pool_comes_back(data_dir):
    """fit trains with `threads` threads (or torch's current pool at 0) and leaves torch's pool as it
    found it."""
    import torch

    from pipeline.training.data import load
    from pipeline.training.train import fit

    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    dataset = load(data_dir)
    for threads, expected in ((other, other), (0, before)):
        result = fit(RunConfig(threads=threads, batch_size=128, epochs=1, device="cpu"), dataset, torch.device("cpu"))
        assert result.threads == expected
        assert torch.get_num_threads() == before


def test_threads_from_a_grid_file_to_the_runs_tags(write_grid, data_dir, tracking_uri):
    """Each run records the pool it trained with (tag pipeline.torch_threads), whether the grid set
    `threads` or left torch's default; the two points are two settings, named by it."""
    import torch

    grid = write_grid("experiment: th\ngrid:\n  batch_size: [128]\n  device: [cpu]\n  threads: [0, 3]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0, out.output
    runs = {run.info.run_name: run for run in children(runs_of(tracking_uri, "th"))}
    assert set(runs) == {"cpu t0", "cpu t3"}
    assert runs["cpu t3"].data.tags[names.TAG_THREADS] == "3" and runs["cpu t3"].data.params["threads"] == "3"
    assert runs["cpu t0"].data.tags[names.TAG_THREADS] == str(torch.get_num_threads())


# --- a key added to the table alone: every consumer sees it -------------------------------------------

# A grid key as a maintainer adds one: a field of RunConfig, and nothing else. It is written into a
# copy of the package's source, so that whatever a module derives from KEYS at import time (the
# `pipeline train` options, module-level tuples) is derived with it, as it would be for a real key.
FAKE_KEY = (
    '    momentum: float = _key(0.0, check=_non_negative_float("0 or 0.9"),\n'
    '                           help="A key only the tests know.", name="mom", later=True,\n'
    '                           chart_group="momentum")\n'
)

# Run in the copy: what each consumer of the table makes of the new key, as JSON.
PROBE = r"""
import json, sys, types
from click.testing import CliRunner
from pipeline.present.charts import EPOCH_DURATION_PNG, plan
from pipeline.cli import main
from pipeline.analysis.compare import ROW_KEYS, TWIN_KEYS, CompareOptions, build
from pipeline.present.tables import display_frame
from pipeline.settings.config import RunConfig, load_grid
from pipeline.errors import UserError
from pipeline.settings.grid import expand, single_name
from pipeline.base.runs import RunRecord, SweepRecord
from pipeline.sweep.registry import Reason, version_tags
from pipeline.settings.schema import grid_schema

sys.path.insert(0, sys.argv[1])  # docs/, for the docs' generator
import hooks

def cli(*args):
    result = CliRunner().invoke(main, list(args))
    return {"exit_code": result.exit_code, "output": result.output}

def error(grid):
    try:
        load_grid(grid)
    except UserError as exc:
        return str(exc)

def run(run_id, device, seconds, momentum):
    return RunRecord(run_id, run_id, {"batch_size": "64", "momentum": momentum}, {"test_accuracy": 0.8},
                     {"pipeline.device": device}, histories={"epoch_duration_s": [9.0, seconds]})

open("grid.yaml", "w").write("grid:\n  device: [cpu]\n  momentum: [0, 0.9]\n")
runs = [run("c0", "cpu", 4.0, "0.0"), run("g0", "cuda:0", 1.0, "0.0"), run("c9", "cpu", 5.0, "0.9")]
comparison = build(SweepRecord("p", "p", "1", "x", runs), CompareOptions(versus="momentum=0"))
version = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r"),
                                data=types.SimpleNamespace(params={"momentum": "0.9"}, tags={}, metrics={}))
print(json.dumps({
    "train --help": cli("train", "--help"),
    "train --momentum -1": cli("train", "--momentum", "-1"),
    "validate": cli("validate", "grid.yaml"),
    "schema": grid_schema()["properties"]["grid"]["properties"]["momentum"],
    "run names": [point.name for point in expand(load_grid({"grid": {"device": ["cpu"], "momentum": [0, 0.9]}}))],
    "train's run name": single_name(RunConfig(device="cpu", momentum=0.9)),
    "run key at the default": RunConfig().identity() == RunConfig(momentum=0.0).identity(),
    "run key away from it": RunConfig().identity() != RunConfig(momentum=0.9).identity(),
    "registry tags": version_tags(version, Reason("--run-id", {})),
    "twin keys": list(TWIN_KEYS), "row keys": list(ROW_KEYS), "varying": comparison.varying,
    "columns": list(display_frame(comparison).columns),
    "speedups": {row["run_ids"]: row["speedup"] for _, row in comparison.table.iterrows()},
    "versus": {row["run_ids"]: row["versus_speedup"] for _, row in comparison.table.iterrows()},
    "epoch chart": plan(comparison)[EPOCH_DURATION_PNG],
    "docs reference": hooks.grid_keys_table(), "docs values": hooks.grid_key_values_table(),
    "docs later keys": hooks.later_keys(),
    "unknown key": error({"grid": {"momentun": [0.9]}}), "bad value": error({"grid": {"momentum": [-1]}}),
}, default=str))
"""


@pytest.fixture(scope="module")
def fake_key(tmp_path_factory) -> dict:
    """What every consumer of the table makes of a key that only RunConfig's source names."""
    import inspect
    import json
    import os
    import shutil
    import subprocess
    import sys

    import pipeline

    package = Path(pipeline.__file__).parent
    root = tmp_path_factory.mktemp("fake_key")
    shutil.copytree(package, root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    config = root / "pipeline" / Path(inspect.getsourcefile(RunConfig)).relative_to(package)
    source = config.read_text()
    fields_end = source.index("    def as_params(self)")  # the first method after RunConfig's fields
    config.write_text(source[:fields_end] + FAKE_KEY + "\n" + source[fields_end:])
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "docs")],
        cwd=root,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_new_key_is_an_option_of_pipeline_train_checked_like_the_grid_key(fake_key):
    assert "--momentum FLOAT" in fake_key["train --help"]["output"]
    assert "A key only the tests know." in fake_key["train --help"]["output"]
    refused = fake_key["train --momentum -1"]
    assert refused["exit_code"] == 2 and "got -1.0; expected a number >= 0, e.g. 0 or 0.9" in refused["output"]


def test_a_new_key_is_checked_and_listed_by_the_grid_loader(fake_key):
    assert fake_key["bad value"] == "grid dict: grid.momentum: got -1; expected a number >= 0, e.g. 0 or 0.9"
    unknown = fake_key["unknown key"]
    assert "did you mean 'momentum'?" in unknown and unknown.endswith(", weight_decay, threads, momentum")


def test_a_new_key_has_its_bounds_in_the_schema(fake_key):
    schema = fake_key["schema"]
    assert schema["description"] == "A key only the tests know." and schema["default"] == [0.0]
    assert schema["anyOf"][0]["anyOf"][0] == {"type": "number", "minimum": 0}


def test_a_new_key_names_and_keys_runs(fake_key):
    assert fake_key["run names"] == ["cpu mom0", "cpu mom0.9"]
    assert "cpu mom0.9" in fake_key["validate"]["output"] and fake_key["validate"]["exit_code"] == 0
    assert fake_key["train's run name"] == "cpu mom0.9"
    assert fake_key["run key at the default"] and fake_key["run key away from it"]  # a later key


def test_a_new_key_tags_registered_versions(fake_key):
    assert fake_key["registry tags"]["momentum"] == "0.9"


def test_a_new_key_is_a_twin_key_of_the_comparison(fake_key):
    """cpu and cuda at momentum 0 are twins (a device speedup of 4); the cpu run at 0.9 is no twin
    of either, and --versus momentum=0 compares it with its twin at 0."""
    assert "momentum" in fake_key["twin keys"] and "momentum" in fake_key["row keys"]
    assert "momentum" in fake_key["varying"] and "momentum" in fake_key["columns"]
    assert fake_key["speedups"]["g0"] == 4.0 and math.isnan(fake_key["speedups"]["c9"])
    assert fake_key["versus"]["c9"] == 0.8  # 4 s at momentum 0 over 5 s at 0.9


def test_a_new_key_groups_the_epoch_chart_when_the_table_says_so(fake_key):
    chart = fake_key["epoch chart"]
    assert chart["xlabel"] == "batch size / DataLoader workers / momentum"
    assert chart["ticks"] == ["bs 64\nw ?\nmom 0", "bs 64\nw ?\nmom 0.9"]


def test_a_new_key_is_in_the_docs_tables(fake_key):
    row = "| `momentum` | a number >= 0, e.g. 0 or 0.9 | `0` |"
    assert f"{row} A key only the tests know. |" in fake_key["docs reference"].splitlines()
    assert row in fake_key["docs values"].splitlines()
    assert fake_key["docs later keys"].endswith("`threads`, `momentum`")


def test_the_docs_key_tables_are_generated():
    """The grids page holds the generated table and list, not a hand-written copy of either."""
    page = (REPO / "docs" / "grids.md").read_text()
    assert "<!-- grid-key-values -->" in page and "<!-- later-grid-keys -->" in page
    assert not re.search(r"^\| `lr` \|", page, re.MULTILINE)
