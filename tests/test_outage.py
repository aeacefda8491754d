"""The outage story end to end, against a real `pipeline server` on PostgreSQL (127.0.0.1):
the server stops while a point trains, the sweep keeps the result locally, the server comes back, `pipeline relog` (no
options, same folder) puts it where it belongs, and the same grid then trains only what never ran."""

from __future__ import annotations

import os
import signal

import mlflow
import pytest

from conftest import (
    children,
    free_port,
    invoke,
    make_idx,
    read_until,
    runs_of,
    start_pipeline,
    start_server,
    stop_service,
)

GRID = "experiment: outage\ngrid:\n  batch_size: [32, 48, 64, 80]\n  device: [cpu]\n  epochs: [2]\n"


@pytest.fixture
def server(tmp_path, postgres):
    """Start (and restart) a `pipeline server` (no login: quicker to restart) on the shared
    PostgreSQL, on a port of its own; stopped at the end."""
    folder = tmp_path / "server"
    folder.mkdir()
    port = free_port()
    state = {"uri": f"http://127.0.0.1:{port}", "process": None}

    def start():
        state["process"] = start_server(postgres["uri"], folder, port)

    def crash():  # the whole server at once, as a crash or a lost machine would
        os.killpg(state["process"].pid, signal.SIGKILL)
        state["process"].wait(timeout=30)
        stop_service(state["process"])  # its workers too, and its log

    def stop():
        stop_service(state["process"])

    state["start"], state["crash"] = start, crash
    start()
    yield state
    stop()


@pytest.mark.slow
def test_server_down_mid_point_then_relog_then_rerun(server, tmp_path, write_grid):
    uri = server["uri"]
    data = make_idx(tmp_path / "data", n_train=1500, n_test=100)
    args = ["run", str(write_grid(GRID)), "--data-dir", str(data), "--tracking-uri", uri]
    sweep = start_pipeline(args, env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})  # only the pipeline's own retries
    read_until(sweep, "run 2/4")  # point 2's run exists on the server and is training
    server["crash"]()
    output = sweep.communicate(timeout=240)[0]
    assert sweep.returncode == 1, output
    words = " ".join(output.split())  # as read, whatever the console's line width
    assert "The tracking store stopped answering" in words and "`pipeline relog` logs them" in words
    assert "UNLOGGED" in output and "1 unlogged" in output, output

    server["start"]()
    out = invoke("relog")  # no options, from the folder the sweep ran in
    assert out.exit_code == 0 and "logged 1 run(s)" in out.output and uri in out.output, out.output
    runs = runs_of(uri, "outage")
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FAILED" and "tracking store went down" in parent.data.tags["pipeline.killed_reason"]
    relogged = {r.data.params["batch_size"]: r for r in children(runs)}
    assert sorted(relogged) == ["32", "48"] and {r.info.status for r in relogged.values()} == {"FINISHED"}
    restored = relogged["48"]
    assert restored.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert restored.data.tags["pipeline.run_key"] and restored.data.tags["pipeline.device"] == "cpu"
    client = mlflow.MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(restored.info.run_id, "test_accuracy")] == [1, 2]
    assert restored.outputs.model_outputs, "the trained model is logged too"

    out = invoke(*args)
    assert out.exit_code == 0 and "2 of 4 points already" in out.output and "run 2/2" in out.output, out.output
    finished = [r for r in children(runs_of(uri, "outage")) if r.info.status == "FINISHED"]
    assert sorted(r.data.params["batch_size"] for r in finished) == ["32", "48", "64", "80"]
    assert not (tmp_path / "mlflow.db").exists()  # nothing went to a local store


def test_store_lost_while_logging_the_model_keeps_the_point_for_relog(write_grid, data_dir, tracking_uri, monkeypatch):
    """A dropped connection while the model is logged is an outage too, not a FAILED run that loses
    the training."""
    import pipeline.tracking.tracker

    real = pipeline.tracking.tracker.log_network

    def refused(*args, **kwargs):
        raise ConnectionError("Connection refused")

    monkeypatch.setattr(pipeline.tracking.tracker, "log_network", refused)
    args = [
        "run",
        str(write_grid("experiment: lost-model\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")),
        "--data-dir",
        str(data_dir),
        "--tracking-uri",
        tracking_uri,
    ]
    out = invoke(*args)
    assert out.exit_code == 1 and "UNLOGGED" in out.output and "1 not run" in out.output, out.output

    monkeypatch.setattr(pipeline.tracking.tracker, "log_network", real)
    assert "logged 1 run(s)" in invoke("relog", "--tracking-uri", tracking_uri).output
    (run,) = [r for r in children(runs_of(tracking_uri, "lost-model")) if r.info.status == "FINISHED"]
    assert run.outputs.model_outputs and run.data.params["batch_size"] == "128"
    assert invoke(*args).output.count("│ DONE") == 1  # 128 is done; only 256 trains


def test_relog_after_the_orphans_were_reaped_tells_the_outage_story(tracking_uri, tmp_path):
    """Run again before relog, and the next sweep closes the outage's child and parent as orphans
    (KILLED, "process ended"). relog then finishes the child without the stale reason, and the
    parent becomes FAILED with the outage as its reason."""
    import json

    from pipeline.base.names import TAG_KILLED_REASON
    from pipeline.tracking.results import relog
    from pipeline.tracking.tracker import Tracker

    tracker = Tracker.open(tracking_uri, "reaped")
    parent = tracker.start_run("sweep", tags={"pipeline.role": "sweep"})
    child = tracker.start_run("batch_size=64", parent)
    for run_id in (parent, child):
        tracker.log_tags(run_id, {TAG_KILLED_REASON: "process 4242 on host ended without closing the run"})
        tracker.end_run(run_id, "KILLED")
    epoch = {
        "epoch": 1,
        "train_loss": 1.0,
        "train_accuracy": 0.5,
        "test_loss": 1.0,
        "test_accuracy": 0.5,
        "epoch_duration_s": 0.5,
        "images_per_s": 100.0,
        "data_time_s": 0.1,
        "transfer_time_s": 0.1,
        "compute_time_s": 0.3,
    }
    line = {
        "logged": False,
        "tracking_uri": tracking_uri,
        "experiment": "reaped",
        "parent_run_id": parent,
        "run_id": child,
        "name": "batch_size=64",
        "run_key": "k",
        "device": "cpu",
        "params": {"batch_size": 64},
        "tags": {"pipeline.run_key": "k"},
        "run_duration_s": 1.0,
        "epochs": [epoch],
    }
    results_file = tmp_path / "results.jsonl"
    results_file.write_text(json.dumps(line) + "\n")

    assert [r.run_id for r in relog(results_file)] == [child]
    client = mlflow.MlflowClient(tracking_uri)
    restored, closed = client.get_run(child), client.get_run(parent)
    assert restored.info.status == "FINISHED" and TAG_KILLED_REASON not in restored.data.tags
    assert closed.info.status == "FAILED" and "tracking store went down" in closed.data.tags[TAG_KILLED_REASON]
    assert json.loads(results_file.read_text())["logged"] is True
