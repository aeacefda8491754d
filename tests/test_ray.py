"""Grids on Ray's own multi-node test cluster (a head and a worker node on this machine, one CPU
each) logging to `pipeline server --auth` on a throwaway PostgreSQL (conftest's pg_server), logged in
(conftest's pg): the drivers have the credentials in their environment, the nodes do not."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner

from pipeline.base.names import TAG_ERROR
from pipeline.cli import main
from pipeline.errors import UserError

ray = pytest.importorskip("ray")

# Every test on the cluster (15-25 s to start on 2 cores) is in `make test-slow`, which CI runs after
# `make test` and which starts it once for them all; `make test` keeps the ones that need no cluster.


@pytest.fixture(scope="module")
def nodes():
    """Two Ray nodes on this machine, one CPU each. (Ray gives them this machine's own address: it
    resolves 127.0.0.1 to it when connecting. While the cluster runs it is this machine's
    `ray.init()` default, so a driver meant to start its own Ray sets RAY_ADDRESS=local.)"""
    import os

    from ray.cluster_utils import Cluster

    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ  # workers log in only with what the driver hands them
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def cluster(nodes):
    """This process connected to the two-node cluster, as `--ray-address` connects a driver."""
    if not ray.is_initialized():
        ray.init(address=nodes.address, log_to_driver=False)
    return nodes


@pytest.mark.slow
def test_grid_on_ray_logs_to_a_postgresql_backed_server(cluster, pg, postgres, tmp_path, write_grid, data_dir):
    """Issue 14's acceptance: a two-node cluster, `pipeline server --auth` on a throwaway PostgreSQL."""
    uri = pg["uri"]
    grid = write_grid(
        "experiment: on-ray\ngrid:\n  batch_size: [64, 128]\n  seed: [0, 1]\n  device: [cpu]\n  epochs: [2]\n"
    )
    out = CliRunner().invoke(
        main,
        [
            "run",
            str(grid),
            "--data-dir",
            str(data_dir),
            "--tracking-uri",
            uri,
            "--executor",
            "ray",
            "--ray-address",
            cluster.address,
        ],
    )
    assert out.exit_code == 0, out.output
    assert "submitted 4 point(s) to Ray (2 node(s)" in out.output and "[4/4]" in out.output
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("on-ray").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(kids) == 4 and {r.info.status for r in kids} == {"FINISHED"}
    assert sorted((r.data.params["batch_size"], r.data.params["seed"]) for r in kids) == [
        ("128", "0"),
        ("128", "1"),
        ("64", "0"),
        ("64", "1"),
    ]
    for run in kids:
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1, 2]
    import psycopg

    with psycopg.connect(postgres["uri"]) as connection:  # in the database itself
        statuses = connection.execute(
            "SELECT r.status FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
            "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId' WHERE e.name = 'on-ray'"
        ).fetchall()
    assert statuses == [("FINISHED",)] * 4
    # Each child names the node that ran it: the points were spread over both.
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    ran_on = {r.data.tags["pipeline.ray_node_id"] for r in kids}
    assert ran_on == alive and len(alive) == 2
    # A child's model loads through the server alone (artifacts proxied by it).
    mlflow.set_tracking_uri(uri)  # reset after each test (conftest)
    model = mlflow.pytorch.load_model(f"runs:/{kids[0].info.run_id}/model")
    assert sum(p.numel() for p in model.parameters()) > 0
    # The driver writes the local results file (for a server: in the working directory).
    assert len((tmp_path / "pipeline-results.jsonl").read_text().splitlines()) == 4


@pytest.mark.slow
def test_a_gpu_point_on_a_gpu_less_cluster_is_skipped_at_once(cluster, write_grid, data_dir, pg):
    grid = write_grid("experiment: gpu-less\ngrid:\n  device: [cuda, cpu]\n  gpus_per_run: [0.5]\n")
    out = CliRunner().invoke(
        main,
        [
            "run",
            str(grid),
            "--data-dir",
            str(data_dir),
            "--tracking-uri",
            pg["uri"],
            "--executor",
            "ray",
            "--ray-address",
            cluster.address,
        ],
    )
    assert out.exit_code == 0, out.output
    assert "cuda needs 0.5 GPU(s) but the Ray cluster has 0" in out.output


@pytest.mark.slow
def test_sqlite_is_refused_for_a_multi_node_cluster(cluster, write_grid, data_dir, tracking_uri):
    """Two nodes cannot share a local sqlite file: exit 2 at once, before any run is made."""
    from pipeline.execution.executors import RayExecutor
    from pipeline.present.report import Reporter

    with pytest.raises(UserError, match="cannot share; start a tracking server"):
        RayExecutor(cluster.address, tracking_uri, Reporter())
    grid = write_grid("experiment: no-sqlite\ngrid:\n  batch_size: [64, 128]\n  device: [cpu]\n")
    out = CliRunner().invoke(
        main, ["run", str(grid), "--data-dir", str(data_dir), "--executor", "ray", "--ray-address", cluster.address]
    )  # the default store, ./mlflow.db
    assert out.exit_code == 2 and "the 2 nodes of this Ray cluster cannot share" in " ".join(out.output.split())
    assert not Path("mlflow.db").exists()  # nothing half-written: not even the store


