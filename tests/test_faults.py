"""Faults and hostile input, each through the real CLI in its own process (tests/faults.py): the
exit code, at most 3 lines, no traceback, no password, no run left RUNNING, user files unchanged.

Sections, one per class of fault: errors classified by type and code; only what is ours touched;
no secret in any output; honest states however a process ends; checks before the work; true
diagnoses; the Python API's types.
"""

from __future__ import annotations

import contextlib
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
        out = CliRunner().invoke(
            main, ["run", str(home / "grid.yaml"), "--data-dir", str(data_dir), "--tracking-uri", uri]
        )
    assert out.exit_code == 0, out.output
    return {"home": home, "uri": uri, "data": data_dir, "grid": home / "grid.yaml", "other": home / "other.db"}


def fresh(world, tmp_path: Path) -> dict:
    """A copy of the world's folder for a case that writes (runs, relogs, fills a disk)."""
    home = tmp_path / "user"
    shutil.copytree(world["home"], home)
    return {
        **world,
        "home": home,
        "uri": f"sqlite:///{home / 'store' / 'mlflow.db'}",
        "grid": home / "grid.yaml",
        "other": home / "other.db",
    }


# --- 1. errors classified by type and code, never by message text -----------------------------------


def test_a_too_long_experiment_name_is_one_line_naming_the_limit(world, tmp_path):
    """MLflow's "max length of 500 characters" once read as "HTTP 500": retried, then a traceback.
    Refused before a store is made."""
    store = tmp_path / "new" / "mlflow.db"
    store.parent.mkdir()
    Command(
        [
            "run",
            str(world["grid"]),
            "--data-dir",
            str(world["data"]),
            "--tracking-uri",
            f"sqlite:///{store}",
            "--experiment",
            "x" * 1000,
        ],
        2,
        says=("1000 characters", "at most 256"),
        watched=(world["home"], store.parent),
    ).check(world["home"])
    assert not store.exists()


