"""What MLflow holds after a sweep, read back from a real sqlite store."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from conftest import children_of
from pipeline.base import names
from pipeline.errors import UserError
from pipeline.execution.outcomes import Outcome
from pipeline.present.report import Reporter
from pipeline.settings.config import load_grid
from pipeline.sweep.runner import Options, run_grid, run_single
from pipeline.tracking import store

GRID = """
experiment: sweep-test
grid:
  lr: [0.01]
  batch_size: [64, 128]
  device: [cuda, cpu]
  epochs: [2]
"""


def test_sweep_records_parent_children_params_metrics_tags_and_models(write_grid, data_dir, tracking_uri):
    spec = load_grid(write_grid(GRID, "devices-small.yaml"))
    result = run_grid(spec, Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir)))
    cuda = torch.cuda.is_available()
    statuses = [o.status for o in result.outcomes]
    assert statuses == ["FINISHED"] * 4 if cuda else ["SKIPPED", "FINISHED", "SKIPPED", "FINISHED"]
    assert result.exit_code == 0

    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("sweep-test")
    assert experiment.experiment_id == result.experiment_id
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name.startswith("devices-small 20")  # grid file + start time
    assert parent.data.tags[names.TAG_GRID_SIZE] == "4"
    # The file as written, and the grid it trained (no --set here): what the report's "run it
    # again" commands download (html_report), so it is there for every sweep.
    grid_files = {a.path for a in client.list_artifacts(parent.info.run_id, "grid")}
    assert grid_files == {"grid/devices-small.yaml", names.ARTIFACT_EFFECTIVE_GRID}

    runs = children_of(client, result.parent_run_id)
    assert len(runs) == (4 if cuda else 2)
    by_name = {r.info.run_name: r for r in runs}
    run = by_name["cpu bs64"]
    assert run.info.status == "FINISHED"
    assert run.data.params == {
        "lr": "0.01",
        "batch_size": "64",
        "num_workers": "0",
        "device": "cpu",
        "epochs": "2",
        "seed": "0",
        "shuffle": "true",
        "data_on_device": "false",
        "cuda_graph": "false",
        "precision": "fp32",
        "compile": "false",
        "prefetch": "false",
        "weight_decay": "0.0",
        "threads": "0",
        "train_size": "512",
        "test_size": "256",
        "repeat": "1",
    }  # gpus_per_run: cuda points only
    measured = not run.data.tags["pipeline.energy"].startswith("not measured")  # no counter: no metric, not 0
    for name in names.EPOCH_METRICS:
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == ([1, 2] if name != "energy_j" or measured else []), name
    assert run.data.metrics[names.RUN_DURATION] > 0
    tags = run.data.tags
    assert tags[names.TAG_DEVICE] == "cpu" and tags[names.TAG_HARDWARE]
    assert tags[names.TAG_TORCH] == torch.__version__ and tags[names.TAG_CUDA]
    assert len(tags[names.TAG_CONFIG_HASH]) == 16

    # The logged model loads both ways and runs on an (N, 1, 28, 28) float32 batch.
    (model_output,) = run.outputs.model_outputs
    uri = f"models:/{model_output.model_id}"
    mlflow.set_tracking_uri(tracking_uri)  # as a user loading the model would (conftest resets it)
    batch = np.random.default_rng(0).random((5, 1, 28, 28), dtype=np.float32)
    net = mlflow.pytorch.load_model(uri)
    assert net(torch.from_numpy(batch)).shape == (5, 10)
    scores = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model").predict(batch)
    assert scores.shape == (5, 10)
    assert np.allclose(scores, net(torch.from_numpy(batch)).detach().numpy(), atol=1e-5)


def test_each_run_warms_up_and_its_model_holds_the_last_epoch(write_grid, data_dir, tracking_uri):
    """Two seeds at the same shapes, swept twice: every run times a warm-up of its own. Each model is linked to
    its run's final epoch, whose metrics keep one point per epoch in the run's history, and carries
    the run's params as MLflow's log_model copies them."""
    grid = write_grid(
        "experiment: repeats\ngrid:\n  batch_size: [128]\n  device: [cpu]\n  seed: [0, 1]\n  epochs: [2]\n"
    )
    client = mlflow.MlflowClient(tracking_uri)
    for sweep in range(2):
        result = run_grid(
            load_grid(grid), Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir), rerun=True)
        )
        first, second = (client.get_run(o.run_id) for o in result.outcomes)
        assert first.data.metrics["warmup_s"] > 0 and second.data.metrics["warmup_s"] > 0, sweep
    for run in (first, second):
        assert run.data.tags[names.TAG_PARAM_DEVICES] == "cpu"
        (output,) = run.outputs.model_outputs
        assert output.step == 2
        model = client.get_logged_model(output.model_id)
        assert model.status == "READY" and model.source_run_id == run.info.run_id and model.name == "model"
        assert model.params == run.data.params and model.tags["mlflow.user"]
        linked = {m.key: (m.step, m.value) for m in model.metrics}
        assert linked["test_accuracy"] == (2, run.data.metrics["test_accuracy"]) and "run_duration_s" not in linked
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1, 2]


@pytest.mark.parametrize(
    "stop",
    [
        "model fails",
        "Ctrl-C in epoch 1",
        "Ctrl-C wrapped by a library",
        "Ctrl-C in the last epoch",
        "Ctrl-C after the model",
    ],
)
def test_a_run_that_ends_without_its_model_still_records_what_it_had(
    write_grid, data_dir, tracking_uri, monkeypatch, stop
):
    """A run whose model cannot be saved (a full disk: FAILED, kept for relog), or one interrupted
    (KILLED), still records its one-off costs, their tags and every epoch it finished, once each."""
    import importlib

    import pipeline.tracking.tracker

    grid = write_grid("experiment: ends\ngrid:\n  batch_size: [128]\n  device: [cpu]\n  epochs: [2]\n")
    if stop == "model fails":

        def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device")

        # The module itself: until something imports it, `mlflow.pytorch` is MLflow's lazy loader,
        # and a function set on that is not the one log_model calls.
        monkeypatch.setattr(importlib.import_module("mlflow.pytorch"), "save_model", full_disk)
    elif stop == "Ctrl-C in epoch 1":

        def interrupted(self, epoch, *args):
            raise KeyboardInterrupt

        monkeypatch.setattr(Reporter, "epoch_start", interrupted)
    elif stop == "Ctrl-C wrapped by a library":  # e.g. an HTTP client that turns it into its own error

        def wrapped(self, epoch, *args):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("request aborted") from exc

        monkeypatch.setattr(Reporter, "epoch_start", wrapped)
    elif stop == "Ctrl-C in the last epoch":
        real_end = Reporter.epoch_end

        def interrupted(self, stats, epochs):
            real_end(self, stats, epochs)
            if stats.epoch == epochs:
                raise KeyboardInterrupt

        monkeypatch.setattr(Reporter, "epoch_end", interrupted)
    else:
        real_log = pipeline.tracking.tracker.log_network

        def held(*args, **kwargs):
            real_log(*args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(pipeline.tracking.tracker, "log_network", held)
    options = Options(tracking_uri=tracking_uri, data_dir=str(data_dir), rerun=True)
    if stop == "model fails":
        # A full disk under the artifacts: the trained point is kept for relog, the run ends FAILED.
        (outcome,) = run_grid(load_grid(grid), Reporter(), options).outcomes
        assert outcome.status == "UNLOGGED" and "could not be written to " in outcome.reason, outcome.reason
        assert outcome.reason.endswith(": disk full")
    else:
        with pytest.raises(KeyboardInterrupt):
            run_grid(load_grid(grid), Reporter(), options)
    client = mlflow.MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ends").experiment_id], "tags.pipeline.role = 'point'")
    assert run.info.status == ("FAILED" if stop == "model fails" else "KILLED")
    assert run.data.metrics["warmup_s"] > 0 and run.data.tags[names.TAG_PARAM_DEVICES] == "cpu"
    history = {
        name: [m.step for m in client.get_metric_history(run.info.run_id, name)]
        for name in ("test_accuracy", "warmup_s", names.RUN_DURATION)
    }
    assert history == {
        "Ctrl-C in epoch 1": {"test_accuracy": [], "warmup_s": [0], names.RUN_DURATION: []},
        "Ctrl-C wrapped by a library": {"test_accuracy": [], "warmup_s": [0], names.RUN_DURATION: []},
        "Ctrl-C in the last epoch": {"test_accuracy": [1, 2], "warmup_s": [0], names.RUN_DURATION: []},
    }.get(stop, {"test_accuracy": [1, 2], "warmup_s": [0], names.RUN_DURATION: [0]})
    models = client.search_logged_models([run.info.experiment_id])
    assert [m.status for m in models] == {"model fails": ["FAILED"], "Ctrl-C after the model": ["READY"]}.get(stop, [])
    if stop == "model fails":  # MLflow records the model as the run's output before saving it
        assert "the run's artifacts (going to " in run.data.tags[names.TAG_ERROR]
        assert [o.model_id for o in run.outputs.model_outputs] == [models[0].model_id]


def test_failed_point_is_marked_and_the_grid_goes_on(write_grid, data_dir, tracking_uri, monkeypatch):
    import pipeline.training.train as train_mod

    real_fit = train_mod.fit

    def flaky_fit(config, *args, **kwargs):
        if config.batch_size == 64:
            raise RuntimeError("injected failure")
        return real_fit(config, *args, **kwargs)

    monkeypatch.setattr(train_mod, "fit", flaky_fit)
    spec = load_grid(write_grid("grid:\n  batch_size: [64, 128]\n  device: [cpu]\n"))
    result = run_grid(spec, Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir)))
    assert [o.status for o in result.outcomes] == ["FAILED", "FINISHED"]
    assert result.exit_code == 1

    client = mlflow.MlflowClient(tracking_uri)
    runs = {r.data.params["batch_size"]: r for r in children_of(client, result.parent_run_id)}
    failed = runs["64"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags[names.TAG_ERROR] == "RuntimeError: injected failure"
    traceback_text = client.download_artifacts(failed.info.run_id, "error/traceback.txt")
    assert "injected failure" in Path(traceback_text).read_text()
    assert runs["128"].info.status == "FINISHED"
    assert client.get_run(result.parent_run_id).info.status == "FAILED"


def test_interrupt_marks_child_and_parent_killed(write_grid, data_dir, tracking_uri, monkeypatch):
    import pipeline.training.train as train_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "fit", interrupted)
    spec = load_grid(write_grid("grid:\n  device: [cpu]\n"))
    with pytest.raises(KeyboardInterrupt):
        run_grid(spec, Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir)))
    client = mlflow.MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("grid").experiment_id])
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"]


def test_require_devices_fails_before_any_run(write_grid, data_dir, tracking_uri):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    spec = load_grid(write_grid(GRID))
    with pytest.raises(UserError, match="2 of 4 grid points cannot run here"):
        run_grid(spec, Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir), require_devices=True))
    assert mlflow.MlflowClient(tracking_uri).search_runs(["0"]) == []
    assert mlflow.MlflowClient(tracking_uri).get_experiment_by_name("sweep-test") is None


def test_missing_data_fails_before_any_run(write_grid, tmp_path, tracking_uri):
    spec = load_grid(write_grid("grid:\n  device: [cpu]\n"))
    with pytest.raises(UserError, match="Fashion-MNIST not found"):
        run_grid(spec, Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(tmp_path / "empty")))
    assert mlflow.MlflowClient(tracking_uri).get_experiment_by_name("grid") is None


def test_unreachable_server_fails_fast():
    with pytest.raises(UserError, match="tracking server http://127.0.0.1:9 is unreachable"):
        store.check_reachable("http://127.0.0.1:9", timeout_s=2)


@pytest.mark.parametrize(
    "status, body, retried",
    [
        (401, "You are not authenticated. Please see the documentation.", True),  # auth database down
        (503, "Service Unavailable", True),
        (404, "Not Found", False),
        (403, "Permission denied", False),
    ],
)
def test_which_server_answers_are_retried_mid_sweep(status, body, retried, monkeypatch):
    """A 401 after the sweep's login was checked is MLflow's auth app failing to look the login up
    (its database restarting), so it is retried like a 503; a 403 or a 404 is an answer. What
    MLflow's client raises for each, from a server that answers every request so."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):  # no access log on the test's output
            pass

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries, spent at once
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = mlflow.MlflowClient(f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(MlflowException) as info:
            client.log_batch("0" * 32, metrics=[Metric("test_loss", 0.5, 0, 1)])
    finally:
        server.shutdown()
        server.server_close()
    assert store.is_transient(info.value) is retried


def test_single_run_adopts_the_mlflow_run_project_run(data_dir, tracking_uri, monkeypatch):
    client = mlflow.MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("project")
    project_run = client.create_run(experiment_id)
    client.log_param(project_run.info.run_id, "lr", "0.010")  # as `mlflow run -P lr=0.010` would
    monkeypatch.setenv("MLFLOW_RUN_ID", project_run.info.run_id)
    from pipeline.settings.config import RunConfig

    result = run_single(
        RunConfig(lr=0.01, batch_size=128, device="cpu"),
        Reporter(),
        Options(tracking_uri=tracking_uri, data_dir=str(data_dir)),
    )
    assert result.exit_code == 0
    runs = client.search_runs([experiment_id])
    assert [r.info.run_id for r in runs] == [project_run.info.run_id]
    run = runs[0]
    assert run.data.params["lr"] == "0.010" and run.data.params["batch_size"] == "128"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1]


