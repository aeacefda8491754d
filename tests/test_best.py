"""One best, by one rule, on a real sweep: the verdict, the parent run's model, `pipeline register`
without --run-id and the first row of the UI's view name the same run. And the real A/A check:
two seeds with one run each are too few to judge."""

from __future__ import annotations

import json
import re

import mlflow

from conftest import invoke as invoke_cli
from pipeline.base import names
from pipeline.present import view

GRID = """experiment: best
repeats: 2
grid:
  lr: [0.01, 0.003]
  batch_size: [64, 128]
  device: [cpu]
  epochs: [2]
"""


def invoke(*args: str):
    """The CLI 200 columns wide: the verdict's lines unwrapped."""
    return invoke_cli(*args, columns=200)


def test_the_verdict_the_parents_model_register_and_the_views_first_row_name_one_run(
    write_grid, data_dir, tracking_uri
):
    out = invoke("run", str(write_grid(GRID)), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0, out.output
    client = mlflow.MlflowClient(tracking_uri)
    experiment_id = client.get_experiment_by_name("best").experiment_id
    (parent,) = client.search_runs([experiment_id], "tags.`pipeline.role` = 'sweep'")
    best = parent.data.tags["pipeline.best_run"]

    # The verdict, at the sweep's end and in `pipeline compare`, names it first.
    for said in (out.output, invoke("compare", "--tracking-uri", tracking_uri).output):
        first = next(line for line in said.splitlines() if line.startswith("Best: "))
        assert re.search(rf"model from run {best[:8]}\)", first), first

    # The parent's model output is that run's model.
    (linked,) = parent.outputs.model_outputs
    (own,) = client.get_run(best).outputs.model_outputs
    assert linked.model_id == own.model_id

    # `pipeline register` without --run-id registers it.
    registered = invoke("register", "--experiment", "best", "--name", "best-cnn", "--tracking-uri", tracking_uri)
    assert registered.exit_code == 0, registered.output
    version = client.get_model_version_by_alias("best-cnn", "champion")
    assert version.run_id == best and version.tags["pipeline.rule"] == "best"
    assert version.tags["pipeline.sweep"] == parent.info.run_id
    # Its description names the setting and its figures, as compare gives them.
    setting = version.tags["pipeline.setting"]
    row = next(
        r
        for r in json.loads(invoke("compare", "--tracking-uri", tracking_uri, "--format", "json").stdout)
        if best in r["run_ids"].split(",")
    )
    assert version.description.startswith(
        f"Setting {setting}: {row['steady_epoch_s']:.3f} s/epoch, test acc {row['final_test_accuracy']:.4f}"
    ), version.description
    assert f"Model of run {best}" in version.description

    # The view's first row: its filter and sort, as the UI asks the store.
    state = view.read_envelope(
        client.get_experiment(experiment_id).tags[f"mlflow.sharedViewState.sweep-{parent.info.run_id}"]
    )
    key = state["orderByKey"].replace("metrics.`", "metrics.").rstrip("`")
    ordered = client.search_runs(
        [experiment_id], state["searchFilter"], order_by=[f"{key} {'ASC' if state['orderByAsc'] else 'DESC'}"]
    )
    # One row a setting (4 settings of 2 runs), the best setting's model run first, in the verdict's order.
    assert len(ordered) == 4 and ordered[0].info.run_id == best and ordered[0].data.metrics["rank"] == 1
    assert len({r.data.tags["pipeline.setting"] for r in ordered}) == 4
    assert [(r.data.params["batch_size"], r.data.params["device"]) for r in ordered] == [
        (str(row["batch_size"]), row["device"])
        for row in json.loads(invoke("compare", "--tracking-uri", tracking_uri, "--format", "json").stdout)
    ]

    # --by speed names the fastest setting's run; it is the best only where it is accurate enough.
    fastest = invoke(
        "register", "--experiment", "best", "--name", "fast-cnn", "--by", "speed", "--tracking-uri", tracking_uri
    )
    assert fastest.exit_code == 0 and "by speed (the fastest setting)" in fastest.output, fastest.output

    # Where every run was contended (as the contention check tags them on a busy machine), no speed
    # counts: --by accuracy still registers, and says the speed is withheld rather than "nan".
    for run in client.search_runs([experiment_id], "tags.`pipeline.role` = 'point'"):
        client.set_tag(run.info.run_id, names.TAG_CONTENDED, "other processes took 90% of 2 cores")
    accurate = invoke(
        "register", "--experiment", "best", "--name", "accurate-cnn", "--by", "accuracy", "--tracking-uri", tracking_uri
    )
    assert accurate.exit_code == 0, accurate.output
    assert "(speed withheld, test acc " in accurate.output and "0 of 2 runs timed" in accurate.output, accurate.output
    assert "nan" not in accurate.output, accurate.output
    version = client.get_model_version_by_alias("accurate-cnn", "champion")
    assert "nan" not in version.tags.values(), version.tags

    # Counting them is one choice everywhere: a verdict published with --include-contended names the
    # same run as its parent's tag and as `register --include-contended`; published without, there is
    # no best: the parent's tag, the UI's first line and register all take the most accurate setting
    # (register saying why), and --by speed refuses saying how to count them.
    published = invoke(
        "compare", "--experiment", "best", "--include-contended", "--publish", "--tracking-uri", tracking_uri
    )
    assert published.exit_code == 0, published.output
    named = client.get_run(parent.info.run_id).data.tags["pipeline.best_run"]
    first = next(line for line in published.output.splitlines() if line.startswith("Best: "))
    assert f"model from run {named[:8]})" in first, first
    counted = invoke(
        "register",
        "--experiment",
        "best",
        "--name",
        "counted-cnn",
        "--include-contended",
        "--tracking-uri",
        tracking_uri,
    )
    assert counted.exit_code == 0, counted.output
    assert client.get_model_version_by_alias("counted-cnn", "champion").run_id == named
    assert invoke("compare", "--experiment", "best", "--publish", "--tracking-uri", tracking_uri).exit_code == 0
    most_accurate = client.get_model_version_by_alias("accurate-cnn", "champion")
    assert client.get_run(parent.info.run_id).data.tags["pipeline.best_run"] == most_accurate.run_id
    first_line = client.get_experiment(experiment_id).tags[view.NOTE_TAG].splitlines()[0]
    setting = most_accurate.tags["pipeline.setting"]
    assert f"**Most accurate: {setting} (test acc " in first_line, first_line
    assert first_line.endswith(", speed withheld: 8 of 8 runs contended)**"), first_line
    fallback = invoke("register", "--experiment", "best", "--name", "busy", "--tracking-uri", tracking_uri)
    assert fallback.exit_code == 0, fallback.output
    assert "by accuracy (the most accurate setting), as every run is contended" in fallback.output, fallback.output
    version = client.get_model_version_by_alias("busy", "champion")
    assert version.tags["pipeline.rule"] == "accuracy"
    assert version.run_id == most_accurate.run_id
    refused = invoke(
        "register", "--experiment", "best", "--by", "speed", "--name", "none", "--tracking-uri", tracking_uri
    )
    assert refused.exit_code == 2 and "--include-contended" in refused.output, refused.output


def test_two_seeds_with_one_run_each_are_too_few_to_judge(write_grid, data_dir, tracking_uri):
    grid = "experiment: seeds\ngrid:\n  batch_size: [128]\n  seed: [0, 1]\n  device: [cpu]\n  epochs: [2]\n"
    out = invoke("run", str(write_grid(grid)), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    assert out.exit_code == 0, out.output
    compared = invoke("compare", "--versus", "seed=0", "--tracking-uri", tracking_uri)
    assert compared.exit_code == 0, compared.output
    (line,) = [line for line in compared.output.splitlines() if line.startswith("seed=1 vs seed=0")]
    assert line.endswith("(significance withheld: n too small (1 run))"), line
