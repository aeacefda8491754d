"""The bad-input catalogue: every case exits 2 with a short message naming the problem and the fix,
prints no traceback, creates no MLflow run, and changes no existing file or run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import struct
import zlib
from pathlib import Path

import click
import mlflow
import numpy as np
import pytest
from click.testing import CliRunner

from catalogue import BAD_GRID_FILES, BAD_GRIDS
from conftest import free_port, make_idx
from idx_files import write_idx
from pipeline.cli import main
from pipeline.training import idx
from pipeline.training.idx import FILES

GOOD_GRID = "experiment: existing\ngrid:\n  batch_size: [256]\n  device: [cpu]\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_dir, _store_template):
    """An existing store holding one finished sweep, a good grid and good data, shared by every case
    (each case asserts that it changed nothing, so sharing is safe); bad images and results files;
    and a port where something listens but never answers (a hung server, a port in use)."""
    tmp_path = tmp_path_factory.mktemp("world")
    (tmp_path / "store").mkdir()
    shutil.copy(_store_template, tmp_path / "store" / "mlflow.db")
    tracking_uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    good = tmp_path / "good.yaml"
    good.write_text(GOOD_GRID)
    (tmp_path / "two.yaml").write_text("grid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    (tmp_path / "many.yaml").write_text(
        "grid:\n  device: [cpu, mps]\n  batch_size: ["  # mps points from #61
        + ", ".join(str(b) for b in range(1, 61))
        + "]\n"
    )
    out = CliRunner().invoke(main, ["run", str(good), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    write_images(tmp_path / "images")
    write_results_files(tmp_path / "results", tracking_uri)
    with socket.socket() as hung:  # the kernel completes connections to it; nothing ever reads them
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        yield {
            "tmp": tmp_path,
            "data": data_dir,
            "uri": tracking_uri,
            "good": good,
            "two": tmp_path / "two.yaml",
            "many": tmp_path / "many.yaml",
            "images": tmp_path / "images",
            "results": tmp_path / "results",
            "hung": hung.getsockname()[1],
            "free": free_port(),
        }


def png(width: int, height: int, rows: int | None = None) -> bytes:
    """A greyscale PNG whose header claims width x height, holding `rows` rows of pixels (all by default)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    pixels = zlib.compress(b"\0" * ((width + 1) * (height if rows is None else rows)))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


