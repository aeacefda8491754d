"""Time to a target quality: the target's meaning (target.py), what a sweep records against it
(time_to_target_s, wall_to_target_s, the target tags), stop_at_target ending runs early, and relog
restoring it all from the results file. Real sqlite stores, real IDX files, the real CLI."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest

from conftest import children, history, invoke, new_store, runs_of
from pipeline.base import names
from pipeline.measures.target import Target, parse, timing
from pipeline.settings.config import load_grid
from pipeline.tracking import results


@dataclass(frozen=True)
class _Epoch:
    epoch: int
    epoch_duration_s: float
    wall_clock_s: float | None = None
    test_accuracy: float = 0.0
    test_loss: float = 9.0


def test_the_direction_follows_the_metric():
    accuracy, loss = parse({"test_accuracy": 0.85}), parse({"test_loss": "0.4"})
    assert (accuracy, str(accuracy)) == (Target("test_accuracy", 0.85), "test_accuracy >= 0.85")
    assert (loss, str(loss)) == (Target("test_loss", 0.4), "test_loss <= 0.4")
    assert accuracy.reached(0.85) and accuracy.reached(0.9) and not accuracy.reached(0.8499)
    assert loss.reached(0.4) and loss.reached(0.1) and not loss.reached(0.41)
    assert not accuracy.reached(float("nan")) and not loss.reached(float("nan"))
    assert parse({"train_accuracy": 1}).threshold == 1.0


def test_time_to_target_sums_the_epochs_and_wall_to_target_is_the_clock_at_its_evaluation():
    epochs = [
        _Epoch(1, 2.0, 3.5, test_accuracy=0.5),
        _Epoch(2, 3.0, 8.25, test_accuracy=0.9),
        _Epoch(3, 4.0, 13.0, test_accuracy=0.95),
    ]
    reached = timing(Target("test_accuracy", 0.85), epochs)
    assert (reached.epoch, reached.time_s, reached.wall_s) == (2, 5.0, 8.25)
    assert reached.metrics() == {names.TIME_TO_TARGET: (5.0, 2), names.WALL_TO_TARGET: (8.25, 2)}
    assert reached.tags() == {names.TAG_TARGET: "test_accuracy >= 0.85", names.TAG_TARGET_STATUS: "reached at epoch 2"}
    missed = timing(Target("test_loss", 0.1), epochs)
    assert missed.metrics() == {} and missed.status == "not reached in 3 epochs"
    assert timing(Target("test_loss", 0.1), epochs[:1]).status == "not reached in 1 epoch"
    # An epoch restored from a checkpoint written before the wall clock was kept: no wall figure, not a guess.
    unknown = timing(Target("test_accuracy", 0.85), [_Epoch(1, 2.0, None, test_accuracy=0.9)])
    assert unknown.metrics() == {names.TIME_TO_TARGET: (2.0, 1)}


def test_the_wall_clock_counts_the_set_up_and_every_evaluation_and_survives_a_resume(data_dir, monkeypatch):
    """Each epoch's wall_clock_s is at least the warm-up, the training passes and the evaluations up to
    it (evaluate timed from outside), at most the fit's own duration; a resumed fit carries the
    checkpointed epochs' clock and counts on from it."""
    import torch

    from pipeline.settings.config import RunConfig
    from pipeline.training import train
    from pipeline.training.data import load

    evaluations: list[float] = []
    evaluate = train.evaluate

    def timed_evaluate(*args, **kwargs):
        start = time.perf_counter()
        value = evaluate(*args, **kwargs)
        evaluations.append(time.perf_counter() - start)
        return value

    class Keep(train.Hooks):
        checkpointing, states = True, []

        def save_state(self, state):
            self.states.append({**state, "epochs": [dict(e) for e in state["epochs"]]})

    monkeypatch.setattr(train, "evaluate", timed_evaluate)
    config, dataset = RunConfig(batch_size=64, epochs=2, device="cpu"), load(data_dir, 256, 128)
    started = time.perf_counter()
    result = train.fit(config, dataset, torch.device("cpu"), Keep())
    took = time.perf_counter() - started
    for n, epoch in enumerate(result.epochs, start=1):
        trained = sum(e.epoch_duration_s for e in result.epochs[:n])
        assert epoch.wall_clock_s >= result.warmup_s + trained + sum(evaluations[:n])
    assert result.epochs[-1].wall_clock_s <= took
    first = timing(Target("test_loss", 100.0), result.epochs)  # reached at once: epoch 1
    assert (first.epoch, first.time_s, first.wall_s) == (
        1,
        result.epochs[0].epoch_duration_s,
        result.epochs[0].wall_clock_s,
    )
    assert first.wall_s >= first.time_s + evaluations[0]

    resumed = train.fit(config, dataset, torch.device("cpu"), resume=Keep.states[0])
    assert resumed.epochs[0].wall_clock_s == result.epochs[0].wall_clock_s
    assert resumed.epochs[1].wall_clock_s >= (
        result.epochs[0].wall_clock_s + resumed.warmup_s + resumed.epochs[1].epoch_duration_s + evaluations[-1]
    )


def test_a_grid_file_reads_target_and_stop_at_target(write_grid):
    spec = load_grid(write_grid("target: {test_loss: 0.5}\nstop_at_target: true\n"))
    assert spec.target == Target("test_loss", 0.5) and spec.stop_at == spec.target
    timed_only = load_grid(write_grid("target:\n  test_accuracy: 0.9\n", "timed.yaml"))
    assert timed_only.target == Target("test_accuracy", 0.9) and timed_only.stop_at is None
    plain = load_grid(write_grid("grid: {lr: [0.1]}\n", "plain.yaml"))
    assert (plain.target, plain.stop_at_target, plain.repeats) == (None, False, 1)


