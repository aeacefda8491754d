"""Sweeps that survive: skip-done, interrupts, orphans, checkpoints, failures, outages, concurrency."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import torch

from conftest import children, invoke, make_idx, read_until, runs_of, store_down_for
from conftest import start_pipeline as start
from pipeline.base import names

FOUR = "experiment: four\ngrid:\n  batch_size: [32, 48, 64, 80]\n  device: [cpu]\n  epochs: [2]\n"


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory):
    """Enough synthetic data that an epoch takes a noticeable fraction of a second."""
    return make_idx(tmp_path_factory.mktemp("slow"), n_train=3000, n_test=200)


def test_rerun_skips_finished_points(write_grid, data_dir, tracking_uri):
    grid = write_grid("experiment: again\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    assert invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri).exit_code == 0
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0 and "2 of 2 points already have a FINISHED run" in out.output
    assert out.output.count("│ DONE") == 2
    assert len(runs_of(tracking_uri, "again")) == 3  # no new parent when nothing is left to train

    bigger = write_grid("experiment: again\ngrid:\n  batch_size: [128, 256, 512]\n  device: [cpu]\n")
    out = invoke("run", str(bigger), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0 and "2 of 3 points already" in out.output and "run 1/1" in out.output
    runs = runs_of(tracking_uri, "again")
    assert len(runs) == 5 and sorted(r.data.params["batch_size"] for r in children(runs)) == ["128", "256", "512"]

    out = invoke("run", str(bigger), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri, "--rerun")
    assert out.exit_code == 0 and "run 3/3" in out.output


def test_another_host_is_another_measurement(write_grid, data_dir, tracking_uri, monkeypatch):
    grid = write_grid("experiment: hosts\ngrid:\n  batch_size: [256]\n  device: [cpu]\n")
    invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    monkeypatch.setattr("socket.gethostname", lambda: "another-machine")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert "already" not in out.output and "run 1/1" in out.output
    keys = {r.data.tags[names.TAG_RUN_KEY] for r in children(runs_of(tracking_uri, "hosts"))}
    assert len(keys) == 2


# Ctrl-C in `make test`; SIGTERM (also ended at each stage in test_interrupts) in `make test-slow`.
@pytest.mark.parametrize(
    "signum, code", [(signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)]
)
def test_interrupt_marks_killed_and_the_rerun_finishes_the_rest(write_grid, data_dir, tracking_uri, signum, code):
    grid = write_grid(FOUR)
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("blocking_pipeline.py")), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "BLOCK_BATCH_SIZE": "48"},
    )
    read_until(process, "BLOCKED")  # point 2 is inside its run, waiting: no race with its training
    process.send_signal(signum)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == code, output
    runs = runs_of(tracking_uri, "four")
    assert "RUNNING" not in [r.info.status for r in runs]
    kids = {r.data.params["batch_size"]: r.info.status for r in children(runs)}
    assert kids == {"32": "FINISHED", "48": "KILLED"}
    assert [r.info.status for r in runs if "mlflow.parentRunId" not in r.data.tags] == ["KILLED"]
    if signum != signal.SIGINT:
        return  # resuming is the same whatever the signal was

    out = invoke(*args)
    assert out.exit_code == 0 and "1 of 4 points already" in out.output
    finished = [r for r in children(runs_of(tracking_uri, "four")) if r.info.status == "FINISHED"]
    assert sorted(r.data.params["batch_size"] for r in finished) == ["32", "48", "64", "80"]


def test_kill_9_leaves_an_orphan_that_is_reaped_and_a_checkpoint_that_resumes(write_grid, slow_data, tracking_uri):
    grid = write_grid(
        "experiment: crash\ncheckpoint: true\ngrid:\n  batch_size: [32]\n  device: [cpu]\n  epochs: [3]\n"
    )
    args = ["run", str(grid), "--data-dir", str(slow_data), "--tracking-uri", tracking_uri]
    process = start(args)
    read_until(process, "epoch 1/3")  # printed before the epoch's checkpoint is saved: wait for the file
    from pipeline.base.names import CHECKPOINT_DIR
    from pipeline.tracking.store import local_state_dir

    saved, deadline = local_state_dir(tracking_uri) / CHECKPOINT_DIR, time.monotonic() + 120
    while not list(saved.glob("*.pt")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(saved.glob("*.pt")), f"no checkpoint in {saved} after epoch 1"
    process.kill()  # SIGKILL: no handler runs, MLflow keeps the runs RUNNING
    process.wait(timeout=30)
    assert {r.info.status for r in runs_of(tracking_uri, "crash")} == {"RUNNING"}

    out = invoke(*args)
    assert out.exit_code == 0, out.output
    assert "marked 2 run(s) KILLED whose process ended" in out.output
    assert "resuming from the checkpoint after epoch" in out.output
    runs = runs_of(tracking_uri, "crash")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED", "KILLED", "KILLED"]
    resumed = next(r for r in children(runs) if r.info.status == "FINISHED")
    first_done = int(resumed.data.tags[names.TAG_RESUMED_FROM])
    assert first_done >= 1
    client = mlflow.MlflowClient(tracking_uri)
    assert [m.step for m in client.get_metric_history(resumed.info.run_id, "test_accuracy")] == [1, 2, 3]
    killed = next(r for r in children(runs) if r.info.status == "KILLED")
    assert resumed.data.tags["pipeline.resumed_from_run"] == killed.info.run_id
    assert "ended without closing" in killed.data.tags[names.TAG_KILLED_REASON]
    assert not list((tracking_uri_dir(tracking_uri) / names.CHECKPOINT_DIR).glob("*.pt"))


def tracking_uri_dir(uri: str):
    from pathlib import Path

    return Path(uri[len("sqlite:///") :]).parent


def test_resumed_training_equals_uninterrupted_training(data_dir):
    """A checkpoint carries weights, optimizer moments and the shuffling order."""
    from pipeline.settings.config import RunConfig
    from pipeline.training.data import load
    from pipeline.training.train import Hooks, fit

    class Keep(Hooks):
        checkpointing = True
        states: list = []

        def save_state(self, state):
            import copy

            self.states.append(copy.deepcopy(state))  # state_dict()s are live references

    config = RunConfig(batch_size=64, epochs=3, seed=3)
    dataset = load(data_dir)
    full = fit(config, dataset, torch.device("cpu"), Keep())
    resumed = fit(config, dataset, torch.device("cpu"), resume=Keep.states[0])
    assert [e.epoch for e in resumed.epochs] == [1, 2, 3]
    assert resumed.final.train_loss == pytest.approx(full.final.train_loss, rel=1e-6)
    assert resumed.final.test_accuracy == full.final.test_accuracy


def test_divergence_fails_that_run_only(write_grid, data_dir, tracking_uri):
    grid = write_grid("experiment: nan\ngrid:\n  lr: [1000000000000.0, 0.01]\n  batch_size: [64]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 1
    assert "failed #1: Diverged: diverged at epoch 1, step" in out.output
    runs = {r.data.params["lr"]: r for r in children(runs_of(tracking_uri, "nan"))}
    assert runs["1000000000000.0"].info.status == "FAILED"
    assert "diverged at epoch 1, step" in runs["1000000000000.0"].data.tags[names.TAG_ERROR]
    assert runs["0.01"].info.status == "FINISHED"


def test_fail_fast_stops_the_grid(write_grid, data_dir, tracking_uri):
    grid = write_grid("experiment: ff\ngrid:\n  lr: [1000000000000.0, 0.01]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri, "--fail-fast")
    assert out.exit_code == 1 and "NOT RUN" in out.output and "--fail-fast after #1 failed" in out.output
    assert [r.info.status for r in children(runs_of(tracking_uri, "ff"))] == ["FAILED"]


def test_an_error_nothing_planned_for_ends_the_sweep_failed_not_running(
    write_grid, data_dir, tracking_uri, monkeypatch
):
    """A bug, or an output that cannot be written, raised between points (here by the progress
    line): the error still goes up, and the parent ends FAILED with it instead of staying RUNNING."""
    from pipeline.present.report import Reporter

    def broken(self, outcome):
        raise RuntimeError("the progress line broke")

    monkeypatch.setattr(Reporter, "run_end", broken)
    grid = write_grid("experiment: bug\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    with pytest.raises(RuntimeError, match="the progress line broke"):
        invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    runs = runs_of(tracking_uri, "bug")
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    (parent,) = [r for r in runs if r.data.tags.get(names.TAG_ROLE) == "sweep"]
    assert parent.info.status == "FAILED"
    assert parent.data.tags[names.TAG_ERROR] == "the sweep stopped on RuntimeError: the progress line broke"


def test_cuda_oom_is_a_failed_run_with_a_hint(write_grid, data_dir, tracking_uri, monkeypatch):
    import pipeline.training.train as train_mod

    real_fit = train_mod.fit

    def oom_for_big_batches(config, *args, **kwargs):
        if config.batch_size > 128:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_fit(config, *args, **kwargs)

    monkeypatch.setattr(train_mod, "fit", oom_for_big_batches)
    grid = write_grid("experiment: oom\ngrid:\n  batch_size: [256, 64]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 1
    runs = {r.data.params["batch_size"]: r for r in children(runs_of(tracking_uri, "oom"))}
    assert "CUDA out of memory at batch_size 256: lower batch_size" in runs["256"].data.tags[names.TAG_ERROR]
    assert runs["64"].info.status == "FINISHED"


def test_dataloader_worker_crash_fails_the_run(write_grid, data_dir, tracking_uri, monkeypatch):
    from pipeline.training import data as data_mod

    real = data_mod._IndexedSplit.__getitem__

    def crash_in_worker(self, index):
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, index)

    monkeypatch.setattr(data_mod._IndexedSplit, "__getitem__", crash_in_worker)
    grid = write_grid("experiment: worker\ngrid:\n  num_workers: [1, 0]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 1
    runs = {r.data.params["num_workers"]: r for r in children(runs_of(tracking_uri, "worker"))}
    assert runs["1"].info.status == "FAILED" and "DataLoader worker" in runs["1"].data.tags[names.TAG_ERROR]
    assert runs["0"].info.status == "FINISHED"


def test_results_file_and_relog_after_an_outage(write_grid, data_dir, tracking_uri, monkeypatch):
    from pipeline.tracking.tracker import Tracker

    grid = write_grid("experiment: outage\ngrid:\n  batch_size: [64, 128, 256]\n  device: [cpu]\n  epochs: [2]\n")
    real = Tracker.log_epochs
    store_down_for(monkeypatch, "128")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    words = " ".join(out.output.split())
    assert out.exit_code == 1 and "tracking store stopped answering" in words and "`pipeline relog`" in words
    results = tracking_uri_dir(tracking_uri) / names.RESULTS_FILE
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(line["params"]["batch_size"], line["logged"]) for line in lines] == [(64, True), (128, False)]
    assert [e["epoch"] for e in lines[1]["epochs"]] == [1, 2]  # training went on while tracking was down
    statuses = {r.data.params["batch_size"]: r.info.status for r in children(runs_of(tracking_uri, "outage"))}
    assert statuses == {"64": "FINISHED", "128": "FAILED"}  # 256 was not started

    monkeypatch.setattr(Tracker, "log_epochs", real)
    out = invoke("relog", "--tracking-uri", tracking_uri)
    assert out.exit_code == 0 and "logged 1 run(s)" in out.output
    client = mlflow.MlflowClient(tracking_uri)
    relogged = client.get_run(json.loads(results.read_text().splitlines()[1])["relogged_as"])
    assert relogged.info.status == "FINISHED" and relogged.data.params["batch_size"] == "128"
    assert [m.step for m in client.get_metric_history(relogged.info.run_id, "test_accuracy")] == [1, 2]
    (output,) = relogged.outputs.model_outputs  # the model is logged at the final epoch, linked to it
    linked = {m.key: m.step for m in client.get_logged_model(output.model_id).metrics}
    assert output.step == 2 and linked["test_accuracy"] == 2
    for name in (names.RUN_DURATION, "warmup_s"):  # from the results file
        assert [m.step for m in client.get_metric_history(relogged.info.run_id, name)] == [0], name
    assert relogged.data.tags[names.TAG_PARAM_DEVICES] == "cpu"
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0 and "2 of 3 points already" in out.output  # only 256 trains now


@pytest.mark.slow  # one of the longest (40-75 s on 2 cores): make test-slow
def test_two_concurrent_sweeps_into_one_new_sqlite_store(tmp_path, write_grid, data_dir):
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    (tmp_path / "shared").mkdir()
    grids = [
        write_grid(f"experiment: both\ngrid:\n  batch_size: [{a}, {b}, {c}]\n  device: [cpu]\n", f"g{i}.yaml")
        for i, (a, b, c) in enumerate([(64, 96, 128), (160, 192, 224)])
    ]
    processes = [start(["run", str(g), "--data-dir", str(data_dir), "--tracking-uri", uri]) for g in grids]
    outputs = [p.communicate(timeout=240)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    runs = runs_of(uri, "both")
    assert len(runs) == 8 and {r.info.status for r in runs} == {"FINISHED"}


FOREIGN_CLIENT = """
import sys, mlflow
print("imported", flush=True)
sys.stdin.readline()
mlflow.MlflowClient(sys.argv[1]).search_experiments()  # creates the store, as the UI or a notebook would
"""


@pytest.mark.slow  # two races with MLflow's own client (15-30 s on 2 cores)
def test_a_new_store_created_by_a_foreign_client_at_the_same_moment(tmp_path):
    """Another MLflow program (not a pipeline: our lock means nothing to it) creates the same new
    sqlite store; ours starts while its tables are half made. Interleaved migrations fail on one
    side or both ("table ... already exists", "duplicate column name", ...): ours either opens the
    store or says in one line that another program is creating it, at once (it waited up to 45 s
    before), and opens it once that program is done, unless both left it half made, which the same
    line names the file to delete for."""
    from pipeline.errors import UserError
    from pipeline.tracking.store import open_client

    for attempt in range(2):
        path = tmp_path / f"race{attempt}" / "mlflow.db"
        path.parent.mkdir()
        uri = f"sqlite:///{path}"
        foreign = subprocess.Popen(
            [sys.executable, "-c", FOREIGN_CLIENT, uri],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert foreign.stdout.readline().strip() == "imported"
        foreign.stdin.write("go\n")
        foreign.stdin.flush()
        deadline = time.monotonic() + 60
        while not (path.exists() and path.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the foreign client has begun creating its tables
        started = time.monotonic()
        try:
            client = open_client(uri)
        except UserError as exc:
            assert time.monotonic() - started < 15, "waited for the other program"
            said = "another program is creating this new store at the same moment (our lock means nothing to it)"
            assert said in str(exc) and "run again once it is done" in str(exc), str(exc)
            foreign.wait(timeout=120)
            try:
                client = open_client(uri)
            except UserError as again:  # both migrations failed half-way: the store cannot be opened
                assert "_alembic_tmp_" in str(again) and f"delete {path}" in str(again), str(again)
                continue
        foreign.wait(timeout=120)
        experiment = client.create_experiment("after-the-race")
        assert mlflow.MlflowClient(uri).get_experiment(experiment).name == "after-the-race"


def test_secrets_in_the_environment_are_never_logged(write_grid, data_dir, tracking_uri, monkeypatch):
    secret = "s3cr3t-value-do-not-log"
    for name in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN"):
        monkeypatch.setenv(name, secret)
    grid = write_grid("experiment: secrets\ngrid:\n  device: [cpu]\n")
    assert invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri).exit_code == 0
    for run in runs_of(tracking_uri, "secrets"):
        values = [*run.data.params.values(), *run.data.tags.values()]
        assert not any(secret in v for v in values)