def write_images(folder: Path) -> None:
    folder.mkdir()
    (folder / "bomb.png").write_bytes(png(50_000, 50_000, rows=10))  # 2.5 gigapixels claimed in 3 kB
    (folder / "large.png").write_bytes(png(12_000, 12_000, rows=10))  # past PIL's warning, short of its error
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8)).save(folder / "whole.png")
    whole = (folder / "whole.png").read_bytes()
    (folder / "truncated.png").write_bytes(whole[: len(whole) // 2])  # its header whole, its pixels cut short
    (folder / "notes.png").write_text("not an image\n")
    (folder / "empty.jpg").write_bytes(b"")


LOGGED = json.dumps({"logged": True, "run_key": "k", "name": "bs256", "tracking_uri": "sqlite:///x.db"})


def write_results_files(folder: Path, tracking_uri: str) -> None:
    folder.mkdir()
    (folder / "truncated.jsonl").write_text(LOGGED + "\n" + LOGGED[:30])  # a killed process's last line
    (folder / "binary.jsonl").write_bytes(bytes(range(256)))
    (folder / "latin1.jsonl").write_bytes(LOGGED.encode() + b"\n" + '{"name": "\u00e9"}'.encode("latin-1") + b"\n")
    (folder / "list.jsonl").write_text("[1, 2]\n")
    (folder / "unlogged without params.jsonl").write_text(
        json.dumps({"logged": False, "tracking_uri": tracking_uri, "experiment": "existing", "name": "x", "epochs": []})
        + "\n"
    )


def snapshot(world) -> tuple:
    """Every run's id, status and end time, the bytes of every file under the test folder, and the
    names of every file and folder there (a new, empty store or lock file counts)."""
    client = mlflow.MlflowClient(world["uri"])
    runs = sorted(
        (r.info.run_id, r.info.status, r.info.end_time)
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
    )
    files = {}
    for path in sorted(world["tmp"].rglob("*")):
        if path.is_file() and not path.name.endswith((".db", ".lock")):
            files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return runs, files, sorted(str(path) for path in world["tmp"].rglob("*"))


def bad_data(world, name: str, damage) -> Path:
    folder = world["tmp"] / "bad-data" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder = make_idx(folder, 60, 20, gz=False)
    damage(folder)
    return folder


def device_link(folder: Path) -> None:
    """The training images a link to /dev/zero: read, it would never end."""
    path = folder / FILES["train_images"]
    path.unlink()
    path.symlink_to("/dev/zero")


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


MILLION = (
    "grid:\n  lr: ["
    + ", ".join(f"0.{i + 1:03d}" for i in range(100))
    + "]\n  seed: ["
    + ", ".join(str(i) for i in range(100))
    + "]\n  batch_size: ["
    + ", ".join(str(i + 1) for i in range(100))
    + "]\n"
)

CASES = {
    # grid files: the shared tables, a grid that is valid but asks for more data than there is, and
    # one too big to train without --max-points
    **{name: ("grid", text, fragments) for name, text, fragments in BAD_GRIDS},
    **{name: ("grid", content, fragments) for name, content, fragments in BAD_GRID_FILES},
    "train_size too large": (
        "grid",
        "data:\n  train_size: 100000\ngrid:\n  device: [cpu]\n",
        "data.train_size: 100000 is more than",
    ),
    "a million grid points": (
        "grid",
        MILLION,
        ("1000000 grid points is more than --max-points 10000", "pass --max-points 1000000"),
    ),
    "more points than --max-points": (
        "args",
        ["run", "{two}", "--max-points", "1", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        "2 grid points is more than --max-points 1; pass --max-points 2",
    ),
    "missing devices past the points a dry run shows": (
        "args",
        ["run", "{many}", "--dry-run", "--require-devices", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        "60 of 120 grid points cannot run here",
    ),
    "--max-points 0": ("args", ["run", "{good}", "--max-points", "0"], "'--max-points'"),
    "missing grid file": ("args", ["run", "{tmp}/nope.yaml"], "no such grid file"),
    # CLI options
    "train batch size 0": ("args", ["train", "--batch-size", "0"], "positive integer"),
    "train unknown device": ("args", ["train", "--device", "tpu"], "cpu, cuda, cuda:N, mps or auto"),
    "train negative lr": ("args", ["train", "--lr", "-1"], "positive number"),
    "train epochs not a number": ("args", ["train", "--epochs", "many"], "'many' is not a valid integer"),
    "train negative weight decay": (
        "args",
        ["train", "--weight-decay", "-0.1"],
        ("--weight-decay", "got -0.1", "a number >= 0"),
    ),
    "train weight decay a word": ("args", ["train", "--weight-decay", "heavy"], "'heavy' is not a valid float"),
    "predict limit 0": ("args", ["predict", "--model", "models:/x@y", "--limit", "0"], "--limit"),
    "ui port out of range": ("args", ["ui", "--port", "70000"], "--port"),
    "compare unknown sort": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--sort", "speed"],
        "--sort speed: no such column",
    ),
    "compare unknown experiment": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--experiment", "nope"],
        "no experiment 'nope'",
    ),
    "register reserved alias": (
        "args",
        ["register", "--experiment", "existing", "--name", "m", "--alias", "latest", "--tracking-uri", "{uri}"],
        "--alias 'latest'",
    ),
    "register a name with a slash": (
        "args",
        ["register", "--experiment", "existing", "--name", "team/cnn", "--tracking-uri", "{uri}"],
        ("--name 'team/cnn'", "may not hold '/'"),
    ),
    "register an alias too long": (
        "args",
        ["register", "--experiment", "existing", "--name", "m", "--alias", "a" * 300, "--tracking-uri", "{uri}"],
        "more than MLflow's 255",
    ),
    "register a name too long for a database": (
        "args",
        ["register", "--experiment", "existing", "--name", "r" * 300, "--tracking-uri", "{uri}"],
        ("a name of 300 characters", "holds at most 256"),
    ),
    "run --register a name too long for a database": (
        "args",
        ["run", "{two}", "--register", "r" * 257, "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        ("a name of 257 characters", "holds at most 256"),
    ),
    "register a name that is a dot": (
        "args",
        ["register", "--experiment", "existing", "--name", "..", "--tracking-uri", "{uri}"],
        "--name '..': MLflow refuses '.' and '..'",
    ),
    "run --register a name with a NUL": (
        "args",
        ["run", "{good}", "--register", "cnn\x00x", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        "holds a control character ('\\x00' at 3)",
    ),
    "run --experiment with a NUL": (
        "args",
        ["run", "{good}", "--experiment", "nul\x00led", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        "--experiment: the name holds a control character",
    ),
    "run --experiment with bytes that are not UTF-8": (
        "args",
        ["run", "{good}", "--experiment", "bad\udcff\udcfebytes", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        "--experiment: the name holds bytes that are not UTF-8 (at 3)",
    ),
    "run --register a name with a colon": (
        "args",
        ["run", "{good}", "--register", "a:b", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        "--register 'a:b'",
    ),
    "register unknown metric": (
        "args",
        ["register", "--experiment", "existing", "--name", "m", "--metric", "f1", "--tracking-uri", "{uri}"],
        "--metric f1",
    ),
    "predict missing model": (
        "args",
        [
            "predict",
            "--model",
            "models:/nope@champion",
            "--tracking-uri",
            "{uri}",
            "--data-dir",
            "{data}",
            "--limit",
            "5",
        ],
        "--model models:/nope@champion",
    ),
    # data files
    "missing data": ("data", lambda w: w["tmp"] / "nowhere", "Fashion-MNIST not found"),
    "data file a link to a device": (
        "data",
        lambda w: bad_data(w, "device", device_link),
        "train-images-idx3-ubyte: not a regular file (a character device)",
    ),
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
    "sqlite uri with one slash": ("uri", "sqlite:/x.db", "a sqlite URI has three slashes before a relative path"),
    "databricks workspace": ("uri", "databricks", "tracking store databricks: a Databricks workspace is not a store"),
    "databricks profile": ("uri", "databricks://work", "tracking store databricks://work: a Databricks workspace"),
    "database store unreachable": ("uri", "postgresql://user:hunter2@127.0.0.1:1/db", "postgresql://user:***@"),
    "compare on a missing store": (
        "args",
        ["compare", "--tracking-uri", "sqlite:///{tmp}/absent.db"],
        "no tracking store",
    ),
    "sqlite store a folder": (
        "uri",
        "sqlite:///{tmp}",
        ("is a folder; name a database file in it", "sqlite:///{tmp}/mlflow.db"),
    ),
    "sqlite store the root folder": ("args", ["compare", "--tracking-uri", "sqlite:////"], "/ is a folder"),
    "uri with a bracket left open": ("uri", "http://[::1", "--tracking-uri http://[::1: not a URI (Invalid IPv6 URL)"),
    "uri with a port that is no number": ("uri", "http://host:abc", "not a URI (Port could not be cast"),
    "sqlite store in memory": ("uri", "sqlite://", ("an in-memory database ends with the process", "sqlite:///")),
    "sqlite store :memory:": ("uri", "sqlite:///:memory:", "an in-memory database ends with the process"),
    "sqlite store file::memory:": (
        "uri",
        "sqlite:///file::memory:?cache=shared&uri=true",
        "an in-memory database ends with the process",
    ),
    "store a plain folder path": ("uri", "{tmp}", ("MLflow 3 retired file stores", "sqlite:///{tmp}/mlflow.db")),
    "store a plain file name": ("args", ["compare", "--tracking-uri", "mlflow.db"], "e.g. --tracking-uri sqlite:///"),
    "store a file that is no database": ("uri", "sqlite:///{good}", "good.yaml is not an SQLite database"),
    "server that never answers": (
        "uri",
        "http://127.0.0.1:{hung}",
        "accepted the connection but did not answer within 3 s",
    ),
    "compare on a server that never answers": (
        "args",
        ["compare", "--tracking-uri", "http://127.0.0.1:{hung}"],
        "did not answer within 3 s",
    ),
    "predict on a server that never answers": (
        "args",
        [
            "predict",
            "--model",
            "models:/m@champion",
            "--limit",
            "5",
            "--data-dir",
            "{data}",
            "--tracking-uri",
            "http://127.0.0.1:{hung}",
        ],
        "did not answer within 3 s",
    ),
    "predict on a missing store": (
        "args",
        [
            "predict",
            "--model",
            "models:/m@champion",
            "--limit",
            "5",
            "--data-dir",
            "{data}",
            "--tracking-uri",
            "sqlite:///{tmp}/absent.db",
        ],
        "no tracking store",
    ),
    # empty values: one check for every option and argument (test_every_option_refuses_an_empty_value)
    "empty --experiment": ("args", ["run", "{good}", "--experiment", ""], ("'--experiment'", "empty value")),
    "empty --tracking-uri": ("args", ["run", "{good}", "--tracking-uri="], ("'--tracking-uri'", "empty value")),
    "empty --data-dir": ("args", ["run", "{good}", "--data-dir", "", "--dry-run"], ("'--data-dir'", "empty value")),
    "empty grid argument": ("args", ["validate", ""], ("'GRID.yaml'", "empty value")),
    "blank --name": (
        "args",
        ["register", "--experiment", "existing", "--name", " ", "--tracking-uri", "{uri}"],
        ("'--name'", "empty value"),
    ),
    "empty --model": ("args", ["predict", "--model", ""], ("'--model'", "empty value")),
    "empty image file name": ("args", ["predict", "--model", "models:/m@champion", ""], ("IMAGE_FILES", "empty value")),
    "empty results file name": ("args", ["relog", ""], "empty value"),
    "empty --host": ("args", ["ui", "--host", "", "--tracking-uri", "{uri}"], ("'--host'", "empty value")),
    "empty --backend-store-uri": (
        "args",
        ["server", "--backend-store-uri", ""],
        ("'--backend-store-uri'", "empty value"),
    ),
    # image files (read before the model, so no model is needed to refuse them)
    "decompression bomb": (
        "args",
        ["predict", "--model", "models:/m@champion", "{images}/bomb.png"],
        ("bomb.png: over 178 megapixels", "scale it down"),
    ),
    "image past PIL's warning": (
        "args",
        ["predict", "--model", "models:/m@champion", "{images}/large.png"],
        "large.png: 12000x12000 pixels, more than this command decodes (64 megapixels",
    ),
    "truncated image": (
        "args",
        ["predict", "--model", "models:/m@champion", "{images}/truncated.png"],
        "truncated.png: a damaged or truncated image",
    ),
    "text file as image": (
        "args",
        ["predict", "--model", "models:/m@champion", "{images}/notes.png"],
        "notes.png: not an image file",
    ),
    "empty image file": (
        "args",
        ["predict", "--model", "models:/m@champion", "{images}/empty.jpg"],
        "not an image file",
    ),
    "folder as image": ("args", ["predict", "--model", "models:/m@champion", "{images}"], "images: is a folder"),
    # results files for relog: the bad line is named (file:line); the other lines are kept and relogged
    "results line cut short": ("args", ["relog", "{results}/truncated.jsonl"], "truncated.jsonl:2: not JSON"),
    "results file binary": ("args", ["relog", "{results}/binary.jsonl"], "binary data, not a results file"),
    "results line not UTF-8": ("args", ["relog", "{results}/latin1.jsonl"], "latin1.jsonl:2: not UTF-8 text"),
    "results line a list": ("args", ["relog", "{results}/list.jsonl"], "list.jsonl:1: a JSON list"),
    "results line without params": (
        "args",
        ["relog", "{results}/unlogged without params.jsonl"],
        "params.jsonl:1: 'params' missing",
    ),
    "results file a folder": ("args", ["relog", "{results}"], "results: is a folder"),
    # servers: the port is checked before anything starts or is made
    "ui on a port in use": (
        "args",
        ["ui", "--port", "{hung}", "--tracking-uri", "{uri}"],
        ("--port {hung}: already in use on 127.0.0.1", "pick another port"),
    ),
    "server on a port in use": (
        "args",
        ["server", "--port", "{hung}", "--backend-store-uri", "sqlite:///{tmp}/s.db"],
        ("--port {hung}: already in use", "pick another port"),
    ),
    "server on an unknown host": (
        "args",
        ["server", "--host", "no-such-host.invalid", "--port", "{free}", "--backend-store-uri", "sqlite:///{tmp}/s.db"],
        "--host no-such-host.invalid",
    ),
    "ray address where nothing listens": (
        "args",
        [
            "run",
            "{good}",
            "--executor",
            "ray",
            "--ray-address",
            "127.0.0.1:{free}",
            "--tracking-uri",
            "{uri}",
            "--data-dir",
            "{data}",
        ],
        "--ray-address 127.0.0.1:{free}: nothing answers at 127.0.0.1:{free}",
    ),
    "server on a folder store": (
        "args",
        ["server", "--port", "{free}", "--backend-store-uri", "sqlite:///{tmp}"],
        "is a folder; name a database file in it",
    ),
    # --- compare: --versus, --baseline, --fail-if-slower (the comparison side's cases) ---
    "compare --versus without =": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--versus", "seed"],
        "--versus seed: give KEY=VALUE",
    ),
    "compare --versus not a grid key": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--versus", "speed=1"],
        ("speed is not a grid key", "grid keys: device, lr"),
    ),
    "compare --versus a key that does not vary": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--versus", "seed=0"],
        "seed does not vary in this sweep",
    ),
    "compare --fail-if-slower without --baseline": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--fail-if-slower", "10"],
        "--fail-if-slower 10 needs --baseline",
    ),
    "compare --fail-if-slower negative": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--baseline", "existing", "--fail-if-slower", "-5"],
        "give a percentage >= 0",
    ),
    "compare --baseline unknown experiment": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--baseline", "nope"],
        "--baseline nope: no experiment 'nope'",
    ),
    # --- runside: run --set KEY=VALUE (config.load_grid's overrides; tests/test_glance_run.py) ---
    "--set an unknown key": (
        "args",
        ["run", "{good}", "--set", "bacth_size=100", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        ("--set bacth_size: unknown key", "did you mean 'batch_size'"),
    ),
    "--set a bad grid value": (
        "args",
        ["run", "{good}", "--set", "batch_size=100,0", "--tracking-uri", "{uri}", "--data-dir", "{data}"],
        ("--set batch_size: got 0", "positive integer"),
    ),
    "--set without =": (
        "args",
        ["run", "{good}", "--set", "epochs", "--tracking-uri", "{uri}"],
        ("--set epochs: expected KEY=VALUE", "--set epochs=2"),
    ),
    "--set repeats a word": (
        "args",
        ["run", "{good}", "--set", "repeats=many", "--tracking-uri", "{uri}"],
        "--set repeats: got 'many'",
    ),
    "--set a value that is not YAML": (
        "args",
        ["run", "{good}", "--set", "lr=[0.1", "--tracking-uri", "{uri}"],
        "--set lr: '[0.1' is not a YAML value",
    ),
    "--set a target metric unknown": (
        "args",
        ["run", "{good}", "--set", "target.f1=0.9", "--tracking-uri", "{uri}"],
        ("--set target: f1: unknown metric", "test_accuracy"),
    ),
    "empty --set": ("args", ["run", "{good}", "--set", ""], ("'--set'", "empty value")),
    "keys that clash through --set": (
        "args",
        ["validate", "{good}", "--set", "repeats=3", "--set", "max_repeats=4"],
        ("with --set repeats, max_repeats: max_repeats: only with repeats: auto",),
    ),
    # What Click itself refuses, said in our one line too, with the command's --help as the fix.
    "unknown option": ("args", ["run", "{good}", "--bogus"], ("'--bogus'", "run --help')")),
    "misspelt option": ("args", ["run", "{good}", "--experimen", "x"], ("Did you mean '--experiment'?",)),
    "unknown option before the command": ("args", ["--bogus", "run"], ("'--bogus'", "--help')")),
    "unknown command": ("args", ["rnu", "{good}"], ("No such command 'rnu'", "--help')")),
    "missing grid argument": ("args", ["run"], ("Missing argument 'GRID.yaml'", "run --help')")),
    "compare unknown format": (
        "args",
        ["compare", "--tracking-uri", "{uri}", "--format", "xml"],
        ("'xml' is not one of", "compare --help')"),
    ),
}


def test_every_bad_grid_has_a_name_of_its_own():
    """The catalogue's names are the test ids: two alike would hide one case behind the other's."""
    assert len({name for name, _, _ in BAD_GRIDS}) == len(BAD_GRIDS)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, world, monkeypatch):
    kind, value, fragments = CASES[name]
    fill = {k: str(v) for k, v in world.items()}
    fragments = tuple(f.format(**fill) for f in ((fragments,) if isinstance(fragments, str) else fragments))
    grid, args = world["good"], None
    if kind == "grid":
        grid = world["tmp"] / "bad.yaml"
        if grid.is_dir():
            grid.rmdir()
        if value is None:  # a folder
            grid.unlink(missing_ok=True)
            grid.mkdir()
        elif isinstance(value, bytes):
            grid.write_bytes(value)
        else:
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
    # One error line (a command that did part of its work, as relog, may say what it did first) and
    # never Click's usage block.
    assert [line for line in lines if line.lower().startswith(("error", "usage:", "try "))] == [message], out.output
    assert len(message) < 600, out.output
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


def _blank_candidates():
    """Every option and argument of every command that takes text (a name, a URI, a path)."""
    from pipeline.cli import NonBlank

    for command_name, command in sorted(main.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option) and param.is_flag:
                continue
            if isinstance(param.type, (NonBlank, click.types.StringParamType, click.Path)):
                yield command_name, param


@pytest.mark.parametrize(
    "command_name, param", list(_blank_candidates()), ids=[f"{c} {p.opts[0]}" for c, p in _blank_candidates()]
)
def test_every_option_refuses_an_empty_value(command_name, param, monkeypatch):
    """`--experiment ""` (an unset shell variable) is a mistake: exit 2 naming the option, on every
    command, before anything starts."""
    import pipeline.cli
    import pipeline.tracking.server

    def no_server(*args, **kwargs):
        raise AssertionError(f"{command_name} started a server")

    # `pipeline server` starts it through pipeline.tracking.server, `pipeline ui` through the CLI's own name
    monkeypatch.setattr(pipeline.tracking.server, "run_mlflow", no_server)
    monkeypatch.setattr(pipeline.cli, "run_mlflow", no_server)
    args = [command_name, param.opts[0], ""] if isinstance(param, click.Option) else [command_name, ""]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, f"{args}: exit {out.exit_code}\n{out.output}"
    assert "Invalid value for" in out.output, out.output
    assert param.opts[0] in out.output.replace(param.human_readable_name, param.opts[0]), out.output
    assert "Traceback" not in out.output


def test_under_mlflow_run_an_empty_optional_value_is_unset(write_grid, data_dir, tracking_uri, monkeypatch):
    """MLproject passes "" for every string parameter left at its default: under `mlflow run` those
    options read "" as not given. A value that has no default (a model name) still needs one."""
    monkeypatch.setenv("MLFLOW_RUN_ID", "0" * 32)
    monkeypatch.setenv("PIPELINE_DATA_DIR", str(data_dir))
    out = CliRunner().invoke(
        main,
        [
            "run",
            str(write_grid(GOOD_GRID)),
            "--dry-run",
            "--data-dir",
            "",
            "--register",
            "",
            "--experiment",
            "",
            "--tracking-uri",
            tracking_uri,
        ],
    )
    assert out.exit_code == 0, out.output
    assert "1 grid point (dry run" in " ".join(out.output.split())
    out = CliRunner().invoke(main, ["register", "--name", "", "--tracking-uri", tracking_uri])
    assert out.exit_code == 2 and "'--name'" in out.output and "empty value" in out.output, out.output


def test_validate_and_dry_run_count_a_million_points_and_show_the_first(write_grid, tracking_uri, data_dir):
    """Counted, not expanded (a million points took over 30 s and half a gigabyte to list)."""
    import time

    grid = write_grid(MILLION + "  device: [cpu]\n")
    started = time.perf_counter()
    out = CliRunner().invoke(main, ["validate", str(grid)])
    words = " ".join(out.output.split())
    assert out.exit_code == 0 and "ok: 1000000 grid points" in words, out.output
    assert "... and 999950 more: the first 50 of 1000000 grid points are shown" in words
    refusal = "`pipeline run` refuses 1000000 grid points (more than --max-points 10000); pass --max-points 1000000"
    assert refusal in words
    assert len(out.output.splitlines()) < 70
    out = CliRunner().invoke(
        main, ["run", str(grid), "--dry-run", "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    )
    words = " ".join(out.output.split())
    assert out.exit_code == 0 and "1000000 grid points (dry run, nothing trained)" in words, out.output
    assert "the first 50 of 1000000 grid points are shown" in words and "pass --max-points 1000000" in words
    assert time.perf_counter() - started < 20


def test_relog_relogs_the_good_lines_and_names_the_bad_one(tracking_uri, tmp_path):
    """A results file whose lines were cut short or garbled: every good line is relogged, the first
    bad one is named (file:line) with exit 2, and the bad lines stay in the file as they were."""
    epoch = {
        "epoch": 1,
        "train_loss": 1.0,
        "train_accuracy": 0.5,
        "test_loss": 1.0,
        "test_accuracy": 0.5,
        "epoch_duration_s": 0.5,
        "images_per_s": 100.0,
    }

    def line(batch_size: int) -> str:
        return json.dumps(
            {
                "logged": False,
                "tracking_uri": tracking_uri,
                "experiment": "relogged",
                "name": f"bs{batch_size}",
                "run_key": f"k{batch_size}",
                "params": {"batch_size": batch_size},
                "tags": {},
                "run_duration_s": 1.0,
                "epochs": [epoch],
            }
        )

    cut, garbled = line(99)[:40].encode(), b"\xff\xfe garbage"
    results_file = tmp_path / "results.jsonl"
    results_file.write_bytes(b"\n".join([line(64).encode(), cut, line(128).encode(), garbled]) + b"\n")
    out = CliRunner().invoke(main, ["relog", str(results_file)])
    assert out.exit_code == 2, out.output
    assert "logged 2 run(s)" in out.output
    (error,) = [text for text in out.output.splitlines() if text.startswith("error")]
    assert error.startswith(f"error: {results_file}:2: not JSON") and "(and 1 more)" in error, error
    client = mlflow.MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("relogged").experiment_id])
    statuses = sorted((r.data.params["batch_size"], r.info.status) for r in runs)
    assert statuses == [("128", "FINISHED"), ("64", "FINISHED")]
    kept = results_file.read_bytes().split(b"\n")
    assert kept[1] == cut and kept[3] == garbled
    assert [json.loads(kept[i])["logged"] for i in (0, 2)] == [True, True]
    again = CliRunner().invoke(main, ["relog", str(results_file)])
    assert again.exit_code == 2 and "logged 0 run(s)" in again.output and ":2: not JSON" in again.output
    assert len(client.search_runs([runs[0].info.experiment_id])) == 2


def test_a_server_that_stops_before_it_listens_is_reported(tmp_path, _store_template, capfd):
    """The port taken between the check and the server's own bind: MLflow's server prints its error
    and exits 0; the pipeline says, in one line, that it never listened, and exits 1."""
    from pipeline.tracking.server import run_mlflow

    shutil.copy(_store_template, tmp_path / "mlflow.db")
    with socket.socket() as taken:  # bound, not listening: the server cannot bind it, and nothing answers there
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        code = run_mlflow(
            [
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{tmp_path / 'mlflow.db'}",
            ],
            "127.0.0.1",
            port,
        )
    assert code == 1
    stopped = f"error: the MLflow server stopped before it listened on 127.0.0.1:{port} (exit code 0)"
    assert stopped in capfd.readouterr().err


def test_a_server_passes_on_sigterm_sent_to_pipeline_alone(tmp_path, _store_template):
    """`pipeline server` runs MLflow's server as its child: a SIGTERM to its own pid (a service
    manager, `docker stop`) stops the whole server, and its exit code is the server's."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import wait_for

    shutil.copy(_store_template, tmp_path / "mlflow.db")
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "server",
                "--port",
                str(port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{tmp_path / 'mlflow.db'}",
            ],
            cwd=tmp_path,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log_path = str(log)  # what wait_for shows when it exits early
    try:
        wait_for(f"http://127.0.0.1:{port}/health", process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever of its group is left


def test_a_download_that_cannot_connect_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    """No network (a proxy that refuses, as on a machine that reaches nothing): torchvision's
    several-line message becomes one line, and the folders the download made are gone again."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    out = CliRunner().invoke(main, ["data", "--download", "--data-dir", str(tmp_path / "fashion")])
    assert out.exit_code == 2, out.output
    (line,) = out.output.strip().splitlines()
    assert line.startswith(f"error: download into {tmp_path / 'fashion'} failed (") and "--data-dir" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_refused_admin_password_leaves_no_auth_file_behind(tmp_path):
    """`pipeline server --auth` with a password MLflow would refuse: one line, exit 2, and its
    temporary folder (where the auth configuration goes) as empty as before."""
    import os
    import subprocess
    import sys

    from conftest import free_port

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    (tmp_path / "password").write_text("short\n")
    server = [
        "server",
        "--auth",
        "--admin-password-file",
        str(tmp_path / "password"),
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--port",
        str(free_port()),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *server],
        env={**os.environ, "TMPDIR": str(temporary)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "the admin password has 5 characters" in done.stderr, done.stdout + done.stderr
    assert list(temporary.iterdir()) == []
