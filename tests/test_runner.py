"""The runner's story with a fake point function: what it asks executors to run and what it does
with each outcome (results file, --fail-fast, a store outage, the parent's status), on a real store."""

from __future__ import annotations

import io
import json

import mlflow
import pytest
import torch
from rich.console import Console

from pipeline.execution.executors import LocalExecutor
from pipeline.execution.outcomes import FAILED, FINISHED, NOT_RUN, UNLOGGED, Outcome
from pipeline.execution.point import PointJob
from pipeline.present.report import Reporter
from pipeline.settings.config import load_grid
from pipeline.sweep.runner import Options, run_grid
from pipeline.tracking import results
from pipeline.training.train import EpochStats

THREE = "experiment: fake\ngrid:\n  batch_size: [16, 32, 64]\n  device: [cpu]\n  epochs: [2]\n"


class FakePoint:
    """Stands in for point.run_point: records the jobs, returns a chosen status per grid index."""

    def __init__(self, statuses: dict[int, str]) -> None:
        self.statuses, self.jobs = statuses, []

    def __call__(self, job: PointJob, progress) -> Outcome:
        self.jobs.append(job)
        status = self.statuses.get(job.point.index, FINISHED)
        epochs = [EpochStats(e, 1.0, 0.5, 1.0, 0.5, 0.25 * e, 100.0) for e in (1, 2)]
        outcome = Outcome(
            job.point, status, device=job.device, epochs=epochs, run_duration_s=1.0, run_id=f"fake-{job.point.index}"
        )
        if status == FAILED:
            outcome.epochs, outcome.reason = [], "RuntimeError: boom"
        if status == UNLOGGED:
            outcome.store_down, outcome.reason = True, "http://x stopped answering (connection refused)"
            outcome.model_state = {"w": torch.zeros(2)}
        return outcome


def sweep(write_grid, data_dir, tracking_uri, fake: FakePoint, grid: str = THREE, **options):
    output = io.StringIO()
    reporter = Reporter(Console(file=output, width=200))
    result = run_grid(
        load_grid(write_grid(grid)),
        reporter,
        Options(tracking_uri=tracking_uri, data_dir=str(data_dir), **options),
        executor=LocalExecutor(reporter, point_function=fake),
    )
    return result, output.getvalue()


def results_lines(tracking_uri: str) -> list[dict]:
    from pipeline.tracking.store import local_state_dir

    path = results.path_in(local_state_dir(tracking_uri))
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_point_becomes_one_job_under_the_parent(write_grid, data_dir, tracking_uri):
    fake = FakePoint({})
    result, _ = sweep(write_grid, data_dir, tracking_uri, fake)
    assert [o.status for o in result.outcomes] == [FINISHED] * 3 and result.exit_code == 0
    assert [j.point.index for j in fake.jobs] == [1, 2, 3]
    assert [j.position for j in fake.jobs] == [(1, 3), (2, 3), (3, 3)]
    assert {j.parent_run_id for j in fake.jobs} == {result.parent_run_id}
    assert len({j.run_key for j in fake.jobs}) == 3 and all(j.device == "cpu" for j in fake.jobs)
    assert not any(j.save_checkpoints or j.resume for j in fake.jobs)
    parent = mlflow.MlflowClient(tracking_uri).get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert [(line["params"]["batch_size"], line["logged"]) for line in results_lines(tracking_uri)] == [
        (16, True),
        (32, True),
        (64, True),
    ]


def test_fail_fast_runs_nothing_after_the_first_failure(write_grid, data_dir, tracking_uri):
    fake = FakePoint({1: FAILED})
    result, output = sweep(write_grid, data_dir, tracking_uri, fake, fail_fast=True)
    assert [j.point.index for j in fake.jobs] == [1]
    assert [o.status for o in result.outcomes] == [FAILED, NOT_RUN, NOT_RUN]
    assert result.outcomes[2].reason == "--fail-fast after #1 failed"
    assert result.exit_code == 1 and "2 not run" in output
    assert mlflow.MlflowClient(tracking_uri).get_run(result.parent_run_id).info.status == "FAILED"


def test_without_fail_fast_a_failure_does_not_stop_the_grid(write_grid, data_dir, tracking_uri):
    fake = FakePoint({1: FAILED})
    result, _ = sweep(write_grid, data_dir, tracking_uri, fake)
    assert [o.status for o in result.outcomes] == [FAILED, FINISHED, FINISHED] and result.exit_code == 1


def test_a_store_outage_stops_the_sweep_and_keeps_what_was_trained(write_grid, data_dir, tracking_uri):
    fake = FakePoint({2: UNLOGGED})
    result, output = sweep(write_grid, data_dir, tracking_uri, fake)
    assert [o.status for o in result.outcomes] == [FINISHED, UNLOGGED, NOT_RUN]
    assert result.outcomes[2].reason == "the tracking store stopped answering"
    assert result.exit_code == 1
    words = " ".join(output.split())  # as read, whatever the console's line width
    assert "UNLOGGED" in words and "1 unlogged" in words and "`pipeline relog` logs them" in words
    lines = results_lines(tracking_uri)
    assert [(line["params"]["batch_size"], line["logged"]) for line in lines] == [(16, True), (32, False)]
    assert torch.load(lines[1]["model_file"])["w"].shape == (2,)  # the weights wait for relog too
    # The sweep tries once to end its parent FAILED with the reason: where the store still answers
    # (here, or where only the artifacts' disk filled), it is not left RUNNING.
    parent = mlflow.MlflowClient(tracking_uri).get_run(result.parent_run_id)
    assert parent.info.status == "FAILED" and parent.data.tags["pipeline.error"].startswith("the sweep stopped: ")


