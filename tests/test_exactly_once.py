"""Exactly once across processes (tracking/claims.py), with real concurrent `pipeline run`s on one
sqlite store: a second sweep of one grid waits for the points the first holds and counts them, and
trains only what a dead holder left, never what a live one is training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from conftest import invoke, read_until, start_pipeline, store_down_for

GRID = "experiment: once\ngrid:\n  batch_size: [32, 64]\n  device: [cpu]\n  epochs: [1]\n"
ENDING = Path(__file__).with_name("ending_pipeline.py")


def _start(args: list[str], **env: str) -> subprocess.Popen:
    """`pipeline ARGS` through tests/ending_pipeline.py (pausing where END_BATCH_SIZE says), its
    lines unwrapped."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.Popen(
        [sys.executable, str(ENDING), *args],
        env={
            **environ,
            "COLUMNS": "200",
            "PYTHONUNBUFFERED": "1",
            "END_BATCH_SIZE": "none",
            "END_AT": "epoch",
            "END_HOW": "pause",
            "PAUSE_UNTIL": "-",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _runs_by_key(uri: str) -> dict[str, list]:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("once").experiment_id
    by_key: dict[str, list] = {}
    for run in client.search_runs([experiment], "tags.`pipeline.role` = 'point'"):
        by_key.setdefault(run.data.tags["pipeline.run_key"], []).append(run)
    return by_key


def test_a_second_sweep_of_one_grid_waits_for_the_first_and_trains_nothing_twice(tmp_path, data_dir, tracking_uri):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    release = tmp_path / "release"
    first = _start(args, END_BATCH_SIZE="64", PAUSE_UNTIL=str(release))
    second = None
    try:
        read_until(first, "PAUSED at epoch")  # bs32 done, bs64 claimed and training
        second = _start(args)
        said = read_until(second, "are being trained by another process")
        assert f"process {first.pid} on " in " ".join(said.split()), said
        release.touch()
        first_out, _ = first.communicate(timeout=300)
        second_out, _ = second.communicate(timeout=300)
    finally:
        release.touch()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert first.returncode == 0 and second.returncode == 0, first_out + second_out
    by_key = _runs_by_key(tracking_uri)
    assert len(by_key) == 2 and all(len(runs) == 1 for runs in by_key.values()), by_key  # each point once
    assert all(
        runs[0].info.status == "FINISHED" and runs[0].data.tags["pipeline.claim"] == "1" for runs in by_key.values()
    )
    # The second counts both points as DONE, with the first's verdict.
    assert "2 of 2 runs are DONE points trained before" in " ".join(second_out.split()), second_out
    best = [
        line for line in (first_out + "\n" + second_out).splitlines() if line.startswith(("Best: ", "Most accurate: "))
    ]
    assert len(best) == 2 and best[0] == best[1], best


@pytest.mark.slow  # two sweeps, one SIGKILLed mid-point (25 s on 2 cores)
def test_a_point_whose_holder_dies_is_trained_by_the_sweep_that_waited_for_it(tmp_path, data_dir, tracking_uri):
    """The first sweep is SIGKILLed while it trains bs64: the waiting sweep marks its runs KILLED
    and trains bs64 itself (its second attempt), once; nothing is left RUNNING."""
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    first = _start(args, END_BATCH_SIZE="64", PAUSE_UNTIL=str(tmp_path / "never"))
    second = None
    try:
        read_until(first, "PAUSED at epoch")
        second = _start(args)
        read_until(second, "are being trained by another process")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        second_out, _ = second.communicate(timeout=300)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert second.returncode == 0, second_out
    assert "marked 2 run(s) KILLED whose process ended without closing them" in " ".join(second_out.split())
    by_key = _runs_by_key(tracking_uri)
    finished = {key: [r for r in runs if r.info.status == "FINISHED"] for key, runs in by_key.items()}
    assert all(len(runs) == 1 for runs in finished.values()), by_key  # each point FINISHED once
    retrained = [runs[0] for runs in finished.values() if runs[0].data.params["batch_size"] == "64"]
    assert retrained[0].data.tags["pipeline.claim"] == "2", retrained  # the dead holder's attempt was spent
    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("once").experiment_id
    assert not client.search_runs([experiment], "attributes.status = 'RUNNING'")


def test_two_relogs_of_one_results_file_log_each_line_once(write_grid, data_dir, tracking_uri, monkeypatch):
    """A results file with a line an outage kept, relogged by two processes at once: one logs it,
    the other waits for the file and finds nothing left to log."""
    grid = write_grid("experiment: once\ngrid:\n  batch_size: [64, 128]\n  device: [cpu]\n  epochs: [1]\n")
    store_down_for(monkeypatch, "128")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 1 and "pipeline relog" in out.output, out.output

    relogs = [start_pipeline(["relog", "--tracking-uri", tracking_uri]) for _ in range(2)]
    said = [relog.communicate(timeout=240)[0] for relog in relogs]
    assert [relog.returncode for relog in relogs] == [0, 0], said
    assert sorted(next(line for line in out.splitlines() if line.startswith("logged ")).split()[1] for out in said) == [
        "0",
        "1",
    ], said
    by_key = _runs_by_key(tracking_uri)
    relogged = [run for runs in by_key.values() for run in runs if run.data.params["batch_size"] == "128"]
    assert [run.info.status for run in relogged] == ["FINISHED"], relogged  # one run, completed once
    client = mlflow.MlflowClient(tracking_uri)
    assert [m.step for m in client.get_metric_history(relogged[0].info.run_id, "test_accuracy")] == [1]
