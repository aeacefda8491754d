"""A sweep's verdict covers its whole grid: a sweep interrupted and run again says what the same
sweep run uninterrupted says (its DONE points counted, with the sweep they came from), `compare`
reads the same set, and `run --register` registers this grid's model even where every point was
DONE and another grid's sweep is the experiment's latest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow

from conftest import invoke, new_store

# Two settings far apart in accuracy (16 steps an epoch against 1), so that the best is the most
# accurate whatever the timings: a verdict that can be compared across two stores.
GRID = "experiment: whole\ngrid:\n  batch_size: [32, 512]\n  device: [cpu]\n  epochs: [1]\n"
OTHER = "experiment: whole\ngrid:\n  batch_size: [64]\n  device: [cpu]\n  epochs: [1]\n"


def _best_line(output: str) -> str:
    """The verdict's first line without its figures' timings: "Best: cpu bs32 (... test acc 0.4023"."""
    line = next(line for line in output.splitlines() if line.startswith("Best: "))
    setting = line.split(" (")[0]
    accuracy = line[line.index("test acc ") :].split(",")[0]
    return f"{setting} {accuracy}"


def _settings(uri: str) -> list[tuple]:
    """compare --format json's rows as the verdict decides on them: setting, runs, accuracy, best."""
    out = invoke("compare", "--experiment", "whole", "--format", "json", "--tracking-uri", uri)
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    # One set of figures: images/s is the images of an epoch (512 here) over the epoch time beside it.
    assert all(abs(row["images_per_s"] * row["epoch_duration_s"] - 512) < 1 for row in rows), rows
    return [(row["batch_size"], row["n"], round(row["test_accuracy"], 4), row["best"]) for row in rows]


def test_an_interrupted_sweep_run_again_says_what_an_uninterrupted_one_says(
    tmp_path, data_dir, tracking_uri, _store_template
):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    args = ["run", str(grid), "--data-dir", str(data_dir)]

    (tmp_path / "uninterrupted").mkdir()
    whole_uri = new_store(tmp_path / "uninterrupted", _store_template)
    whole = invoke(*args, "--tracking-uri", whole_uri)
    assert whole.exit_code == 0, whole.output

    # The same grid into another store, ended by SIGTERM inside its second point: bs32 is FINISHED.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
        "END_BATCH_SIZE": "512",
        "END_AT": "epoch",
        "END_HOW": "SIGTERM",
    }
    ended = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("ending_pipeline.py")), *args, "--tracking-uri", tracking_uri],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ended.returncode == 143, ended.stdout + ended.stderr
    first = mlflow.MlflowClient(tracking_uri).search_runs(
        [mlflow.MlflowClient(tracking_uri).get_experiment_by_name("whole").experiment_id],
        "tags.`pipeline.role` = 'sweep'",
    )[0]

    again = invoke(*args, "--tracking-uri", tracking_uri)
    assert again.exit_code == 0, again.output
    assert _best_line(again.output) == _best_line(whole.output), again.output
    assert "1 of 2 runs are DONE points trained before" in again.output, again.output
    assert f"1 from sweep '{first.info.run_name}' ({first.info.run_id[:8]})" in again.output, again.output
    assert _settings(tracking_uri) == _settings(whole_uri)

    # The interrupted sweep, compared on its own, says it ended before its grid did.
    interrupted = invoke("compare", "--parent-run", first.info.run_id, "--tracking-uri", tracking_uri)
    assert "1 of 2 runs finished: the sweep ended KILLED" in interrupted.output, interrupted.output

    # Another grid's sweep becomes the experiment's latest; this grid, every point DONE, still
    # prints its whole verdict and registers its own best model, and writes no new sweep.
    other = tmp_path / "other.yaml"
    other.write_text(OTHER)
    assert invoke("run", str(other), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri).exit_code == 0
    client = mlflow.MlflowClient(tracking_uri)
    experiment_id = client.get_experiment_by_name("whole").experiment_id
    sweeps = len(client.search_runs([experiment_id], "tags.`pipeline.role` = 'sweep'"))
    done = invoke(*args, "--tracking-uri", tracking_uri, "--register", "whole-cnn")
    assert done.exit_code == 0, done.output
    assert _best_line(done.output) == _best_line(whole.output), done.output
    version = client.get_model_version_by_alias("whole-cnn", "champion")
    best = client.get_run(version.run_id)
    assert best.data.params["batch_size"] == _best_line(whole.output).split()[2].removeprefix("bs")
    assert len(client.search_runs([experiment_id], "tags.`pipeline.role` = 'sweep'")) == sweeps
    # Registered through MLflow's register_model: the logged model knows its version (the UI's
    # model page shows it registered).
    logged = client.get_logged_model(best.outputs.model_outputs[-1].model_id)
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": "whole-cnn", "version": version.version}]


def test_a_sweep_still_running_says_it_is_partial_on_every_surface(tracking_uri):
    """`pipeline compare` of a sweep whose parent is still RUNNING: 2 of its 8 planned runs finished,
    said in the notes and on the UI's first line."""
    from pipeline.analysis.compare import build
    from pipeline.present.sentences import short_verdict
    from pipeline.tracking.records import read_sweep
    from synthetic_sweeps import Run, write_sweep

    parent = write_sweep(
        tracking_uri,
        "running",
        [Run([1.0, 0.5, 0.5], params={"batch_size": "64"}), Run([1.0, 0.4, 0.4], params={"batch_size": "128"})],
        {"pipeline.grid_size": "8"},
    )
    client = mlflow.MlflowClient(tracking_uri)
    client.update_run(parent, status="RUNNING")
    out = invoke("compare", "--experiment", "running", "--tracking-uri", tracking_uri)
    assert out.exit_code == 0 and "partial: 2 of 8 runs finished; the sweep is still running" in out.output, out.output
    comparison = build(read_sweep(client, parent_run_id=parent))
    assert short_verdict(comparison).endswith("; partial: 2 of 8 runs finished")
    client.update_run(parent, status="FINISHED")
    assert "partial" not in invoke("compare", "--experiment", "running", "--tracking-uri", tracking_uri).output
