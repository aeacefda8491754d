"""Faults and hostile input, each through the real CLI in its own process (tests/faults.py): the
exit code, at most 3 lines, no traceback, no password, no run left RUNNING, user files unchanged.

Sections, one per class of fault: errors classified by type and code; only what is ours touched;
no secret in any output; honest states however a process ends; checks before the work; true
diagnoses; the Python API's types.
"""

from __future__ import annotations

import os
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

def test_a_too_long_experiment_name_is_one_line_naming_the_limit(world, tmp_path):
    """MLflow's "max length of 500 characters" once read as "HTTP 500": retried, then a traceback.
    Refused before a store is made."""
    store = tmp_path / "new" / "mlflow.db"
    store.parent.mkdir()
    Command(["run", str(world["grid"]), "--data-dir", str(world["data"]), "--tracking-uri", f"sqlite:///{store}",
             "--experiment", "x" * 1000], 2, says=("1000 characters", "at most 500"),
            watched=(world["home"], store.parent)).check(world["home"])
    assert not store.exists()


def test_a_too_long_experiment_in_the_grid_is_refused_by_validate(world, tmp_path):
    grid = tmp_path / "long.yaml"
    grid.write_text(GRID.replace("existing", "y" * 600))
    Command(["validate", str(grid)], 2, says=("600 characters", "at most 500"), watched=(tmp_path,)).check(tmp_path)


def test_a_store_folder_that_cannot_be_written_fails_at_once(world, tmp_path):
    """It once waited ~45 s, then blamed "another program". A file standing where the folder should
    be cannot be written by root either."""
    import time

    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder\n")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    folders = [readonly] if os.geteuid() != 0 else []
    started = time.monotonic()  # the cost of starting the CLI on this machine: a missing folder fails first
    Command(["run", str(world["grid"]), "--data-dir", str(world["data"]), "--tracking-uri",
             f"sqlite:///{tmp_path / 'absent' / 'mlflow.db'}"], 2, says=("does not exist",)).check(tmp_path)
    start_up = time.monotonic() - started
    if os.geteuid() == 0 and _mount(["-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(readonly)]):
        folders = [readonly]
    try:
        for folder in folders:
            started = time.monotonic()
            Command(["run", str(world["grid"]), "--data-dir", str(world["data"]), "--tracking-uri",
                     f"sqlite:///{folder / 'mlflow.db'}"], 2, says=(f"folder {folder} cannot be written",),
                    watched=(tmp_path,)).check(world["home"])
            assert time.monotonic() - started < start_up + 10
        started = time.monotonic()
        Command(["run", str(world["grid"]), "--data-dir", str(world["data"]), "--tracking-uri",
                 f"sqlite:///{blocker / 'mlflow.db'}"], 2, says=("tracking store",), watched=(tmp_path,)).check(tmp_path)
        assert time.monotonic() - started < start_up + 10
    finally:
        if os.geteuid() == 0:
            _mount(["-u", str(readonly)])
        readonly.chmod(0o755)


@pytest.mark.parametrize("args", [["compare"], ["ui", "--port", "1"], ["register", "--experiment", "existing",
                                                                           "--name", "m"]])
def test_a_read_of_another_programs_database_changes_nothing(world, args):
    """`compare` on another application's sqlite file once added MLflow's 65 tables and a lock file."""
    Command([*args, "--tracking-uri", f"sqlite:///{world['other']}"], 2,
            says=(f"{world['other']} is not an MLflow store",), watched=(world["home"],)).check(world["home"])


def test_a_read_only_store_used_by_run_is_one_line(world, tmp_path):
    """A store on a read-only disk (root ignores file modes: a read-only mount where it can make
    one, else mode 444 for anyone else)."""
    home = fresh(world, tmp_path)
    folder = home["home"] / "store"
    (folder / "mlflow.db").chmod(0o444)
    mounted = os.geteuid() == 0 and _mount(["--bind", str(folder), str(folder)]) \
        and _mount(["-o", "remount,bind,ro", str(folder)])
    if os.geteuid() == 0 and not mounted:
        pytest.skip("running as root without mount: a read-only store cannot be made here")
    try:
        Command(["run", str(home["grid"]), "--data-dir", str(home["data"]), "--tracking-uri", home["uri"],
                 "--rerun"], 2, says=("cannot be written",), stores=(home["uri"],),
                watched=(home["home"],)).check(home["home"])
    finally:
        if mounted:
            _mount(["-u", str(folder)])


def test_a_new_store_on_a_full_disk_is_one_line(world, tmp_path):
    """A full disk under the store once printed ~240 lines and 5 tracebacks: SQLITE_FULL is named as
    a full disk at the folder, with no retry. The disk: a 64 KiB tmpfs, too small for MLflow's tables."""
    full = tmp_path / "full"
    full.mkdir()
    if os.geteuid() != 0 or not _mount(["-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)]):
        pytest.skip("a small disk needs `mount -t tmpfs` (root in this container); not available here")
    try:
        Command(["run", str(world["grid"]), "--data-dir", str(world["data"]), "--tracking-uri",
                 f"sqlite:///{full / 'mlflow.db'}"], 2, says=(f"disk full at {full}",),
                watched=(world["home"],)).check(world["home"])
    finally:
        _mount(["-u", str(full)])


def _mount(args: list[str]) -> bool:
    """`mount ARGS` (or `umount` for ["-u", PATH]) as root in this container; False where it is refused."""
    import subprocess

    # lazy: this process may still hold the store open (MLflow caches its engine per URI)
    command = ["umount", "-l", *args[1:]] if args[:1] == ["-u"] else ["mount", *args]
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


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