@pytest.mark.slow
def test_fail_fast_stops_submitting_on_ray(cluster, write_grid, data_dir, pg):
    """The first point diverges at its first step; with --fail-fast the points not yet submitted
    (the cluster's 2 CPUs hold 2 in flight) are NOT RUN instead of being trained."""
    grid = write_grid("experiment: ray-ff\ngrid:\n  lr: [1000000000000.0, 0.01, 0.02, 0.03, 0.04]\n  device: [cpu]\n")
    out = CliRunner().invoke(
        main,
        [
            "run",
            str(grid),
            "--data-dir",
            str(data_dir),
            "--tracking-uri",
            pg["uri"],
            "--executor",
            "ray",
            "--ray-address",
            cluster.address,
            "--fail-fast",
        ],
    )
    assert out.exit_code == 1, out.output
    assert "not run #" in out.output and "--fail-fast after #1 failed" in out.output, out.output
    client = mlflow.MlflowClient(pg["uri"])
    kids = [
        r
        for r in client.search_runs([client.get_experiment_by_name("ray-ff").experiment_id])
        if "mlflow.parentRunId" in r.data.tags
    ]
    assert 1 <= len(kids) < 5


def _planned(device: str, resolved=None):
    import torch

    from pipeline.execution.outcomes import Planned
    from pipeline.settings.config import RunConfig
    from pipeline.settings.grid import GridPoint

    config = RunConfig(device=device, gpus_per_run=0.5)
    return Planned(GridPoint(1, config, device), torch.device(resolved) if resolved else None)


@pytest.mark.slow
def test_gpu_resources_follow_the_planned_device(cluster, pg):
    """auto asks for a GPU exactly when it resolves to cuda; cuda:N cannot be pinned under Ray."""
    from pipeline.execution.executors import RayExecutor, task_resources
    from pipeline.present.report import Reporter

    executor = RayExecutor(None, pg["uri"], Reporter())
    executor.resources = {"CPU": 4.0, "GPU": 2.0}  # as a GPU cluster reports them
    auto_gpu, auto_cpu, cuda, pinned = executor.plan(
        [_planned("auto", "cuda:0"), _planned("auto", "cpu"), _planned("cuda"), _planned("cuda:1")]
    )
    assert task_resources(auto_gpu.point.config, auto_gpu.device.type)["num_gpus"] == 0.5
    assert task_resources(auto_cpu.point.config, auto_cpu.device.type)["num_gpus"] == 0
    assert cuda.device.type == "cuda" and cuda.hardware == "ray cluster cuda"
    assert pinned.device is None and "cuda:1 cannot be pinned on a Ray cluster" in pinned.reason


def test_a_task_asks_for_its_threads_and_its_workers():
    """A cpu point asks Ray for a CPU per torch thread it will train with (1 at torch's default,
    where the task gives torch the CPUs it got) and one per DataLoader worker."""
    from pipeline.execution.executors import task_resources
    from pipeline.settings.config import RunConfig

    for threads, workers, cpus in ((0, 0, 1), (0, 2, 3), (4, 0, 4), (4, 1, 5)):
        config = RunConfig(device="cpu", threads=threads, num_workers=workers)
        assert task_resources(config, "cpu") == {"num_cpus": cpus, "num_gpus": 0}


@pytest.mark.slow  # two fresh Ray workers, each importing torch and MLflow: 25 s on 2 cores
def test_a_gpu_task_runs_once_per_worker(cluster, pg, data_dir):
    """A reused worker keeps its first CUDA context, so each GPU task gets a worker process of its
    own: two GPU tasks in turn on one node run in two processes (each run's pid tag says which), on
    the kind of device the driver planned. (The GPU itself is asked away, num_gpus=0, so that this
    cpu-only cluster runs them; each point diverges at its first step, so no training is spent.)"""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pipeline.base.names import FAILED, TAG_DEVICE, TAG_PID
    from pipeline.execution.executors import Login, RayExecutor
    from pipeline.execution.point import DataRef, PointJob
    from pipeline.present.report import Reporter
    from pipeline.settings.config import RunConfig
    from pipeline.settings.grid import GridPoint

    tasks = RayExecutor(None, pg["uri"], Reporter()).tasks()
    client = mlflow.MlflowClient(pg["uri"])
    experiment_id = client.create_experiment("once-per-worker")
    point = GridPoint(1, RunConfig(device="cpu", lr=1e12), "cpu lr1e+12")
    job = PointJob(point, "cpu", "key", pg["uri"], experiment_id, "once-per-worker", DataRef(str(data_dir)))
    one_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    gpu_task = tasks["gpu"].options(num_gpus=0, num_cpus=1, max_retries=0, scheduling_strategy=one_node)
    outcomes = [ray.get(gpu_task.remote(job, 1, Login.from_environment())) for _ in range(2)]
    assert [o.status for o in outcomes] == [FAILED, FAILED], [o.reason for o in outcomes]
    tags = [client.get_run(o.run_id).data.tags for o in outcomes]
    assert [t[TAG_DEVICE] for t in tags] == ["cpu", "cpu"]
    assert len({t[TAG_PID] for t in tags}) == 2