GRID = "experiment: {name}\ngrid:\n  batch_size: [64]\n  device: [cpu]\n  epochs: [3]\n{extra}"


def test_time_to_target_and_stop_at_target_end_to_end(write_grid, data_dir, tracking_uri, tmp_path, _store_template):
    """A target out of reach: every epoch trains, the run says so and logs no time. A target between
    epoch 1's and epoch 2's test loss, with stop_at_target: the run trains again (the stop changes
    what is trained), stops after epoch 2, and logs the sum of its epochs' durations at step 2."""
    client = mlflow.MlflowClient(tracking_uri)
    args = ["--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    far = write_grid(GRID.format(name="tt", extra="target: {test_loss: 1.0e-9}\n"), "far.yaml")
    out = invoke("run", str(far), *args)
    assert out.exit_code == 0, out.output
    (missed,) = children(runs_of(tracking_uri, "tt"))
    assert missed.data.tags[names.TAG_TARGET] == "test_loss <= 1e-09"
    assert missed.data.tags[names.TAG_TARGET_STATUS] == "not reached in 3 epochs"
    assert names.TIME_TO_TARGET not in missed.data.metrics and names.WALL_TO_TARGET not in missed.data.metrics
    parent = client.get_run(missed.data.tags["mlflow.parentRunId"])
    assert parent.data.tags[names.TAG_TARGET] == "test_loss <= 1e-09"

    # Another target without stop_at_target changes nothing that is trained: the run is DONE.
    other = write_grid(GRID.format(name="tt", extra="target: {test_accuracy: 0.5}\n"), "other.yaml")
    out = invoke("run", str(other), *args)
    assert out.exit_code == 0 and "DONE" in out.output, out.output
    assert len(children(runs_of(tracking_uri, "tt"))) == 1

    losses = history(client, missed.info.run_id, "test_loss")
    assert losses[1] < losses[0], losses  # the network learns: epoch 2 is better than epoch 1
    between = (losses[0] + losses[1]) / 2
    stop = write_grid(
        GRID.format(name="tt", extra=f"target: {{test_loss: {between!r}}}\nstop_at_target: true\n"), "stop.yaml"
    )
    out = invoke("run", str(stop), *args)
    assert out.exit_code == 0 and "DONE" not in out.output, out.output
    assert "reached at epoch 2: stopped there (stop_at_target)" in out.output
    (stopped,) = [r for r in children(runs_of(tracking_uri, "tt")) if r.info.run_id != missed.info.run_id]
    durations = {m.step: m.value for m in client.get_metric_history(stopped.info.run_id, "epoch_duration_s")}
    assert sorted(durations) == [1, 2]  # epochs: [3] is the cap; it stopped at the target
    assert stopped.data.tags[names.TAG_TARGET_STATUS] == "reached at epoch 2"
    (time_to,) = client.get_metric_history(stopped.info.run_id, names.TIME_TO_TARGET)
    (wall_to,) = client.get_metric_history(stopped.info.run_id, names.WALL_TO_TARGET)
    assert (time_to.step, wall_to.step) == (2, 2)
    assert time_to.value == pytest.approx(durations[1] + durations[2])
    # The wall clock counts the warm-up and both evaluations too, and falls within the run.
    assert wall_to.value > time_to.value + stopped.data.metrics[names.WARMUP]
    assert wall_to.value <= (stopped.info.end_time - stopped.info.start_time) / 1000
    assert stopped.data.tags[names.TAG_RUN_KEY] != missed.data.tags[names.TAG_RUN_KEY]

    # The results file keeps them for relog; relogged into another store, they come back.
    from pipeline.tracking.store import local_state_dir

    lines = [json.loads(line) for line in results.path_in(local_state_dir(tracking_uri)).read_text().splitlines()]
    (line,) = [entry for entry in lines if entry["run_id"] == stopped.info.run_id]
    assert line["metrics"][names.TIME_TO_TARGET] == [time_to.value, 2]
    assert line["tags"][names.TAG_TARGET_STATUS] == "reached at epoch 2"
    (tmp_path / "other").mkdir()
    _relog_restores(line, new_store(tmp_path / "other", _store_template), tmp_path)


def _relog_restores(line: dict, uri: str, folder: Path) -> None:
    """relog of `line` (as if the store had been down) into a new store holds the same target and
    contention numbers, at the same steps, and the same tags."""
    unlogged = {**line, "logged": False, "tracking_uri": uri, "run_id": None, "parent_run_id": None}
    results_file = folder / "relog-results.jsonl"
    results_file.write_text(json.dumps(unlogged) + "\n")
    (relogged,) = results.relog(results_file)
    client = mlflow.MlflowClient(uri)
    run = client.get_run(relogged.run_id)
    for name in (names.TIME_TO_TARGET, names.WALL_TO_TARGET, names.LOAD_AVERAGE, names.OTHERS_CPU_SHARE):
        (metric,) = client.get_metric_history(run.info.run_id, name)
        assert [metric.value, metric.step] == line["metrics"][name], name
    for tag in (names.TAG_TARGET, names.TAG_TARGET_STATUS):
        assert run.data.tags[tag] == line["tags"][tag]
