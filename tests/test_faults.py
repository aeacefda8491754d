"""Faults and hostile input, each through the real CLI in its own process (tests/faults.py): the
exit code, at most 3 lines, no traceback, no password, no run left RUNNING, user files unchanged.

Sections, one per class of fault: errors classified by type and code; only what is ours touched;
no secret in any output; honest states however a process ends; checks before the work; true
diagnoses; the Python API's types.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import isolated
from faults import Command, pipeline, tree  # noqa: F401 (the sections below use them)

GRID = "experiment: existing\ngrid:\n  batch_size: [256]\n  device: [cpu]\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_dir, _store_template):
    """A user's folder: a store holding one finished sweep, a grid, and files that are not ours
    (another program's sqlite database, a notes file, a `.tmp` of the user's). Cases that must
    change nothing share it; a case that writes makes its own copy (`fresh`)."""
    from pipeline.cli import main

    home = tmp_path_factory.mktemp("user")
    (home / "store").mkdir()
    shutil.copy(_store_template, home / "store" / "mlflow.db")
    uri = f"sqlite:///{home / 'store' / 'mlflow.db'}"
    (home / "grid.yaml").write_text(GRID)
    (home / "notes.txt").write_text("the user's own notes\n")
    (home / "results.tmp").write_text("the user's own temporary file\n")
    import sqlite3

    with sqlite3.connect(home / "other.db") as other:  # another application's database
        other.execute("create table accounts (id integer primary key, name text)")
        other.execute("insert into accounts (name) values ('ada')")
    other.close()
    with isolated(home):
        out = CliRunner().invoke(main, ["run", str(home / "grid.yaml"), "--data-dir", str(data_dir),
                                        "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    return {"home": home, "uri": uri, "data": data_dir, "grid": home / "grid.yaml", "other": home / "other.db"}


def fresh(world, tmp_path: Path) -> dict:
    """A copy of the world's folder for a case that writes (runs, relogs, fills a disk)."""
    home = tmp_path / "user"
    shutil.copytree(world["home"], home)
    return {**world, "home": home, "uri": f"sqlite:///{home / 'store' / 'mlflow.db'}", "grid": home / "grid.yaml",
            "other": home / "other.db"}


# --- 1. errors classified by type and code, never by message text -----------------------------------

# --- 2. only what is ours touched ----------------------------------------------------------------------

# --- 3. no secret in any output ------------------------------------------------------------------------

# --- 4. honest states however a process ends ----------------------------------------------------------

EPOCH = {"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5, "test_loss": 1.0, "test_accuracy": 0.5,
         "epoch_duration_s": 0.5, "images_per_s": 100.0}
# Results lines that are JSON but that crashed relog (a traceback, the run left RUNNING): how each is
# told (exit 1: its run FAILED with the reason; exit 2: a bad line, no run made), and what it says.
RELOG_CRASHES = {
    "an epoch without its numbers": ({"epochs": [{"epoch": 1}]}, 2, ":1: an epoch that is not one"),
    "a non-numeric epoch figure": ({"epochs": [{**EPOCH, "train_loss": "low"}]}, 2, ":1: an epoch that is not one"),
    "a param name MLflow refuses": ({"params": {"batch size!": 64}}, 1, "MLflow refused it"),
    "a model file that is no model": ({"model_file": "{home}/unlogged.pt"}, 1, "holds no model of this pipeline"),
}


@pytest.mark.parametrize("case", list(RELOG_CRASHES))
def test_a_results_line_that_crashed_relog_fails_alone(world, tmp_path, case):
    """The bad line first, a good one after it: relog goes on with the good one, the bad one's run (if
    it made one) is FAILED with the reason, one line says so, and no run stays RUNNING."""
    import json

    import mlflow

    from pipeline import names

    change, code, says = RELOG_CRASHES[case]
    copy = fresh(world, tmp_path)
    home = copy["home"]
    (home / "unlogged.pt").write_bytes(b"the user's weights, damaged")

    def line(name: str, **extra) -> str:
        entry = {"logged": False, "tracking_uri": copy["uri"], "experiment": "relogged", "name": name,
                 "run_key": name, "params": {"batch_size": 64}, "tags": {}, "run_duration_s": 1.0, "epochs": [EPOCH]}
        return json.dumps({**entry, **{k: v.format(home=home) if isinstance(v, str) else v for k, v in extra.items()}})

    results_file = home / names.RESULTS_FILE  # (its temporary file is named after it: not the user's results.tmp)
    results_file.write_text(line("bad", **change) + "\n" + line("good") + "\n")
    Command(["relog", str(results_file)], code, says=(says, "logged 1 run(s)"), stores=(copy["uri"],),
            watched=(home,), owned=(home / "store", home / "mlruns", results_file)).check(home)  # mlruns: the store's
    client = mlflow.MlflowClient(copy["uri"])
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("relogged").experiment_id])}
    assert runs["good"].info.status == "FINISHED"
    kept = [json.loads(text) for text in results_file.read_text().splitlines()]
    assert [entry["logged"] for entry in kept] == [False, True]  # the bad line stays, for a relog after the fix
    if code == 1:
        assert runs["bad"].info.status == "FAILED" and says in runs["bad"].data.tags[names.TAG_ERROR]
        assert kept[0]["run_id"] == runs["bad"].info.run_id  # a relog after the fix completes that run
    else:
        assert "bad" not in runs

# --- 5. checks before the work -------------------------------------------------------------------------

# --- 6. diagnoses that are true ------------------------------------------------------------------------

# --- 7. the Python API's types -------------------------------------------------------------------------


def test_the_harness_sees_a_changed_file(world, tmp_path):
    """The checksum walk is what every case rests on: a file changed, added or removed is seen."""
    copy = fresh(world, tmp_path)
    before = tree(copy["home"], owned=[copy["home"] / "store"])
    (copy["home"] / "notes.txt").write_text("changed\n")
    (copy["home"] / "new.lock").write_text("")
    (copy["home"] / "store" / "mlflow.db.tmp").write_text("")  # under an owned path: not counted
    after = tree(copy["home"], owned=[copy["home"] / "store"])
    assert sorted(set(before) ^ set(after)) == [str(copy["home"] / "new.lock")]
    assert before[str(copy["home"] / "notes.txt")] != after[str(copy["home"] / "notes.txt")]


def test_a_validate_of_a_good_grid_is_clean(world):
    """The harness on a command that must pass: exit 0, its own lines, nothing touched."""
    Command(["validate", str(world["grid"])], 0, says=("ok: 1 grid point",), watched=(world["home"],),
            max_lines=12).check(world["home"])
