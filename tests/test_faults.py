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