@pytest.mark.slow  # one of the longest (30-50 s on 2 cores): make test-slow
def test_interrupting_a_ray_sweep_leaves_nothing_running(cluster, pg, write_grid, tmp_path):
    """SIGTERM to a driver joined to the cluster cancels its tasks: their runs end KILLED, none stays
    RUNNING, the finished ones stay FINISHED, and the exit code is SIGTERM's (143). (That the same
    command then trains only the rest is the runner's skip-done, the same for every executor:
    tests/test_reliability.py runs it. Not repeated here: a second Ray job costs a minute of this
    suite on 2 cores.)"""
    from conftest import children, make_idx, read_until, runs_of
    from conftest import start_pipeline as start

    data = make_idx(tmp_path / "data", n_train=1500, n_test=100)
    grid = write_grid("experiment: ray-stop\ngrid:\n  batch_size: [32, 48, 64, 80]\n  device: [cpu]\n  epochs: [2]\n")
    args = [
        "run",
        str(grid),
        "--data-dir",
        str(data),
        "--tracking-uri",
        pg["uri"],
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
    ]
    process = start(args)
    read_until(process, "[1/4]", seconds=180)
    process.send_signal(signal.SIGTERM)  # as a service manager stops it; Ray's wait once made this 130
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 143, output
    runs = runs_of(pg["uri"], "ray-stop")
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    statuses = [r.info.status for r in children(runs)]
    reasons = [(r.info.run_name, r.info.status, r.data.tags.get(TAG_ERROR)) for r in children(runs)]
    assert 1 <= statuses.count("FINISHED") < 4 and set(statuses) <= {"FINISHED", "KILLED"}, (reasons, output)


def test_the_login_handed_to_ray_tasks_never_shows_the_password(monkeypatch):
    """What a task gets: the driver's MLflow credentials, set in the worker for the task only (Ray
    reuses a worker for other tasks); its repr (in any error or log Ray might print) names the
    variables only."""
    import os

    from pipeline.execution.executors import Login
    from pipeline.tracking.store import process_settings

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "alice-s3cret-password")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://not-a-credential")
    login = Login.from_environment()
    assert "alice" not in repr(login) and repr(login) == "Login(MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_USERNAME)"
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "the-workers-own")
    with process_settings(login.values):  # as in the worker
        assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "alice-s3cret-password"
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice" and "MLFLOW_TRACKING_URI" not in os.environ
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ and os.environ["MLFLOW_TRACKING_USERNAME"] == "the-workers-own"


@pytest.mark.slow
def test_a_ray_worker_killed_mid_point_leaves_its_run_failed_not_running(cluster, pg, write_grid, tmp_path):
    """A worker killed by its pid (as the OOM killer would) while it trains a point: the driver
    reports the point FAILED and ends its MLflow run FAILED with the reason; nothing stays RUNNING."""
    import os
    import time

    from conftest import children, make_idx, read_until, runs_of
    from conftest import start_pipeline as start

    data = make_idx(tmp_path / "data", n_train=3000, n_test=100)
    grid = write_grid("experiment: ray-worker\ngrid:\n  batch_size: [16]\n  device: [cpu]\n  epochs: [20]\n")
    args = ["run", str(grid), "--data-dir", str(data), "--tracking-uri", pg["uri"], "--executor", "ray"]
    process = start([*args, "--ray-address", cluster.address], env={"COLUMNS": "200"})
    try:
        read_until(process, "submitted 1 point(s) to Ray", seconds=180)
        deadline, pid = time.monotonic() + 180, None
        while pid is None and time.monotonic() < deadline:  # the worker names itself on its run
            running = [r for r in children(runs_of(pg["uri"], "ray-worker")) if r.info.status == "RUNNING"]
            pid = int(running[0].data.tags["pipeline.pid"]) if running else None
            time.sleep(0.2)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        output = process.communicate(timeout=180)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1 and "Ray task failed" in output, output
    runs = runs_of(pg["uri"], "ray-worker")
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    (point,) = children(runs)
    assert point.info.status == "FAILED" and "Ray task failed" in point.data.tags["pipeline.killed_reason"]
    assert point.data.tags[TAG_ERROR] == point.data.tags["pipeline.killed_reason"]  # where FAILED runs say why


