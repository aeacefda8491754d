"""The bad-input catalogue: every case exits 2 with a short message naming the problem and the fix,
prints no traceback, creates no MLflow run, and changes no existing file or run."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest
from click.testing import CliRunner

from catalogue import BAD_GRIDS
from conftest import make_idx, write_idx
from pipeline import idx
from pipeline.cli import main
from pipeline.idx import FILES

GOOD_GRID = "experiment: existing\ngrid:\n  batch_size: [256]\n  device: [cpu]\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_dir, _store_template):
    """An existing store holding one finished sweep, a good grid and good data, shared by every case
    (each case asserts that it changed nothing, so sharing is safe)."""
    tmp_path = tmp_path_factory.mktemp("world")
    (tmp_path / "store").mkdir()
    shutil.copy(_store_template, tmp_path / "store" / "mlflow.db")
    tracking_uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    good = tmp_path / "good.yaml"
    good.write_text(GOOD_GRID)
    out = CliRunner().invoke(main, ["run", str(good), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    return {"tmp": tmp_path, "data": data_dir, "uri": tracking_uri, "good": good}


def snapshot(world) -> tuple:
    """Every run's id, status and end time, and the bytes of every file under the test folder."""
    client = mlflow.MlflowClient(world["uri"])
    runs = sorted((r.info.run_id, r.info.status, r.info.end_time)
                  for e in client.search_experiments() for r in client.search_runs([e.experiment_id]))
    files = {}
    for path in sorted(world["tmp"].rglob("*")):
        if path.is_file() and not path.name.endswith((".db", ".lock")):
            files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return runs, files


def bad_data(world, name: str, damage) -> Path:
    folder = world["tmp"] / "bad-data" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder = make_idx(folder, 60, 20, gz=False)
    damage(folder)
    return folder


def truncate(folder: Path) -> None:
    path = folder / FILES["train_images"]
    path.write_bytes(path.read_bytes()[:-100])


def wrong_magic(folder: Path) -> None:
    path = folder / FILES["test_labels"]
    raw = bytearray(path.read_bytes())
    raw[2:4] = b"\x08\x03"
    path.write_bytes(bytes(raw))


def labels_out_of_range(folder: Path) -> None:
    write_idx(folder / FILES["train_labels"], np.full(60, 12, dtype=np.uint8), gz=False)


def small_images(folder: Path) -> None:
    write_idx(folder / FILES["test_images"], np.zeros((20, 20, 20), dtype=np.uint8), gz=False)