@pytest.mark.parametrize("command", ["run", "train"])
def test_an_experiment_named_under_mlflow_run_gets_the_runs(command, data_dir, tracking_uri, write_grid, monkeypatch):
    """`mlflow run . -P experiment=foo` (no --experiment-name: the project run is in Default): the
    runs go to foo, and the project run, which cannot move, says where they went."""
    from conftest import invoke

    client = mlflow.MlflowClient(tracking_uri)
    project_run = client.create_run("0")  # Default, as `mlflow run` opens it
    monkeypatch.setenv("MLFLOW_RUN_ID", project_run.info.run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    what = (
        [str(write_grid("grid:\n  batch_size: [128]\n  device: [cpu]\n"))]
        if command == "run"
        else ["--device", "cpu", "--epochs", "1"]
    )
    out = invoke(command, *what, "--experiment", "foo", "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0, out.output
    assert "experiment 'foo': the runs go there" in " ".join(out.output.split())
    runs = client.search_runs([client.get_experiment_by_name("foo").experiment_id])
    assert len(runs) == (2 if command == "run" else 1) and all(r.info.status == "FINISHED" for r in runs)
    assert project_run.info.run_id not in {r.info.run_id for r in runs}
    note = client.get_run(project_run.info.run_id).data.tags["mlflow.note.content"]
    assert "experiment `foo`" in note
    assert [r.info.run_id for r in client.search_runs(["0"])] == [project_run.info.run_id]


def test_ui_hint_points_at_the_training_runs_page(tmp_path):
    command, url = store.ui_hint("sqlite:///mlflow.db", "7")
    assert command.startswith("MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false ")  # as `pipeline ui` starts it
    assert command.endswith(f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'mlflow.db'} --port 5000 --workers 1")
    assert url.endswith("/#/experiments/7/runs?workflowType=machine_learning")  # not the GenAI mode
    assert store.ui_hint("http://host:5000/", "3") == (
        "",
        "http://host:5000/#/experiments/3/runs?workflowType=machine_learning",
    )


def test_outcome_statistics():
    from pipeline.settings.config import RunConfig
    from pipeline.settings.grid import GridPoint
    from pipeline.training.train import EpochStats

    epochs = [EpochStats(i, 1, 0.5, 1, 0.5, float(i * i), 10) for i in (1, 2, 3)]
    outcome = Outcome(GridPoint(1, RunConfig(), "x"), "FINISHED", epochs=epochs)
    assert outcome.mean_epoch_s == 6.5 and outcome.final is epochs[-1]  # steady state: epochs 2 and 3
    one = Outcome(GridPoint(1, RunConfig(), "x"), "FINISHED", epochs=epochs[:1])
    assert one.mean_epoch_s == 1.0  # a one-epoch run can only be timed cold


def test_logged_model_loads_where_pipeline_is_not_installed(data_dir, tracking_uri):
    """The model ships the module that defines Network, so loading needs no `pipeline` package."""
    import subprocess
    import sys

    from conftest import REPO
    from pipeline.settings.config import RunConfig

    result = run_single(
        RunConfig(batch_size=256, device="cpu"),
        Reporter(),
        Options(tracking_uri=tracking_uri, data_dir=str(data_dir), experiment="portable"),
    )
    code = f"""
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path = [p for p in sys.path if p not in ("", ".", {str(REPO)!r})]
import importlib.util
assert importlib.util.find_spec("pipeline") is None, "pipeline is still importable"
import mlflow, numpy as np
mlflow.set_tracking_uri({tracking_uri!r})
model = mlflow.pyfunc.load_model("runs:/{result.outcomes[0].run_id}/model")
scores = model.predict(np.zeros((3, 1, 28, 28), np.float32))
print("SHAPE", scores.shape)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert "SHAPE (3, 10)" in out.stdout, out.stderr


def test_a_wall_clock_stepped_back_never_ends_a_run_before_it_starts(write_grid, data_dir, tracking_uri, monkeypatch):
    """The machine's clock is set back an hour (NTP, a resumed VM) while a sweep trains: every run
    MLflow records ends after it starts, and lasts as long as it took."""
    import time

    real_time, started = time.time, time.monotonic()
    monkeypatch.setattr(time, "time", lambda: real_time() - (3600 if time.monotonic() - started > 0.5 else 0))
    grid = write_grid("experiment: clock\ngrid:\n  batch_size: [64]\n  device: [cpu]\n  epochs: [1]\n")
    run_grid(load_grid(grid), Reporter(), Options(data_dir=str(data_dir), tracking_uri=tracking_uri))
    took = time.monotonic() - started
    client = mlflow.MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("clock").experiment_id])
    assert len(runs) == 2  # the parent and its one point
    for run in runs:
        assert run.info.status == "FINISHED"
        assert 0 <= run.info.end_time - run.info.start_time <= took * 1000, run.info
