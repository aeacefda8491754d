"""A grid on Ray: an embedded cluster (num_cpus=2) logging to a real tracking server."""

from __future__ import annotations

import signal

import mlflow
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.errors import UserError

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_grid_on_ray_logs_to_a_tracking_server(cluster, tracking_server, tmp_path, write_grid, data_dir):
    uri = tracking_server
    grid = write_grid("experiment: on-ray\ngrid:\n  batch_size: [64, 128]\n  seed: [0, 1]\n"
                      "  device: [cpu]\n  epochs: [2]\n")
    out = CliRunner().invoke(main, ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", uri,
                                    "--executor", "ray"])
    assert out.exit_code == 0, out.output
    assert "submitted 4 point(s) to Ray" in out.output and "[4/4]" in out.output
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("on-ray").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(kids) == 4 and {r.info.status for r in kids} == {"FINISHED"}
    assert sorted((r.data.params["batch_size"], r.data.params["seed"]) for r in kids) == [
        ("128", "0"), ("128", "1"), ("64", "0"), ("64", "1")]
    for run in kids:
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1, 2]
    # The driver writes the local results file (for a server: in the working directory).
    assert len((tmp_path / "pipeline-results.jsonl").read_text().splitlines()) == 4


def test_a_gpu_point_on_a_gpu_less_cluster_is_skipped_at_once(cluster, write_grid, data_dir, tracking_uri):
    grid = write_grid("experiment: gpu-less\ngrid:\n  device: [cuda, cpu]\n  gpus_per_run: [0.5]\n")
    out = CliRunner().invoke(main, ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri,
                                    "--executor", "ray"])
    assert out.exit_code == 0, out.output
    assert "cuda needs 0.5 GPU(s) but the Ray cluster has 0" in out.output


def test_sqlite_is_refused_for_a_multi_node_cluster(cluster, monkeypatch, tracking_uri):
    from pipeline.executors import RayExecutor
    from pipeline.report import Reporter

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}, {"Alive": True}])
    with pytest.raises(UserError, match="cannot share; start a tracking server"):
        RayExecutor("auto", tracking_uri, Reporter())


def test_fail_fast_stops_submitting_on_ray(cluster, write_grid, data_dir, tracking_uri):
    """The first point diverges at its first step; with --fail-fast the points not yet submitted
    (the cluster's 2 CPUs hold 2 in flight) are NOT RUN instead of being trained."""
    grid = write_grid("experiment: ray-ff\ngrid:\n  lr: [1000000000000.0, 0.01, 0.02, 0.03, 0.04]\n"
                      "  device: [cpu]\n")
    out = CliRunner().invoke(main, ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri,
                                    "--executor", "ray", "--fail-fast"])
    assert out.exit_code == 1, out.output
    assert "not run #" in out.output and "--fail-fast after #1 failed" in out.output, out.output
    client = mlflow.MlflowClient(tracking_uri)
    kids = [r for r in client.search_runs([client.get_experiment_by_name("ray-ff").experiment_id])
            if "mlflow.parentRunId" in r.data.tags]
    assert 1 <= len(kids) < 5


def test_interrupting_a_ray_sweep_leaves_nothing_running_and_resumes(write_grid, tracking_uri, tmp_path):
    """Ctrl-C on the driver (its own Ray, as a user runs it); then the same command finishes the rest."""
    from conftest import children, invoke, make_idx, read_until, runs_of, start_pipeline as start

    data = make_idx(tmp_path / "data", n_train=3000, n_test=200)
    grid = write_grid("experiment: ray-stop\ngrid:\n  batch_size: [32, 48, 64, 80]\n  device: [cpu]\n  epochs: [2]\n")
    args = ["run", str(grid), "--data-dir", str(data), "--tracking-uri", tracking_uri, "--executor", "ray"]
    process = start(args)
    read_until(process, "[1/4]", seconds=180)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    runs = runs_of(tracking_uri, "ray-stop")
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    finished = {r.data.params["batch_size"] for r in children(runs) if r.info.status == "FINISHED"}
    assert 1 <= len(finished) < 4

    if ray.is_initialized():  # the rerun starts its own Ray, as a user's would
        ray.shutdown()
    out = invoke(*args)
    assert out.exit_code == 0, out.output
    assert f"{len(finished)} of 4 points already" in out.output
    done = [r for r in children(runs_of(tracking_uri, "ray-stop")) if r.info.status == "FINISHED"]
    assert sorted(r.data.params["batch_size"] for r in done) == ["32", "48", "64", "80"]


def _planned(device: str, resolved=None):
    import torch

    from pipeline.config import RunConfig
    from pipeline.executors import Planned
    from pipeline.grid import GridPoint

    config = RunConfig(device=device, gpus_per_run=0.5)
    return Planned(GridPoint(1, config, device), torch.device(resolved) if resolved else None)


def test_gpu_resources_follow_the_planned_device(cluster, tracking_uri):
    """auto asks for a GPU exactly when it resolves to cuda; cuda:N cannot be pinned under Ray."""
    from pipeline.executors import RayExecutor, task_resources
    from pipeline.report import Reporter

    executor = RayExecutor(None, tracking_uri, Reporter())
    executor.resources = {"CPU": 4.0, "GPU": 2.0}  # as a GPU cluster reports them
    auto_gpu, auto_cpu, cuda, pinned = executor.plan(
        [_planned("auto", "cuda:0"), _planned("auto", "cpu"), _planned("cuda"), _planned("cuda:1")])
    assert task_resources(auto_gpu.point.config, auto_gpu.device.type)["num_gpus"] == 0.5
    assert task_resources(auto_cpu.point.config, auto_cpu.device.type)["num_gpus"] == 0
    assert cuda.device.type == "cuda" and cuda.hardware == "ray cluster cuda"
    assert pinned.device is None and "cuda:1 cannot be pinned on a Ray cluster" in pinned.reason


def test_a_gpu_task_runs_once_per_worker(cluster, tracking_uri):
    from pipeline.executors import RayExecutor
    from pipeline.report import Reporter

    tasks = RayExecutor(None, tracking_uri, Reporter()).tasks()
    assert tasks["gpu"]._default_options["max_calls"] == 1
    assert tasks["cpu"]._default_options.get("max_calls", 0) in (0, None)


def test_a_worker_trains_on_the_gpu_ray_gave_it(monkeypatch):
    """In a worker Ray shows only the assigned GPU (CUDA_VISIBLE_DEVICES=N makes it cuda:0): the task
    runs on the planned kind of device there, whatever index the driver saw."""
    import torch

    import pipeline.executors as executors
    from pipeline.point import DataRef, PointJob

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    seen = []
    monkeypatch.setattr(executors, "run_point", lambda job: seen.append(job.device))
    point = _planned("cuda").point
    job = PointJob(point, "cuda:1", "key", "sqlite:///x.db", "1", "e", DataRef("/nowhere"))
    executors._run_remote_gpu(job, 1)
    # An auto point the driver planned on the cpu asked for no GPU: it must not take one it finds.
    executors._run_remote(PointJob(_planned("auto").point, "cpu", "key", "sqlite:///x.db", "1", "e",
                                   DataRef("/nowhere")), 1)
    assert seen == ["cuda:0", "cpu"]
