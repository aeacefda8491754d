"""However a sweep ends, its states are honest: a sweep ended at each stage of a point (during an
epoch; trained, before its model is logged) by SIGKILL, SIGTERM, SIGHUP or an exception leaves no
run RUNNING (after SIGKILL: once the next sweep has closed the orphans), and the next sweep trains
that point again and skips only the points that are complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import children, invoke, runs_of
from faults import running_runs
from pipeline.base import names
from pipeline.tracking.records import complete

GRID = "experiment: ends\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n  epochs: [1]\n"
# How the process ends, and its exit code: 128 + the signal for the handled ones (SIGKILL: killed).
HOW = {"SIGKILL": -signal.SIGKILL, "SIGTERM": 143, "SIGHUP": 129, "exception": 1}


# Every way of ending at both stages. `make test` ends a sweep at each stage once, by a handled
# signal (SIGTERM at the epoch) and by an exception (at the model); `make test-slow` the other six
# (each case trains a sweep twice, 15-45 s on 2 cores). SIGKILL's orphan is also reaped in
# test_reliability's kill -9 test, in `make test`.
FAST = {("SIGTERM", "epoch"), ("exception", "model")}
CASES = [
    pytest.param(how, at, marks=[] if (how, at) in FAST else [pytest.mark.slow])
    for how in HOW
    for at in ("epoch", "model")
]


@pytest.mark.parametrize("how, at", CASES)
def test_a_sweep_ended_at_each_stage_leaves_honest_states(tmp_path, data_dir, tracking_uri, how, at):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    # --system-metrics: MLflow's active-run block, which once ended a run FINISHED before its model.
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri, "--system-metrics"]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
        "PYTHONUNBUFFERED": "1",
        "END_BATCH_SIZE": "256",
        "END_AT": at,
        "END_HOW": how,
    }
    ended = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("ending_pipeline.py")), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert f"ENDING at {at} by {how}" in ended.stdout and ended.returncode == HOW[how], ended.stdout
    assert "Traceback" not in ended.stdout, ended.stdout
    first = {r.data.params["batch_size"]: r for r in children(runs_of(tracking_uri, "ends"))}
    assert first["128"].info.status == "FINISHED" and complete(first["128"])
    assert not complete(first["256"]) and not first["256"].outputs.model_outputs
    if how == "SIGKILL":  # nothing could close it (the next sweep does); never FINISHED without its model
        assert first["256"].info.status == "RUNNING"
    else:
        assert not running_runs(tracking_uri), ended.stdout
        assert first["256"].info.status == ("FAILED" if how == "exception" else "KILLED")
        assert names.TAG_ERROR in first["256"].data.tags or how != "exception"

    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert "1 of 2 points already have a FINISHED run" in again.output  # 128: complete, skipped
    assert not running_runs(tracking_uri)
    runs = runs_of(tracking_uri, "ends")
    done = [r for r in children(runs) if complete(r)]
    assert sorted(r.data.params["batch_size"] for r in done) == ["128", "256"], [
        (r.data.params["batch_size"], r.info.status, dict(r.data.tags)) for r in children(runs)
    ]
    trained_again = next(r for r in done if r.data.params["batch_size"] == "256")
    assert trained_again.info.status == "FINISHED" and trained_again.outputs.model_outputs