def test_a_too_long_experiment_in_the_grid_is_refused_by_validate(world, tmp_path):
    grid = tmp_path / "long.yaml"
    grid.write_text(GRID.replace("existing", "y" * 600))
    Command(["validate", str(grid)], 2, says=("600 characters", "holds at most 256"), watched=(tmp_path,)).check(
        tmp_path
    )


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
    Command(
        [
            "run",
            str(world["grid"]),
            "--data-dir",
            str(world["data"]),
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'absent' / 'mlflow.db'}",
        ],
        2,
        says=("does not exist",),
    ).check(tmp_path)
    start_up = time.monotonic() - started
    if os.geteuid() == 0 and _mount(["-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(readonly)]):
        folders = [readonly]
    try:
        for folder in folders:
            started = time.monotonic()
            Command(
                [
                    "run",
                    str(world["grid"]),
                    "--data-dir",
                    str(world["data"]),
                    "--tracking-uri",
                    f"sqlite:///{folder / 'mlflow.db'}",
                ],
                2,
                says=(f"folder {folder} cannot be written",),
                watched=(tmp_path,),
            ).check(world["home"])
            assert time.monotonic() - started < start_up + 10
        started = time.monotonic()
        Command(
            [
                "run",
                str(world["grid"]),
                "--data-dir",
                str(world["data"]),
                "--tracking-uri",
                f"sqlite:///{blocker / 'mlflow.db'}",
            ],
            2,
            says=("tracking store",),
            watched=(tmp_path,),
        ).check(tmp_path)
        assert time.monotonic() - started < start_up + 10
    finally:
        if os.geteuid() == 0:
            _mount(["-u", str(readonly)])
        readonly.chmod(0o755)


def test_a_read_only_store_used_by_run_is_one_line(world, tmp_path):
    """A store on a read-only disk (root ignores file modes: a read-only mount where it can make
    one, else mode 444 for anyone else)."""
    home = fresh(world, tmp_path)
    folder = home["home"] / "store"
    (folder / "mlflow.db").chmod(0o444)
    mounted = (
        os.geteuid() == 0
        and _mount(["--bind", str(folder), str(folder)])
        and _mount(["-o", "remount,bind,ro", str(folder)])
    )
    if os.geteuid() == 0 and not mounted:
        pytest.skip("running as root without mount: a read-only store cannot be made here")
    try:
        Command(
            ["run", str(home["grid"]), "--data-dir", str(home["data"]), "--tracking-uri", home["uri"], "--rerun"],
            2,
            says=("cannot be written",),
            stores=(home["uri"],),
            watched=(home["home"],),
        ).check(home["home"])
    finally:
        if mounted:
            _mount(["-u", str(folder)])


def test_a_new_store_on_a_full_disk_is_one_line(world, tmp_path):
    """A full disk under the store once printed ~240 lines and 5 tracebacks: SQLITE_FULL is named as
    a full disk at the folder, with no retry, and the half-made store is removed (the next run, with
    room, read it as another program's half-made store). The disk: a 64 KiB tmpfs, too small for
    MLflow's tables."""
    full = tmp_path / "full"
    full.mkdir()
    if os.geteuid() != 0 or not _mount(["-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)]):
        pytest.skip("a small disk needs `mount -t tmpfs` (root in this container); not available here")
    try:
        Command(
            [
                "run",
                str(world["grid"]),
                "--data-dir",
                str(world["data"]),
                "--tracking-uri",
                f"sqlite:///{full / 'mlflow.db'}",
            ],
            2,
            says=(f"disk full at {full}",),
            watched=(world["home"],),
        ).check(world["home"])
        assert not (full / "mlflow.db").exists()
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


@pytest.mark.parametrize(
    "args", [["compare"], ["ui", "--port", "1"], ["register", "--experiment", "existing", "--name", "m"]]
)
def test_a_read_of_another_programs_database_changes_nothing(world, args):
    """`compare` on another application's sqlite file once added MLflow's 65 tables and a lock file."""
    Command(
        [*args, "--tracking-uri", f"sqlite:///{world['other']}"],
        2,
        says=(f"{world['other']} is not an MLflow store",),
        watched=(world["home"],),
    ).check(world["home"])


def test_relog_leaves_the_users_tmp_beside_the_results_file_alone(world, tmp_path):
    """`relog results.jsonl` deleted the user's results.tmp (its temporary was with_suffix(".tmp")):
    the rewrite now goes through a uniquely named temporary, renamed over the file, none left behind."""
    import json

    copy = fresh(world, tmp_path)
    home = copy["home"]
    epoch = {
        "epoch": 1,
        "train_loss": 1.0,
        "train_accuracy": 0.5,
        "test_loss": 1.0,
        "test_accuracy": 0.5,
        "epoch_duration_s": 0.5,
        "images_per_s": 100.0,
    }
    results_file = home / "results.jsonl"
    results_file.write_text(
        json.dumps(
            {
                "logged": False,
                "tracking_uri": copy["uri"],
                "experiment": "relogged",
                "name": "bs64",
                "run_key": "k64",
                "params": {"batch_size": 64},
                "tags": {},
                "run_duration_s": 1.0,
                "epochs": [epoch],
            }
        )
        + "\n"
    )
    Command(
        ["relog", str(results_file)],
        0,
        says=("logged 1 run(s)",),
        stores=(copy["uri"],),
        watched=(home,),
        owned=(home / "store", results_file),
        max_lines=6,
    ).check(home)
    assert json.loads(results_file.read_text())["logged"] is True
    assert (home / "results.tmp").read_text() == "the user's own temporary file\n"


def test_compare_out_leaves_no_temporary_beside_what_it_writes(world, tmp_path):
    """A successful write: the folder holds the report's files and nothing else (no `.NAME.*.tmp`)."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "results.tmp").write_text("the user's\n")
    result = pipeline(["compare", "--tracking-uri", world["uri"], "--out", str(out), "--format", "csv"], world["home"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.md", "results.tmp"]
    assert (out / "results.tmp").read_text() == "the user's\n"


# --- 3. no secret in any output ------------------------------------------------------------------------

PASSWORD = "Sup3r-Secret-77"


def _secret_stores() -> dict[str, str]:
    """URIs that hold PASSWORD: a tracking server nobody listens on, and a PostgreSQL database on port 1."""
    from conftest import free_port

    return {
        "http": f"http://alice:{PASSWORD}@127.0.0.1:{free_port()}",
        "postgresql": f"postgresql+psycopg://alice:{PASSWORD}@127.0.0.1:1/mlflow",
        "postgresql-query": f"postgresql+psycopg://alice@127.0.0.1:1/mlflow?password={PASSWORD}",
    }


def _relog_file(home: Path, uri: str) -> Path:
    """A results line kept during an outage: it names the real store URI, password and all (the
    user's own file), and relog reads the store from it."""
    import json

    path = home / "pipeline-results.jsonl"
    path.write_text(
        json.dumps(
            {
                "run_key": "k1",
                "logged": False,
                "tracking_uri": uri,
                "experiment": "existing",
                "name": "cpu bs256",
                "params": {"batch_size": 256},
                "epochs": [],
            }
        )
        + "\n"
    )
    return path


# command: (its arguments with URI for the store holding the password, exit code, most lines)
SECRET_CASES = {
    "run": (["run", "grid.yaml", "--tracking-uri", "URI"], 2, 3),
    "train": (["train", "--epochs", "1", "--tracking-uri", "URI"], 2, 3),
    "compare": (["compare", "--tracking-uri", "URI"], 2, 3),
    "register": (["register", "--experiment", "existing", "--name", "m", "--tracking-uri", "URI"], 2, 3),
    "predict": (["predict", "--model", "models:/m@champion", "--tracking-uri", "URI"], 2, 3),
    "relog": (["relog", "RESULTS"], 2, 3),
    "relog --tracking-uri": (["relog", "--tracking-uri", "URI"], 2, 3),
    "server": (["server", "--backend-store-uri", "URI", "--port", "PORT"], 2, 3),
}


# Each command against both stores: one of them in `make test` (http and postgresql in turn), the
# other in `make test-slow` (each case starts the CLI and waits out a store that is not there: 3-6 s).
SECRET_MATRIX = [
    pytest.param(command, scheme, marks=[] if (i % 2 == 0) == (scheme == "http") else [pytest.mark.slow])
    for i, command in enumerate(sorted(SECRET_CASES))
    for scheme in ("http", "postgresql")
]


@pytest.mark.parametrize("command, scheme", SECRET_MATRIX)
def test_no_command_prints_the_password_of_a_store(tmp_path, command, scheme):
    """Every command that reaches a store, given one whose URI holds a password (on the command line,
    or in a results file's line), names the store with the password masked: one line, exit 2."""
    from conftest import free_port

    uri = _secret_stores()[scheme]
    home = tmp_path / "user"
    home.mkdir()
    (home / "grid.yaml").write_text(GRID)
    args, exit_code, lines = SECRET_CASES[command]
    given = {"URI": uri, "RESULTS": str(_relog_file(home, uri)), "PORT": str(free_port())}
    args = [given.get(a, a) for a in args]
    result = Command(
        args, exit_code, says=("alice:***@127.0.0.1",), secrets=(PASSWORD,), watched=(home,), max_lines=lines
    ).check(home)
    assert result.output.startswith("error: "), result.output


@pytest.mark.parametrize("scheme", ["http", "postgresql", "postgresql-query"])
def test_ui_never_prints_the_password(tmp_path, scheme):
    """`pipeline ui` on a tracking server names it once, masked (it printed the password twice); on a
    database it cannot reach, one masked error line, whether the password is in the user part or
    in the query (?password=)."""
    uri = _secret_stores()[scheme]
    exit_code = 0 if scheme == "http" else 2
    masked = "password=***" if scheme == "postgresql-query" else "alice:***@127.0.0.1"
    Command(["ui", "--tracking-uri", uri], exit_code, says=(masked,), secrets=(PASSWORD,), watched=(tmp_path,)).check(
        tmp_path
    )


def test_commands_without_a_store_never_print_a_password_from_the_environment_or_a_path(tmp_path):
    """validate, data and devices: a URI with a password in $MLFLOW_TRACKING_URI is never printed,
    nor one given where a folder was expected (it comes back as a normalised path, http:/alice:...)."""
    uri = _secret_stores()["http"]
    env = {"MLFLOW_TRACKING_URI": uri}
    (tmp_path / "grid.yaml").write_text(GRID)
    Command(
        ["validate", "grid.yaml", "--set", f"data.root={uri}/data"],
        0,
        says=("alice:***@",),
        secrets=(PASSWORD,),
        watched=(tmp_path,),
        env=env,
        max_lines=12,
    ).check(tmp_path)
    Command(
        ["data", "--data-dir", f"{uri}/data"],
        2,
        says=("alice:***@",),
        secrets=(PASSWORD,),
        watched=(tmp_path,),
        env=env,
    ).check(tmp_path)
    Command(["devices"], 0, secrets=(PASSWORD,), watched=(tmp_path,), env=env, max_lines=40).check(tmp_path)


@pytest.mark.slow  # a sweep through a real server, then compare (30-60 s on 2 cores): make test-slow
def test_a_sweep_on_a_server_named_with_its_password_prints_and_tags_none(tracking_server, data_dir, tmp_path):
    """A sweep that trains and is compared prints its store and the UI link (the printed UI address
    for a server); with user:password in the server's URI none of those lines, nor any tag, holds it."""
    import mlflow

    uri = tracking_server.replace("http://", f"http://alice:{PASSWORD}@")
    (tmp_path / "grid.yaml").write_text(GRID.replace("existing", "secret-sweep"))
    ran = Command(
        ["run", "grid.yaml", "--data-dir", str(data_dir), "--tracking-uri", uri],
        0,
        says=("alice:***@127.0.0.1",),
        secrets=(PASSWORD,),
        max_lines=40,
    ).check(tmp_path)
    compared = Command(
        ["compare", "--experiment", "secret-sweep", "--tracking-uri", uri],
        0,
        says=("alice:***@127.0.0.1",),
        secrets=(PASSWORD,),
        max_lines=60,
    ).check(tmp_path)
    assert "In the MLflow UI: http://alice:***@127.0.0.1" in compared.output, ran.output + compared.output
    client = mlflow.MlflowClient(tracking_server)
    experiment = client.get_experiment_by_name("secret-sweep")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    assert not [(r.info.run_id, k) for r in runs for k, v in r.data.tags.items() if PASSWORD in v]


# --- 4. honest states however a process ends ----------------------------------------------------------
# (A sweep ended at each stage by SIGKILL, SIGTERM, SIGHUP or an exception: tests/test_interrupts.py.)

EPOCH = {
    "epoch": 1,
    "train_loss": 1.0,
    "train_accuracy": 0.5,
    "test_loss": 1.0,
    "test_accuracy": 0.5,
    "epoch_duration_s": 0.5,
    "images_per_s": 100.0,
}
# Results lines that are JSON but that crashed relog (a traceback, the run left RUNNING): how each is
# told (exit 1: its run FAILED with the reason; exit 2: a bad line, no run made), and what it says.
RELOG_CRASHES = {
    "an epoch without its numbers": ({"epochs": [{"epoch": 1}]}, 2, ":1: an epoch that is not one"),
    "a non-numeric epoch figure": ({"epochs": [{**EPOCH, "train_loss": "low"}]}, 2, ":1: an epoch that is not one"),
    "a param name MLflow refuses": ({"params": {"batch size!": 64}}, 1, "MLflow refused it"),
    "a model file that is no model": ({"model_file": "{home}/unlogged.pt"}, 1, "holds no model of this pipeline"),
}
SLOW_CRASHES = ("an epoch without its numbers", "a model file that is no model")


# A bad line (exit 2) and a failed run (exit 1) in `make test`, the other two in `make test-slow`.
@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=[pytest.mark.slow] if case in SLOW_CRASHES else []) for case in RELOG_CRASHES],
)
def test_a_results_line_that_crashed_relog_fails_alone(world, tmp_path, case):
    """The bad line first, a good one after it: relog goes on with the good one, the bad one's run (if
    it made one) is FAILED with the reason, one line says so, and no run stays RUNNING."""
    import json

    import mlflow

    from pipeline.base import names

    change, code, says = RELOG_CRASHES[case]
    copy = fresh(world, tmp_path)
    home = copy["home"]
    (home / "unlogged.pt").write_bytes(b"the user's weights, damaged")

    def line(name: str, **extra) -> str:
        entry = {
            "logged": False,
            "tracking_uri": copy["uri"],
            "experiment": "relogged",
            "name": name,
            "run_key": name,
            "params": {"batch_size": 64},
            "tags": {},
            "run_duration_s": 1.0,
            "epochs": [EPOCH],
        }
        return json.dumps({**entry, **{k: v.format(home=home) if isinstance(v, str) else v for k, v in extra.items()}})

    results_file = home / names.RESULTS_FILE  # (its temporary file is named after it: not the user's results.tmp)
    results_file.write_text(line("bad", **change) + "\n" + line("good") + "\n")
    Command(
        ["relog", str(results_file)],
        code,
        says=(says, "logged 1 run(s)"),
        stores=(copy["uri"],),
        watched=(home,),
        owned=(home / "store", home / "mlruns", results_file),
    ).check(home)  # mlruns: the store's
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


def _experiments(uri: str) -> list[str]:
    """Every experiment's name in the store at `uri`, deleted ones too."""
    import mlflow
    from mlflow.entities import ViewType

    return sorted(e.name for e in mlflow.MlflowClient(uri).search_experiments(view_type=ViewType.ALL))


def _runs(uri: str) -> list[str]:
    """Every run's id in the store at `uri`: a check before the work adds none."""
    import mlflow
    from mlflow.entities import ViewType

    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return sorted(r.info.run_id for r in client.search_runs(experiments, run_view_type=ViewType.ALL))


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_fifo_as_the_grid_is_refused_not_waited_on(world, tmp_path, command):
    """Opening a FIFO waits for a writer forever: refused by its type before it is opened."""
    import os

    fifo = tmp_path / "grid.yaml"
    os.mkfifo(fifo)
    extra = ["--data-dir", str(world["data"]), "--tracking-uri", world["uri"]] if command == "run" else []
    Command(
        [command, str(fifo), *extra],
        2,
        says=(f"error: {fifo}: a pipe (FIFO), not a regular file",),
        stores=(world["uri"],),
        watched=(world["home"],),
        max_lines=1,
    ).check(world["home"])


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_a_device_as_the_grid_is_refused_by_name(world, device):
    Command(
        ["validate", device],
        2,
        says=(f"error: {device}: a device, not a regular file",),
        watched=(world["home"],),
        max_lines=1,
    ).check(world["home"])


@contextlib.contextmanager
def _read_only(folder: Path):
    """`folder`, made and read-only while the block runs (a read-only bind mount: root ignores file modes)."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
    elif _mount(["--bind", str(folder), str(folder)]) and not _mount(["-o", "remount,bind,ro", str(folder)]):
        _mount(["-u", str(folder)])
        pytest.skip("running as root without a read-only remount: a read-only folder cannot be made here")
    try:
        yield folder
    finally:
        if os.geteuid() == 0:
            _mount(["-u", str(folder)])


@pytest.mark.parametrize("store", ["existing", "new"])
def test_an_artifact_folder_that_cannot_be_written_is_refused_before_any_run(world, tmp_path, store):
    """A new experiment keeps its artifacts in ./mlruns: run from a read-only folder, the sweep
    printed a traceback while opening its parent. Now one line naming that folder and why, exit 2,
    no run created, nothing written there; and for a store that does not exist yet, no store made
    (it was created, migrated, then the sweep was refused)."""
    home = fresh(world, tmp_path)
    (home["home"] / "new.yaml").write_text("experiment: new-here\ngrid:\n  batch_size: [256]\n")
    uri = home["uri"] if store == "existing" else f"sqlite:///{tmp_path / 'new-store' / 'mlflow.db'}"
    (tmp_path / "new-store").mkdir()
    args = ["run", str(home["home"] / "new.yaml"), "--data-dir", str(home["data"]), "--tracking-uri", uri]
    before = _runs(home["uri"]), _experiments(home["uri"])
    with _read_only(tmp_path / "read-only") as folder:
        Command(
            args,
            2,
            says=(f"error: a new experiment's artifact folder {folder}/mlruns: cannot write in {folder} (",),
            stores=(home["uri"],),
            watched=(folder, tmp_path / "new-store"),
        ).check(folder)
    assert (_runs(home["uri"]), _experiments(home["uri"])) == before  # not even the experiment
    assert list((tmp_path / "new-store").iterdir()) == []


def test_a_terminal_without_the_names_characters_shows_them_escaped(world, tmp_path):
    """An experiment named "café →" on a terminal that writes ASCII only (PYTHONIOENCODING=ascii,
    as some C-locale shells and CI logs have), dumb, zero columns wide: escaped, not a crash (which
    mid-sweep left the parent RUNNING)."""
    (tmp_path / "café.yaml").write_text("experiment: café →\ngrid:\n  batch_size: [256]\n", encoding="utf-8")
    env = {"PYTHONIOENCODING": "ascii", "TERM": "dumb", "COLUMNS": "0", "LC_ALL": "C"}
    shown = pipeline(["validate", str(tmp_path / "café.yaml")], world["home"], env)
    words = " ".join(shown.output.split())  # as read, however the narrow console wrapped it
    assert shown.exit_code == 0 and "experiment 'caf\\xe9 \\u2192'" in words, shown.output
    compared = pipeline(["compare", "--tracking-uri", world["uri"]], world["home"], env)
    assert compared.exit_code == 0 and "Traceback" not in compared.output, compared.output


@pytest.mark.parametrize("fault", ["checkpoint folder a file", "results file a folder"])
def test_a_folder_the_sweep_writes_in_is_checked_before_any_run(world, tmp_path, fault):
    """A checkpoint folder that is really a file made every point train, then fail: now one line,
    exit 2, and no new run in the store (--rerun: the point would otherwise be DONE)."""
    copy = fresh(world, tmp_path)
    store = copy["home"] / "store"
    if fault == "checkpoint folder a file":
        (store / ".pipeline-checkpoints").write_text("the user's file\n")
        says = ("error: the checkpoint folder", "not a folder", "--checkpoint")
    else:
        (store / "pipeline-results.jsonl").unlink(missing_ok=True)
        (store / "pipeline-results.jsonl").mkdir()
        says = ("error: the results file", "not a file; move it away")
    before = _runs(copy["uri"])
    Command(
        [
            "run",
            str(copy["grid"]),
            "--checkpoint",
            "--rerun",
            "--data-dir",
            str(copy["data"]),
            "--tracking-uri",
            copy["uri"],
        ],
        2,
        says=says,
        stores=(copy["uri"],),
        watched=(copy["home"],),
        max_lines=1,
    ).check(copy["home"])
    assert _runs(copy["uri"]) == before


def test_compare_out_below_a_file_fails_before_printing(world):
    """The table was printed, then a traceback: now the one line, and nothing before it."""
    out = world["home"] / "notes.txt" / "charts"
    result = Command(
        ["compare", "--tracking-uri", world["uri"], "--out", str(out)],
        2,
        says=("notes.txt is a file",),
        stores=(world["uri"],),
        watched=(world["home"],),
        max_lines=1,
    ).check(world["home"])
    assert result.lines[0].startswith(f"error: --out {out}: not a folder"), result.output


def test_zero_training_images_are_refused_before_any_run(world, tmp_path):
    """Zero training images reached training and divided by zero."""
    from idx_files import make_idx

    empty = make_idx(tmp_path / "empty", n_train=0, n_test=16)
    copy = fresh(world, tmp_path)
    before = _runs(copy["uri"])
    Command(
        ["run", str(copy["grid"]), "--rerun", "--data-dir", str(empty), "--tracking-uri", copy["uri"]],
        2,
        says=("train-images-idx3-ubyte.gz: holds 0 images",),
        stores=(copy["uri"],),
        watched=(copy["home"],),
        max_lines=1,
    ).check(copy["home"])
    assert _runs(copy["uri"]) == before


@contextlib.contextmanager
def _small_disk(folder: Path, size: str):
    """A tmpfs of `size` mounted at `folder` for the block (skipped where it cannot be mounted)."""
    folder.mkdir()
    if os.geteuid() != 0 or not _mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]):
        pytest.skip("a small disk needs `mount -t tmpfs` (root in this container); not available here")
    try:
        yield folder
    finally:
        _mount(["-u", str(folder)])


def _filling(args: list[str], disk: Path, batch_size: str, at: str):
    """`pipeline ARGS` run in `disk` through tests/ending_pipeline.py, which fills `disk` up when the
    point of `batch_size` reaches `at` (epoch or model); its output unwrapped."""
    import subprocess
    import sys

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        "END_BATCH_SIZE": batch_size,
        "END_AT": at,
        "END_HOW": "fill",
        "FILL_FOLDER": str(disk),
    }
    return subprocess.run(
        [sys.executable, str(Path(__file__).with_name("ending_pipeline.py")), *args],
        cwd=disk,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # one of the longest (30-50 s on 2 cores): make test-slow
def test_a_disk_that_fills_mid_sweep_stops_it_and_the_rest_resumes(world, tmp_path):
    """The store, its artifacts and the results file on a 16 MB disk that fills up during the second
    point (tests/ending_pipeline.py writes a filler until ENOSPC): the sweep stops with the reason,
    no traceback; the results file holds only whole lines; the lost point is FAILED with "disk full"
    in the sweep's words; once the filler is gone, the same grid trains only that point and no run is
    left RUNNING."""
    import json

    from faults import Result, assert_clean, running_runs

    with _small_disk(tmp_path / "disk", "16m") as disk:
        shutil.copy(world["home"] / "store" / "mlflow.db", disk / "mlflow.db")
        (disk / "grid.yaml").write_text("experiment: full\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
        uri = f"sqlite:///{disk / 'mlflow.db'}"
        args = ["run", str(disk / "grid.yaml"), "--data-dir", str(world["data"]), "--tracking-uri", uri]
        filled = _filling(args, disk, batch_size="256", at="epoch")
        shown = filled.stdout
        assert "ENDING at epoch by fill" in shown and filled.returncode == 1, shown
        assert "Traceback" not in shown and "The sweep stopped: the disk is full." in shown, shown
        assert "disk full" in shown and len(shown.splitlines()) < 30, shown
        lines = (disk / "pipeline-results.jsonl").read_bytes().splitlines()
        assert [json.loads(line)["name"] for line in lines] == ["cpu bs128"]  # whole lines only
        (disk / "filler").unlink()
        again = pipeline(args, disk)
        assert_clean(
            Result(args, again.exit_code, again.output), 0, says=("1 of 2 points already",), stores=(uri,), max_lines=40
        )
        assert not running_runs(uri)


@pytest.mark.slow  # a sweep, a relog (20-30 s on 2 cores): make test-slow
def test_a_full_artifact_disk_keeps_the_point_for_relog_and_names_that_disk(world, tmp_path):
    """The store on one disk, its artifacts (./mlruns, where MLflow puts them for a new experiment)
    on a 4 MB one that fills while the first point logs its model: that point is kept in the results
    file (not lost), the line names the artifact location (not the store's folder), the parent ends
    FAILED with the reason (not RUNNING), and once the filler is gone relog completes the run."""
    import json

    from faults import running_runs

    with _small_disk(tmp_path / "artifacts", "4m") as disk:
        store = tmp_path / "store"
        store.mkdir()
        shutil.copy(world["home"] / "store" / "mlflow.db", store / "mlflow.db")
        (store / "grid.yaml").write_text("experiment: artfull\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
        uri = f"sqlite:///{store / 'mlflow.db'}"
        args = ["run", str(store / "grid.yaml"), "--data-dir", str(world["data"]), "--tracking-uri", uri]
        filled = _filling(args, disk, batch_size="128", at="model")
        shown = filled.stdout
        words = " ".join(shown.split())  # as read, however the console wrapped a long path
        assert filled.returncode == 1 and "Traceback" not in shown, shown
        assert f"the run's artifacts (going to {disk}/mlruns/" in words, shown
        assert f"could not be written to {disk}/mlruns/" in words and ": disk full" in words, shown
        assert f"disk full at {store}" not in words, shown
        (line,) = [json.loads(line) for line in (store / "pipeline-results.jsonl").read_bytes().splitlines()]
        assert line["name"] == "cpu bs128" and not line["logged"] and Path(line["model_file"]).exists()
        assert not running_runs(uri)
        import mlflow

        client = mlflow.MlflowClient(uri)
        (parent,) = client.search_runs(
            [client.get_experiment_by_name("artfull").experiment_id], "tags.`pipeline.role` = 'sweep'"
        )
        assert parent.info.status == "FAILED" and "the run's artifacts" in parent.data.tags["pipeline.error"]
        (disk / "filler").unlink()
        relogged = pipeline(["relog", "--tracking-uri", uri], disk)
        assert relogged.exit_code == 0 and "logged 1 run(s)" in relogged.output, relogged.output
        run = client.get_run(line["run_id"])
        assert run.info.status == "FINISHED"
        # Its model is whole in the store (it serves), and the copy kept for relog is gone.
        import mlflow.pytorch

        # The half-logged model stays among its outputs, FAILED; the one relog logged is READY.
        statuses = {o.model_id: str(client.get_logged_model(o.model_id).status) for o in run.outputs.model_outputs}
        (ready,) = [model_id for model_id, status in statuses.items() if status.endswith("READY")]
        mlflow.set_tracking_uri(uri)  # models:/ and runs:/ resolve against the process's store
        assert mlflow.pytorch.load_model(f"models:/{ready}") is not None
        assert mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/model") is not None
        registered = pipeline(
            ["register", "--run-id", run.info.run_id, "--name", "artfull", "--tracking-uri", uri], disk
        )
        assert registered.exit_code == 0, registered.output
        assert ready in client.get_model_version("artfull", "1").source
        assert not Path(line["model_file"]).exists()


# --- 6. diagnoses that are true ------------------------------------------------------------------------


def _sweep_and_point(uri: str) -> tuple[str, str]:
    """The world's sweep (parent run id) and one of its grid points (a child run id)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    return child.data.tags["mlflow.parentRunId"], child.info.run_id


@pytest.mark.parametrize("option", ["--parent-run", "--baseline"])
def test_a_grid_point_given_for_a_sweep_is_named_with_its_sweep(world, option):
    """compare --parent-run CHILD (or --baseline CHILD) said the sweep had "no FINISHED runs"; it is a
    grid point, and the error names its sweep and the id to pass instead."""
    parent, child = _sweep_and_point(world["uri"])
    Command(
        ["compare", option, child, "--tracking-uri", world["uri"]],
        2,
        says=(f"run {child} is a grid point of sweep ", f"({parent}); pass {option} {parent}"),
        stores=(world["uri"],),
        watched=(world["home"],),
    ).check(world["home"])


def test_register_given_a_grid_point_for_a_sweep_names_its_sweep(world):
    parent, child = _sweep_and_point(world["uri"])
    Command(
        ["register", "--parent-run", child, "--name", "fashion", "--tracking-uri", world["uri"]],
        2,
        says=(f"run {child} is a grid point of sweep ", f"pass --parent-run {parent}"),
        watched=(world["home"],),
    ).check(world["home"])


@pytest.mark.slow  # one of the longest (30-50 s on 2 cores): make test-slow
def test_a_deleted_experiment_is_named_deleted_and_the_printed_restore_works(world, tmp_path):
    """An experiment deleted in the UI (or client.delete_experiment) was told to "run a grid first",
    which `run` refuses. Every command names it deleted, with the restore command; that command,
    run as printed, brings the sweep back."""
    import shlex
    import subprocess
    import sys

    import mlflow

    copy = fresh(world, tmp_path)
    uri, home = copy["uri"], copy["home"]
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("existing")
    parent, child = _sweep_and_point(uri)
    client.delete_experiment(experiment.experiment_id)
    deleted = (
        f"experiment 'existing' (id {experiment.experiment_id}) is deleted in {uri}",
        f"mlflow experiments restore --experiment-id {experiment.experiment_id}`",
    )
    for args in (
        ["compare", "--experiment", "existing"],
        ["compare", "--parent-run", parent],
        ["register", "--experiment", "existing", "--name", "fashion"],
        ["register", "--experiment", "existing", "--name", "fashion", "--metric", "test_accuracy"],
        ["run", str(copy["grid"]), "--data-dir", str(copy["data"])],
    ):
        result = Command([*args, "--tracking-uri", uri], 2, says=deleted, stores=(uri,), watched=(home,)).check(home)
    # A deleted run's model is still there: predict reads it, and says nothing untrue.
    Command(
        [
            "predict",
            "--model",
            f"runs:/{child}/model",
            "--data-dir",
            str(copy["data"]),
            "--limit",
            "10",
            "--tracking-uri",
            uri,
        ],
        0,
        says=("accuracy ",),
        watched=(home,),
        max_lines=20,
    ).check(home)
    restore = result.output.split("restore it with `")[1].split("`")[0]
    variable, command = restore.split(" ", 1)
    name, value = variable.split("=", 1)
    mlflow_cli = [str(Path(sys.executable).with_name("mlflow")), *shlex.split(command)[1:]]
    subprocess.run(mlflow_cli, env={**_clean_env(), name: value}, check=True, capture_output=True, timeout=120)
    Command(["compare", "--experiment", "existing", "--tracking-uri", uri], 0, max_lines=40).check(home)


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}


@pytest.mark.parametrize(
    "uri, module, package",
    [
        ("s3://bucket/models/fashion", "boto3", "boto3"),
        ("gs://bucket/models/fashion", "google.cloud.storage", "google-cloud-storage"),
        (
            "abfss://models@account.dfs.core.windows.net/fashion",
            "azure.storage.filedatalake",
            "azure-storage-file-datalake",
        ),
        ("hdfs://127.0.0.1:1/models/fashion", "HADOOP_HOME", "pyarrow (pip install pyarrow) with a Hadoop client"),
    ],
)
def test_a_remote_model_without_its_client_library_names_the_package(world, uri, module, package):
    """predict --model s3://... without boto3 printed a traceback, hdfs://... 89 lines of JVM loader
    noise: the scheme is checked first, and the package to install named in one line."""
    import importlib.util
    import os

    if module == "HADOOP_HOME":
        if os.environ.get("HADOOP_HOME") or os.environ.get("ARROW_LIBHDFS_DIR"):
            pytest.skip("a Hadoop client is configured here")
    else:
        try:
            if importlib.util.find_spec(module) is not None:
                pytest.skip(f"{module} is installed here")
        except ModuleNotFoundError:
            pass
    Command(
        ["predict", "--model", uri, "--data-dir", str(world["data"]), "--limit", "10"],
        2,
        says=(f"--model {uri}: reading {uri.split(':')[0]}:// needs {package}",),
        watched=(world["home"],),
    ).check(world["home"])


# --- 7. the Python API's types -------------------------------------------------------------------------


def test_numpy_values_through_the_api_are_the_points_the_cli_ran(world, tmp_path):
    """np.int64(256) was refused ("got np.int64(256); expected a positive integer"): it is the
    same point as the CLI's 256, so the world's finished sweep makes it DONE, with nothing trained."""
    import numpy as np

    from pipeline import api

    copy = fresh(world, tmp_path)
    grid = {
        "experiment": "existing",
        "grid": {
            "batch_size": [np.int64(256)],
            "device": [np.str_("cpu")],
            "shuffle": np.bool_(True),
            "lr": [np.float32(0.01)],
        },
    }
    sweep = api.run(grid, tracking_uri=copy["uri"], data_dir=str(copy["data"]), repeats=np.int64(1))
    assert [o.status for o in sweep.outcomes] == ["DONE"]
    assert sweep.exit_code == 0 and sweep.parent_run_id is None


@pytest.mark.parametrize(
    "overrides, says",
    [
        ("epochs=2", "overrides: got a string 'epochs=2'; pass a list, e.g. overrides=['epochs=2']"),
        ({"epochs": 2}, "overrides: got dict {'epochs': 2}; pass a list"),
        (["epochs=2", 3], 'overrides[1]: got 3; each item is a "KEY=VALUE" string'),
    ],
)
def test_overrides_that_are_not_a_list_of_strings_are_refused_by_name(world, overrides, says):
    """overrides="epochs=2" was read one character at a time ("e", "p", ...); it is refused by name,
    before the store is opened: nothing in the user's folder changes."""
    from pipeline import api
    from pipeline.errors import UserError

    before = tree(world["home"])
    with pytest.raises(UserError) as raised:
        api.run(str(world["grid"]), tracking_uri=world["uri"], data_dir=str(world["data"]), overrides=overrides)
    assert str(raised.value).startswith(says)
    assert tree(world["home"]) == before


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
    Command(
        ["validate", str(world["grid"])], 0, says=("ok: 1 grid point",), watched=(world["home"],), max_lines=12
    ).check(world["home"])


@pytest.mark.parametrize("command", ["validate", "run"])
def test_output_sent_to_a_full_disk_is_one_line(world, tmp_path, command):
    """`pipeline ... > log` where log's disk is full (/dev/full): one line on stderr, exit 1, no
    traceback, whether the output filled mid-sweep (run) or at its last flush (validate, whose few
    lines were still buffered); a sweep it stopped leaves no run RUNNING."""
    import subprocess
    import sys

    from faults import running_runs

    copy = fresh(world, tmp_path)
    args = [str(copy["grid"])]
    if command == "run":
        args += ["--data-dir", str(copy["data"]), "--tracking-uri", copy["uri"], "--rerun"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", command, *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            cwd=copy["home"],
        )
    said = "error: the output could not be written (No space left on device); free space where it goes"
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == said, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 2, done.stderr
    assert not running_runs(copy["uri"])