AUTO = "experiment: fake\nrepeats: auto\ngrid:\n  batch_size: [16, 32]\n  device: [cpu]\n  epochs: [2]\n"


@pytest.mark.parametrize(
    "statuses, options, trained, why",
    [
        ({i: FAILED for i in range(1, 5)}, {}, 4, "no run of rounds 1-2 finished"),
        ({1: FAILED}, {"fail_fast": True}, 1, "--fail-fast after #1 failed"),
        ({3: UNLOGGED}, {}, 3, "the tracking store stopped answering"),
    ],
)
def test_auto_repeats_stop_when_a_round_finishes_nothing_or_is_cut_short(
    write_grid, data_dir, tracking_uri, statuses, options, trained, why
):
    """Failing runs never loop: `repeats: auto` stops after a round in which no run finished, or one
    that --fail-fast or a store outage cut short, and says so."""
    fake = FakePoint(statuses)
    result, output = sweep(write_grid, data_dir, tracking_uri, fake, grid=AUTO, **options)
    assert [j.point.index for j in fake.jobs] == list(range(1, trained + 1))
    assert [o.point.name for o in result.outcomes] == ["cpu bs16 r1", "cpu bs32 r1", "cpu bs16 r2", "cpu bs32 r2"]
    assert result.stopped == f"repeats: auto stopped after 2 rounds: {why}" and result.exit_code == 1
    assert result.stopped in output


def test_a_point_waiting_in_the_results_file_is_not_trained_again(write_grid, data_dir, tracking_uri):
    sweep(write_grid, data_dir, tracking_uri, FakePoint({2: UNLOGGED}))
    fake = FakePoint({})
    result, output = sweep(write_grid, data_dir, tracking_uri, fake)
    assert [j.point.index for j in fake.jobs] == [1, 3]  # the fake logged nothing: 1 is not DONE
    assert result.outcomes[1].status == UNLOGGED and "run `pipeline relog`" in result.outcomes[1].reason


@pytest.mark.parametrize("rerun", [False, True])
def test_checkpoint_jobs_resume_unless_rerun(write_grid, data_dir, tracking_uri, rerun):
    fake = FakePoint({})
    sweep(write_grid, data_dir, tracking_uri, fake, checkpoint=True, rerun=rerun)
    assert all(j.save_checkpoints for j in fake.jobs)
    assert {j.resume for j in fake.jobs} == {not rerun}
    assert all(j.checkpoint.endswith(f"{j.run_key}.pt") for j in fake.jobs)


def test_an_executor_that_cannot_start_leaves_no_experiment_behind(write_grid, data_dir, tracking_uri, monkeypatch):
    """Ray (say) refusing to start is bad input: exit 2 and nothing in the store, not an empty experiment."""
    import pipeline.sweep.runner
    from pipeline.errors import UserError

    def refuse(*args):
        raise UserError("--ray-address ray://nowhere:10001: cannot join the Ray cluster")

    monkeypatch.setattr(pipeline.sweep.runner, "open_executor", refuse)
    with pytest.raises(UserError, match="cannot join"):
        run_grid(
            load_grid(write_grid(THREE)),
            Reporter(),
            Options(tracking_uri=tracking_uri, data_dir=str(data_dir), executor="ray"),
        )
    assert mlflow.MlflowClient(tracking_uri).get_experiment_by_name("fake") is None


def test_a_failed_point_releases_its_model_before_freeing_device_memory(
    write_grid, data_dir, tracking_uri, monkeypatch
):
    """empty_cache() frees nothing while the traceback still holds the model and its optimizer."""
    import gc
    import weakref

    import pipeline.execution.point
    from pipeline.model import Network

    models, alive_at_cleanup = [], []

    def forward_fails(self, x):
        models.append(weakref.ref(self))
        raise RuntimeError("CUDA out of memory (simulated)")

    real_free = pipeline.execution.point._free_device_memory

    def free(device):
        gc.collect()
        alive_at_cleanup.append(any(ref() is not None for ref in models))
        real_free(device)

    monkeypatch.setattr(Network, "forward", forward_fails)
    monkeypatch.setattr(pipeline.execution.point, "_free_device_memory", free)
    grid = write_grid("experiment: oom-free\ngrid:\n  device: [cpu]\n")
    result = run_grid(load_grid(grid), Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir)))
    assert [o.status for o in result.outcomes] == [FAILED]
    assert alive_at_cleanup == [False]