CASES = {
    # grid files: the shared table, plus a grid that is valid but asks for more data than there is
    **{name: ("grid", text, fragments) for name, text, fragments in BAD_GRIDS},
    "train_size too large": ("grid", "data:\n  train_size: 100000\ngrid:\n  device: [cpu]\n",
                             "data.train_size: 100000 is more than"),
    "missing grid file": ("args", ["run", "{tmp}/nope.yaml"], "no such grid file"),
    # CLI options
    "train batch size 0": ("args", ["train", "--batch-size", "0"], "positive integer"),
    "train unknown device": ("args", ["train", "--device", "tpu"], "cpu, cuda, cuda:N, mps or auto"),
    "train negative lr": ("args", ["train", "--lr", "-1"], "positive number"),
    "train epochs not a number": ("args", ["train", "--epochs", "many"], "'many' is not a valid integer"),
    "train negative weight decay": ("args", ["train", "--weight-decay", "-0.1"], ("--weight-decay", "got -0.1", "a number >= 0")),
    "train weight decay a word": ("args", ["train", "--weight-decay", "heavy"], "'heavy' is not a valid float"),
    "predict limit 0": ("args", ["predict", "--model", "models:/x@y", "--limit", "0"], "--limit"),
    "ui port out of range": ("args", ["ui", "--port", "70000"], "--port"),
    "compare unknown sort": ("args", ["compare", "--tracking-uri", "{uri}", "--sort", "speed"], "--sort speed: no such column"),
    "compare unknown experiment": ("args", ["compare", "--tracking-uri", "{uri}", "--experiment", "nope"], "no experiment 'nope'"),
    "register reserved alias": ("args", ["register", "--experiment", "existing", "--name", "m", "--alias", "latest",
                                         "--tracking-uri", "{uri}"], "--alias 'latest'"),
    "register unknown metric": ("args", ["register", "--experiment", "existing", "--name", "m", "--metric", "f1",
                                         "--tracking-uri", "{uri}"], "--metric f1"),
    "predict missing model": ("args", ["predict", "--model", "models:/nope@champion", "--tracking-uri", "{uri}",
                                       "--data-dir", "{data}", "--limit", "5"], "--model models:/nope@champion"),
    # data files
    "missing data": ("data", lambda w: w["tmp"] / "nowhere", "Fashion-MNIST not found"),
    "truncated file": ("data", lambda w: bad_data(w, "trunc", truncate), "truncated"),
    "wrong magic number": ("data", lambda w: bad_data(w, "magic", wrong_magic), "magic number 2049"),
    "labels out of range": ("data", lambda w: bad_data(w, "labels", labels_out_of_range), "label 12 found"),
    "images not 28x28": ("data", lambda w: bad_data(w, "shape", small_images), "expected 28x28"),
    "wrong checksum": ("checksum", None, "do not match Fashion-MNIST's checksums"),
    # tracking URIs
    "unreachable server": ("uri", "http://127.0.0.1:9", "tracking server http://127.0.0.1:9 is unreachable"),
    "sqlite folder missing": ("uri", "sqlite:///{tmp}/no/such/dir/mlflow.db", "does not exist"),
    "retired file store": ("uri", "file://{tmp}/fs", "MLflow 3 retired file stores"),
    "unsupported scheme": ("uri", "ftp://host/store", "tracking store ftp://host/store cannot be opened"),
    "database store unreachable": ("uri", "postgresql://user:hunter2@127.0.0.1:1/db", "postgresql://user:***@"),
    "compare on a missing store": ("args", ["compare", "--tracking-uri", "sqlite:///{tmp}/absent.db"], "no tracking store"),
}


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 25
    assert len({name for name, _, _ in BAD_GRIDS}) == len(BAD_GRIDS)  # ids name the test cases


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, world, monkeypatch):
    kind, value, fragments = CASES[name]
    fragments = (fragments,) if isinstance(fragments, str) else fragments
    fill = {k: str(v) for k, v in world.items()}
    grid, args = world["good"], None
    if kind == "grid":
        grid = world["tmp"] / "bad.yaml"
        grid.write_text(value)
    if kind == "args":
        args = [a.format(**fill) for a in value]
    elif kind == "uri":
        args = ["run", str(grid), "--data-dir", str(world["data"]), "--tracking-uri", value.format(**fill)]
    elif kind == "data":
        args = ["run", str(grid), "--data-dir", str(value(world)), "--tracking-uri", world["uri"]]
    elif kind == "checksum":
        monkeypatch.setattr(idx, "CANONICAL_SIZES", {"train": 512, "test": 256})
        idx.forget()
    if args is None:
        args = ["run", str(grid), "--data-dir", str(world["data"]), "--tracking-uri", world["uri"]]
    before = snapshot(world)
    try:
        out = CliRunner().invoke(main, args)
    finally:
        idx.forget()
    assert out.exit_code == 2, f"{name}: exit {out.exit_code}\n{out.output}"
    assert "Traceback" not in out.output, f"{name}: {out.output}"
    assert out.exception is None or isinstance(out.exception, SystemExit), f"{name}: {out.exception!r}"
    lines = out.output.strip().splitlines()
    message = next(line for line in lines if line.lower().startswith("error"))
    assert all(fragment in out.output for fragment in fragments), f"{name}: {out.output}"
    assert len(lines) <= 4 and len(message) < 600, out.output  # one line of ours, or click's usage + error
    assert snapshot(world) == before, f"{name} changed the store or a file"
    for leftover in ("mlruns", "fs", "no"):
        if leftover != "mlruns":
            assert not (world["tmp"] / leftover).exists(), f"{name} left {leftover}"


def test_under_mlflow_run_a_bad_grid_says_why_on_the_project_run(write_grid, tracking_uri, monkeypatch):
    """`mlflow run` opens the project run before the grid is read and marks it FAILED when we exit 2:
    the run must say why."""
    client = mlflow.MlflowClient(tracking_uri)
    project_run = client.create_run(client.create_experiment("project"))
    monkeypatch.setenv("MLFLOW_RUN_ID", project_run.info.run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    out = CliRunner().invoke(main, ["run", str(write_grid("grid:\n  batch_size: [0]\n"))])
    assert out.exit_code == 2
    assert "grid.batch_size: got 0" in client.get_run(project_run.info.run_id).data.tags["pipeline.error"]