def test_ray_address_auto_without_a_cluster_says_how_to_start_one(tmp_path, write_grid, data_dir, tracking_uri):
    """`--ray-address auto` where no cluster runs on this machine: Ray's own reason and how to start
    one, one line, exit 2; not the token advice meant for an address where something answers."""
    from faults import pipeline

    grid = write_grid("experiment: auto\ngrid:\n  batch_size: [256]\n  device: [cpu]\n")
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    no_cluster = {"RAY_TMPDIR": str(tmp_path / "no-ray"), "RAY_ADDRESS": ""}  # where Ray looks for one
    result = pipeline([*args, "--executor", "ray", "--ray-address", "auto"], tmp_path, env=no_cluster)
    (line,) = [line for line in result.lines if line.startswith("error:")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert line.startswith("error: --ray-address auto: Could not find any running Ray instance"), line
    assert "start a cluster with `ray start --head`" in line and "RAY_AUTH_MODE" not in line


@pytest.mark.slow  # a head of its own, a refused join, a sweep on it (60-80 s on 2 cores): make test-slow
def test_a_head_that_wants_a_token_and_then_dies_mid_sweep(tmp_path, write_grid, tracking_uri):
    """`ray start --head` with token authentication. A driver without the token: one line naming
    the token and how to pass it, exit 2, nothing created (Ray printed a warning a second for 20 s,
    then advised starting the head that was running). With it, the sweep runs; the head is killed
    (its whole process group, as a lost machine would be) while its node trains the points: the
    driver reports each point FAILED and ends its MLflow run FAILED with the reason, and the parent
    too; nothing stays RUNNING."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    import time

    from conftest import children, free_port, make_idx, read_until, runs_of
    from conftest import start_pipeline as start
    from test_doc_pages import quoted_errors

    data = make_idx(tmp_path / "data", n_train=3000, n_test=100)
    grid = write_grid("experiment: ray-head\ngrid:\n  batch_size: [16, 32, 64]\n  device: [cpu]\n  epochs: [30]\n")
    port = free_port()
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a-test-token-0123456789abcdef"}
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    head_args = ["start", "--head", "--block", "--port", str(port), "--num-cpus", "2", "--temp-dir", ray_dir]
    head_args += ["--include-dashboard", "false", "--disable-usage-stats"]
    head_args += ["--dashboard-agent-listen-port", str(free_port())]
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), *head_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **token},
        start_new_session=True,  # its own process group: the head and every process it starts
    )
    args = ["run", str(grid), "--data-dir", str(data), "--tracking-uri", tracking_uri, "--executor", "ray"]
    args += ["--ray-address", f"127.0.0.1:{port}"]
    driver = None
    try:
        read_until(head, "Ray runtime started", seconds=120)
        refused = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=180)
        lines = refused.stderr.strip().splitlines()  # stdout: the data line before it
        assert refused.returncode == 2 and len(lines) == 1, refused.stdout + refused.stderr
        assert "RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN" in lines[0], lines
        page = (Path(__file__).parents[1] / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
        shown = re.sub(rf"[0-9.]+:{port}\b", "127.0.0.1:6379", lines[0])  # as the page shows it: Ray's port
        assert shown in quoted_errors(page), shown
        assert runs_of(tracking_uri, "ray-head") == []

        driver = start(args, env={"COLUMNS": "200", **token})
        read_until(driver, "submitted 3 point(s) to Ray", seconds=180)  # 2 CPUs: the third waits its turn
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(
            r.info.status == "RUNNING" for r in children(runs_of(tracking_uri, "ray-head"))
        ):
            time.sleep(0.2)
        os.killpg(head.pid, signal.SIGKILL)
        killed = time.monotonic()
        output = driver.communicate(timeout=180)[0]
        # Before Ray's core gives up on the head (60 s) and ends the driver with no word of its own.
        assert time.monotonic() - killed < 45, output
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert driver.returncode == 1 and "Ray task failed" in output, output
    runs = runs_of(tracking_uri, "ray-head")
    assert "RUNNING" not in {r.info.status for r in runs}, [(r.info.run_name, r.info.status) for r in runs]
    assert {r.info.status for r in runs} == {"FAILED"} | ({"FINISHED"} & {r.info.status for r in children(runs)})
    (parent,) = [r for r in runs if r.data.tags.get("pipeline.role") == "sweep"]
    assert parent.info.status == "FAILED", output