def test_a_checkpoint_loads_on_the_cpu_whatever_the_device(data_dir, tmp_path):
    """The sampler's generator state must stay a CPU ByteTensor: loaded onto a GPU (here the meta
    device stands in for one) Generator.set_state refuses it, and every retry would fail."""
    from pipeline.execution.point import _load_checkpoint
    from pipeline.training.data import load
    from pipeline.training.train import Hooks, fit

    path = tmp_path / "point.pt"

    class Save(Hooks):
        checkpointing = True

        def save_state(self, state):
            torch.save(state, path)

    from pipeline.settings.config import RunConfig

    fit(RunConfig(batch_size=128, epochs=1), load(data_dir), torch.device("cpu"), Save())
    state = _load_checkpoint(path)
    assert state["generator"].device.type == "cpu" and state["generator"].dtype == torch.uint8
    with pytest.raises(TypeError):  # what loading onto the run's device did
        torch.Generator().set_state(torch.load(path, map_location="meta", weights_only=True)["generator"])
    torch.Generator().set_state(state["generator"])


def test_after_a_sticky_cuda_error_the_other_cuda_points_are_not_run(data_dir):
    """An illegal memory access poisons the process's CUDA context: the cuda points after it are
    NOT RUN with the reason, the cpu points go on. Out of memory is not sticky."""
    from pipeline.execution.point import DataRef, cuda_context_lost
    from pipeline.settings.config import RunConfig
    from pipeline.settings.grid import GridPoint

    assert cuda_context_lost(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"))
    assert not cuda_context_lost(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    devices = ["cuda:0", "cuda:0", "cpu", "cuda:0"]
    jobs = [
        PointJob(
            GridPoint(i, RunConfig(device=d), f"p{i}"), d, f"key{i}", "sqlite:///x.db", "1", "x", DataRef(str(data_dir))
        )
        for i, d in enumerate(devices, start=1)
    ]
    ran = []

    def point(job, progress):
        ran.append(job.point.index)
        outcome = Outcome(job.point, FINISHED if job.point.index > 1 else FAILED, device=job.device)
        outcome.device_lost = job.point.index == 1
        return outcome

    seen = []
    outcomes = LocalExecutor(point_function=point).run(jobs, lambda job, o: seen.append(o.status) or "")
    assert ran == [1, 3] and seen == [FAILED, NOT_RUN, FINISHED, NOT_RUN]
    assert "CUDA became unusable in this process after #1 failed" in outcomes[1].reason


def _store_folder(tracking_uri: str):
    from pipeline.tracking.store import local_state_dir

    return local_state_dir(tracking_uri)


@pytest.mark.parametrize("fault", ["checkpoint folder a file", "results file a folder"])
def test_a_folder_the_sweep_writes_in_is_checked_before_anything_exists(write_grid, data_dir, tracking_uri, fault):
    """A checkpoint folder that is a file made every point train, then fail: refused before the
    experiment, the parent or any run exists, and no point trains."""
    from pipeline.base.names import CHECKPOINT_DIR
    from pipeline.errors import UserError

    if fault == "checkpoint folder a file":
        (_store_folder(tracking_uri) / CHECKPOINT_DIR).write_text("a file of the user's")
        expected = "the checkpoint folder .*: not a folder; move what is there away"
    else:
        results.path_in(_store_folder(tracking_uri)).mkdir()
        expected = "the results file .*: not a file; move it away"
    fake = FakePoint({})
    with pytest.raises(UserError, match=expected):
        sweep(write_grid, data_dir, tracking_uri, fake, checkpoint=True)
    assert fake.jobs == []
    assert mlflow.MlflowClient(tracking_uri).get_experiment_by_name("fake") is None


def test_the_checkpoint_folder_is_checked_only_with_checkpoints(write_grid, data_dir, tracking_uri):
    from pipeline.base.names import CHECKPOINT_DIR

    (_store_folder(tracking_uri) / CHECKPOINT_DIR).write_text("a file of the user's")
    fake = FakePoint({})
    result, _ = sweep(write_grid, data_dir, tracking_uri, fake)
    assert result.exit_code == 0 and len(fake.jobs) == 3


def test_free_space_refuses_a_sweep_that_clearly_cannot_fit(tracking_uri, tmp_path):
    """Real free space (shutil.disk_usage) against the measured cost of a run, times the runs."""
    import shutil

    from pipeline.errors import UserError
    from pipeline.sweep.runner import ARTIFACT_BYTES_PER_RUN, STORE_BYTES_PER_RUN, _check_free_space

    folder = _store_folder(tracking_uri)
    free = shutil.disk_usage(folder).free
    too_many = free // (ARTIFACT_BYTES_PER_RUN + STORE_BYTES_PER_RUN) + 1
    with pytest.raises(UserError, match=rf"{folder}: {too_many} run\(s\) to train need about .* MB is free"):
        _check_free_space(tracking_uri, (tmp_path / "mlruns").as_uri(), too_many)
    # The same runs fit when the artifacts lie elsewhere: the store's own share is small.
    _check_free_space(tracking_uri, "s3://bucket/artifacts", too_many)
    _check_free_space(tracking_uri, str(tmp_path / "mlruns"), 10)
    _check_free_space("http://127.0.0.1:1", None, too_many * 1000)  # a server: cannot be estimated, nothing said
