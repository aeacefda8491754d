"""Repeats: `repeats: N` in a grid file (or --repeats N) trains each point N times, interleaved, each
repeat its own child run with a `repeat` param; repeat 1 keeps the run key a point had before
repeats existed, so raising N trains only the missing repeats and lowering it trains nothing."""

from __future__ import annotations

import time

import mlflow

from conftest import children, invoke, runs_of
from pipeline import names
from pipeline.config import RunConfig, load_grid
from pipeline.grid import config_hash, expand, run_count
from pipeline.runner import run_key

GRID = "experiment: reps\nrepeats: 2\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n"


def test_repeats_interleave_and_name_their_runs(write_grid):
    spec = load_grid(write_grid(GRID))
    points = expand(spec)
    assert [(p.index, p.config.batch_size, p.repeat) for p in points] == [
        (1, 128, 1), (2, 256, 1), (3, 128, 2), (4, 256, 2)]
    assert [p.name for p in points] == ["cpu bs128 r1", "cpu bs256 r1", "cpu bs128 r2", "cpu bs256 r2"]
    assert run_count(spec) == 4
    single = expand(load_grid(write_grid(GRID.replace("repeats: 2\n", ""), "one.yaml")))
    assert [(p.name, p.repeat) for p in single] == [("cpu bs128", 1), ("cpu bs256", 1)]


def test_repeat_one_keeps_the_run_key_of_a_grid_without_repeats():
    config, identity = RunConfig(batch_size=64, device="cpu"), {"source": "x", "train_size": 512, "test_size": 256}
    plain = run_key(config, identity, "AMD EPYC")
    assert run_key(config, identity, "AMD EPYC", repeat=1) == plain
    assert plain == config_hash(config, **identity, host=__import__("socket").gethostname(), hardware="AMD EPYC")
    assert len({plain, run_key(config, identity, "AMD EPYC", repeat=2),
                run_key(config, identity, "AMD EPYC", repeat=3)}) == 3


def test_validate_and_dry_run_count_runs_without_expanding(write_grid, data_dir):
    huge = write_grid("repeats: 3\ngrid:\n  seed: [" + ", ".join(str(i) for i in range(1000)) + "]\n"
                      "  batch_size: [" + ", ".join(str(i) for i in range(1, 1001)) + "]\n  device: [cpu]\n")
    started = time.monotonic()
    out = invoke("validate", str(huge))
    assert out.exit_code == 0 and "ok: 1000000 grid points x 3 repeats = 3000000 runs" in _words(out), out.output
    out = invoke("run", str(huge), "--dry-run", "--data-dir", str(data_dir))
    assert out.exit_code == 0 and "1000000 grid points x 3 repeats = 3000000 runs (dry run" in _words(out), out.output
    assert time.monotonic() - started < 30
    small = write_grid(GRID, "small.yaml")
    out = invoke("run", str(small), "--max-points", "3", "--data-dir", str(data_dir))
    assert out.exit_code == 2 and "4 runs (2 grid points x 2 repeats) is more than --max-points 3" in _words(out)
    out = invoke("run", str(small), "--repeats", "0", "--data-dir", str(data_dir))
    assert out.exit_code == 2 and "'--repeats': got '0'; expected a positive integer" in _words(out), out.output


def _words(out) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(out.output.split())


def _by_start(uri: str) -> list:
    return sorted(children(runs_of(uri, "reps")), key=lambda r: (r.info.start_time, r.info.run_id))


def test_raising_repeats_trains_only_the_missing_ones(write_grid, data_dir, tracking_uri):
    """Two points x two repeats train in interleaved order (read back from the store's start times);
    --repeats 3 then trains the two third repeats only, --repeats 1 nothing."""
    args = ["run", str(write_grid(GRID)), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    out = invoke(*args, "--dry-run")
    assert out.exit_code == 0 and "repeat" in out.output, out.output
    out = invoke(*args)
    assert out.exit_code == 0, out.output
    runs = _by_start(tracking_uri)
    assert [(r.data.params["batch_size"], r.data.params[names.REPEAT]) for r in runs] == [
        ("128", "1"), ("256", "1"), ("128", "2"), ("256", "2")]
    assert [r.info.run_name for r in runs] == ["cpu bs128 r1", "cpu bs256 r1", "cpu bs128 r2", "cpu bs256 r2"]
    assert len({r.data.tags[names.TAG_RUN_KEY] for r in runs}) == 4
    results = out.output[out.output.index("Results"):]
    assert "repeat" in results.splitlines()[2]  # the summary's header shows the repeat column

    out = invoke(*args, "--repeats", "3")
    assert out.exit_code == 0 and out.output.count("DONE") == 4, out.output
    runs = _by_start(tracking_uri)
    assert len(runs) == 6
    assert [(r.data.params["batch_size"], r.data.params[names.REPEAT]) for r in runs[4:]] == [("128", "3"), ("256", "3")]
    parent = mlflow.MlflowClient(tracking_uri).get_run(runs[4].data.tags["mlflow.parentRunId"])
    assert parent.data.tags[names.TAG_OPTIONS] == "--repeats 3"

    out = invoke(*args, "--repeats", "1")
    assert out.exit_code == 0 and out.output.count("DONE") == 2, out.output
    assert len(children(runs_of(tracking_uri, "reps"))) == 6
    parent_ids = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert all(mlflow.MlflowClient(tracking_uri).get_run(p).info.status == "FINISHED" for p in parent_ids)
