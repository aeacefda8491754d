"""The answer at a glance, run side: each child's steady-state summary metrics, the parent run's params,
metrics and model output, the datasets each run records, peak memory that is a footprint, and
`pipeline run --set`. One two-point sweep (tiny data, 2 epochs) is shared by most tests."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import yaml

from conftest import children, history, invoke, isolated, new_store, runs_of
from pipeline.base import names
from pipeline.measures import timing
from pipeline.training.data import load

GRID = "experiment: glance\ngrid:\n  lr: [0.01]\n  batch_size: [512]\n  device: [cpu]\n  epochs: [1]\n"
SETS = ("--set", "batch_size=128,256", "--set", "epochs=2", "--set", "repeats=1")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_dir, _store_template):
    folder = tmp_path_factory.mktemp("glance")
    with isolated(folder):
        uri = new_store(folder, _store_template)
        grid = folder / "glance.yaml"
        grid.write_text(GRID)
        out = invoke("run", str(grid), "--tracking-uri", uri, "--data-dir", str(data_dir), *SETS)
        assert out.exit_code == 0, out.output
        runs = runs_of(uri, "glance")
        yield {
            "uri": uri,
            "client": mlflow.MlflowClient(uri),
            "output": out.output,
            "grid": grid,
            "children": children(runs),
            "parent": next(r for r in runs if r not in children(runs)),
        }


def test_the_override_is_what_trained(sweep):
    kids = sweep["children"]
    assert sorted(int(r.data.params["batch_size"]) for r in kids) == [128, 256]  # the file says 512
    assert {r.data.params["epochs"] for r in kids} == {"2"}


def test_every_child_logs_the_summary_and_end_figures_of_its_own_history(sweep):
    """What a child logs at its end is what the comparison would work out from its stored history
    (timing.run_figures), to the last bit: old and new runs compare alike."""
    client = sweep["client"]
    for run in sweep["children"]:
        rid = run.info.run_id
        expected = timing.summary(
            history(client, rid, "epoch_duration_s"),
            history(client, rid, "images_per_s"),
            history(client, rid, "test_accuracy")[-1],
        )
        assert set(expected) == {names.STEADY_EPOCH, names.STEADY_IMAGES, names.FINAL_ACCURACY}
        expected = timing.run_figures(
            {name: history(client, rid, name) for name in timing.FIGURE_HISTORIES},
            history(client, rid, "test_accuracy")[-1],
        )
        # energy_j only where a counter is readable: then its steady mean too
        told = {
            names.TRAINED_EPOCHS,
            names.FIRST_EPOCH,
            *names.TIME_SHARES,
            names.PEAK_MEMORY,
            *([names.STEADY_ENERGY] if history(client, rid, "energy_j") else []),
        }
        assert set(expected) == {names.STEADY_EPOCH, names.STEADY_IMAGES, names.FINAL_ACCURACY, *told}
        assert {name: run.data.metrics[name] for name in expected} == expected
        assert expected[names.TRAINED_EPOCHS] == 2
        assert expected[names.FIRST_EPOCH] == history(client, rid, "epoch_duration_s")[0]
        for name in expected:  # run-level, once
            assert [m.step for m in client.get_metric_history(rid, name)] == [0]
        assert len(history(client, rid, "epoch_duration_s")) == 2  # the per-epoch history stays


def test_the_parent_has_params_metrics_and_the_best_model(sweep):
    parent, kids = sweep["parent"], sweep["children"]
    assert parent.data.params["batch_size"] == "128,256"
    assert parent.data.params["epochs"] == "2"
    assert parent.data.params["repeats"] == "1"
    metrics = parent.data.metrics
    assert metrics[names.FINISHED_RUNS] == 2
    assert metrics[names.BEST_STEADY_EPOCH] == min(r.data.metrics[names.STEADY_EPOCH] for r in kids)
    best = max(kids, key=lambda r: r.data.metrics[names.FINAL_ACCURACY])
    assert metrics[names.BEST_FINAL_ACCURACY] == best.data.metrics[names.FINAL_ACCURACY]
    # A model output is what MLflow 3.17's UI tells a training run from an evaluation run by.
    linked = [m.model_id for m in parent.outputs.model_outputs]
    assert linked == [m.model_id for m in best.outputs.model_outputs] and linked


def test_the_parent_records_the_overrides_and_the_effective_grid(sweep, tmp_path):
    parent, client = sweep["parent"], sweep["client"]
    assert parent.data.tags[names.TAG_OVERRIDES] == "--set batch_size=128,256 --set epochs=2 --set repeats=1"
    files = {f.path for f in client.list_artifacts(parent.info.run_id, "grid")}
    assert files == {"grid/glance.yaml", names.ARTIFACT_EFFECTIVE_GRID}
    original = mlflow.artifacts.download_artifacts(
        run_id=parent.info.run_id, artifact_path="grid/glance.yaml", tracking_uri=sweep["uri"], dst_path=str(tmp_path)
    )
    assert Path(original).read_text() == GRID
    effective_file = mlflow.artifacts.download_artifacts(
        run_id=parent.info.run_id,
        artifact_path=names.ARTIFACT_EFFECTIVE_GRID,
        tracking_uri=sweep["uri"],
        dst_path=str(tmp_path),
    )
    effective = yaml.safe_load(Path(effective_file).read_text())
    assert effective["grid"]["batch_size"] == [128, 256] and effective["grid"]["epochs"] == [2]
    assert sweep["grid"].read_text() == GRID  # the file itself is untouched


def test_each_run_records_its_training_and_test_data(sweep, data_dir):
    dataset = load(data_dir)
    for run in sweep["children"]:
        inputs = sweep["client"].get_run(run.info.run_id).inputs.dataset_inputs
        by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs}
        assert set(by_context) == {"training", "testing"}
        for context, split, size in (("training", "train", 512), ("testing", "test", 256)):
            recorded = by_context[context]
            assert recorded.digest == dataset.digest(split)
            assert json.loads(recorded.source) == {"uri": str(data_dir)}
            assert json.loads(recorded.profile)["features_shape"] == [size, 1, 28, 28]
    assert dataset.digest("train") != dataset.digest("test")
    assert load(data_dir, train_size=100).digest("train") != dataset.digest("train")  # a subset is other data


def test_peak_memory_is_a_footprint_at_every_epoch(sweep):
    for run in sweep["children"]:
        peaks = history(sweep["client"], run.info.run_id, "peak_memory_mb")
        assert len(peaks) == 2 and all(p > 10 for p in peaks)  # the process's resident peak, never 0


def test_a_done_point_says_its_summary(sweep, data_dir):
    out = invoke(
        "run", str(sweep["grid"]), "--tracking-uri", sweep["uri"], "--data-dir", str(data_dir), *SETS, "--dry-run"
    )
    assert out.exit_code == 0, out.output
    kid = sweep["children"][0]
    said = timing.summary_line(
        {name: kid.data.metrics[name] for name in (names.STEADY_EPOCH, names.STEADY_IMAGES, names.FINAL_ACCURACY)}
    )
    assert said.startswith("steady epoch ") and "img/s" in said
    assert f"already FINISHED as run {kid.info.run_id}: {said}" in " ".join(out.output.split())


def test_the_printed_ui_command_is_the_one_pipeline_ui_runs(sweep):
    from pipeline.tracking.store import UI_ENV, UI_OPTIONS

    assert UI_OPTIONS == ("--workers", "1")
    assert UI_ENV == {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    said = " ".join(sweep["output"].split())  # the console wraps long lines
    command = said.split("Open the MLflow UI: ", 1)[1].split(" then browse to")[0]
    assert command.startswith("MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false ")
    assert command.endswith(" ui --backend-store-uri " + sweep["uri"] + " --port 5000 --workers 1")


def test_relog_logs_the_summary_of_a_line_without_one(tracking_uri, tmp_path):
    """A results line written before the summary and end figures existed: relog works them out from
    the epochs."""
    from pipeline.tracking import results

    epochs = [
        {
            "epoch": n,
            "train_loss": 1.0,
            "train_accuracy": 0.5,
            "test_loss": 1.0,
            "test_accuracy": acc,
            "epoch_duration_s": s,
            "images_per_s": 512 / s,
            "peak_memory_mb": 300.0,
        }
        for n, acc, s in ((1, 0.5, 2.0), (2, 0.61234, 1.0), (3, 0.7, 1.5))
    ]
    line = {
        "logged": False,
        "tracking_uri": tracking_uri,
        "experiment": "relogged",
        "name": "old",
        "params": {"lr": 0.01},
        "epochs": epochs,
        "run_key": "k",
    }
    (tmp_path / "r.jsonl").write_text(json.dumps(line) + "\n")
    (done,) = results.relog(tmp_path / "r.jsonl")
    metrics = mlflow.MlflowClient(tracking_uri).get_run(done.run_id).data.metrics
    assert {k: metrics[k] for k in (names.STEADY_EPOCH, names.STEADY_IMAGES, names.FINAL_ACCURACY)} == {
        names.STEADY_EPOCH: 1.25,
        names.STEADY_IMAGES: round(512 / 1.25),  # an epoch's images over that epoch time, not a median of rates
        names.FINAL_ACCURACY: 0.7,
    }
    # No time buckets in the line: each bucket took none of the steady epochs (the defaults, 0 s).
    assert {k: metrics[k] for k in names.END_FIGURES if k in metrics} == {
        names.TRAINED_EPOCHS: 3,
        names.FIRST_EPOCH: 2.0,
        **{share: 0.0 for share in names.TIME_SHARES},
        names.PEAK_MEMORY: 300.0,
    }
