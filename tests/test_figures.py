"""Each run's figures in a comparison: from what its child logged at its end (no history read), or, for
a run made before children logged them, worked out from its per-epoch history. One real sweep (tiny
data, 3 epochs, so that the steady state has two epochs) is copied into a second sweep whose children
hold only what an older child logged; both compare to the same numbers."""

from __future__ import annotations

import csv
import io
import json
import math

import mlflow
import pandas as pd
import pytest
from mlflow.entities import Metric, Param, RunTag

from conftest import SHARED_GRID, invoke, isolated, new_store, train_sweep
from pipeline.analysis.compare import CHART_HISTORIES, HISTORIES, SUMMARY, build
from pipeline.analysis.figures import EVERY, FIGURES, TIMED
from pipeline.base import names
from pipeline.present import view
from pipeline.present.report import Reporter
from pipeline.settings.config import load_grid
from pipeline.sweep.runner import Options, run_grid
from pipeline.tracking.records import read_sweep

GRID = "experiment: figures\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n  epochs: [3]\n"
# What an older child did not log: its summary and end figures, worked out later from its history.
LOGGED_AT_END = (*SUMMARY, *names.END_FIGURES)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, data_dir, _store_template):
    """(client, the sweep as trained, the same sweep as older children would have logged it)."""
    folder = tmp_path_factory.mktemp("figures")
    with isolated(folder):
        uri = new_store(folder, _store_template)
        (folder / "grid.yaml").write_text(GRID)
        result = run_grid(
            load_grid(folder / "grid.yaml"), Reporter(), Options(tracking_uri=uri, data_dir=str(data_dir))
        )
        client = mlflow.MlflowClient(uri)
        return client, result.parent_run_id, _as_older_children(client, result.parent_run_id)


def _as_older_children(client, parent_run_id: str) -> str:
    """A copy of the sweep in an experiment of its own, each child with its params, tags and every
    metric's full history but for the figures logged at the end; the copy's parent run id."""
    experiment_id = client.create_experiment("figures-older")
    parent = client.create_run(experiment_id, run_name="older", tags={names.TAG_ROLE: "sweep"}).info.run_id
    for run in read_sweep(client, parent_run_id=parent_run_id).children:
        tags = {k: v for k, v in run.tags.items() if not k.startswith("mlflow.")}
        copy = client.create_run(
            experiment_id, run_name=run.name, tags={**tags, "mlflow.parentRunId": parent}
        ).info.run_id
        metrics = [
            Metric(name, m.value, m.timestamp, m.step)
            for name in run.metrics
            if name not in LOGGED_AT_END
            for m in client.get_metric_history(run.run_id, name)
        ]
        client.log_batch(
            copy,
            metrics=metrics,
            params=[Param(k, v) for k, v in run.params.items()],
            tags=[RunTag("copied_from", run.run_id)],
        )
        client.set_terminated(copy, names.FINISHED)
    client.set_terminated(parent, names.FINISHED)
    return parent


def test_a_child_logs_every_figure_its_comparison_row_needs(sweeps):
    client, new, _ = sweeps
    for run in read_sweep(client, parent_run_id=new).children:
        assert {*SUMMARY, names.TRAINED_EPOCHS, names.FIRST_EPOCH, *names.TIME_SHARES, names.PEAK_MEMORY} <= set(
            run.metrics
        )
        assert run.metrics[names.TRAINED_EPOCHS] == 3


def test_runs_with_end_figures_are_read_without_histories_and_older_ones_with_them(sweeps):
    client, new, old = sweeps
    assert [run.histories for run in read_sweep(client, parent_run_id=new, histories=HISTORIES).children] == [{}, {}]
    for run in read_sweep(client, parent_run_id=old, histories=HISTORIES).children:
        assert set(run.histories) == set(HISTORIES) and len(run.histories["epoch_duration_s"]) == 3
    # What a chart draws is read for every run, whatever it logged.
    for parent in (new, old):
        charted = read_sweep(client, parent_run_id=parent, histories=HISTORIES, charted=CHART_HISTORIES).children
        assert all(len(run.histories["test_accuracy"]) == 3 for run in charted)


def test_old_and_new_runs_compare_to_the_same_numbers(sweeps):
    """Every per-run figure (the statistics' one value per run included), and every row figure made of
    them, to the last bit."""
    client, new, old = sweeps
    logged = build(read_sweep(client, parent_run_id=new, histories=HISTORIES))
    worked_out = build(read_sweep(client, parent_run_id=old, histories=HISTORIES))
    per_run = [c for c in logged.runs.columns if c != "run_id"]
    assert {"first_epoch_s", "peak_memory_mb", "energy_j", "data_share", "timed", *SUMMARY} <= set(per_run)
    pd.testing.assert_frame_equal(
        logged.runs[per_run].reset_index(drop=True), worked_out.runs[per_run].reset_index(drop=True), check_exact=True
    )
    medians = [f.name for f in FIGURES if f.over in (TIMED, EVERY)]
    rows = ["run_name", "n", "timed", *SUMMARY, *medians, "energy_source"]
    pd.testing.assert_frame_equal(logged.table[rows], worked_out.table[rows], check_exact=True)
    figures = logged.runs.iloc[0]
    assert figures["timed"] == "epochs 2-3" and figures["first_epoch_s"] > 0 and figures["peak_memory_mb"] > 10
    assert not math.isnan(figures["data_share"]) and 0 < figures["compute_share"] <= 1
    assert logged.epochs(logged.table.iloc[0]) == worked_out.epochs(worked_out.table.iloc[0])


def test_a_figure_added_to_the_table_is_compared_sorted_and_shown(tmp_path, data_dir, _store_template, monkeypatch):
    """One line in figures.FIGURES, and runs that log that metric: `pipeline compare` has it in its
    json and csv (the median over each setting's timed runs), in --wide's table under its label,
    --sort takes its label (highest first where higher is better), the HTML report's table of every
    figure has it, and the UI's view has a column of each run's setting's value."""
    from pipeline.analysis import figures

    fake = figures.Figure(
        "fake_widgets", TIMED, label="widgets", shown=figures.SOME, higher_is_better=True, in_view=True
    )
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, fake))
    sweep = train_sweep(tmp_path, SHARED_GRID, data_dir, _store_template)  # its own: --publish rewrites artifacts
    client = mlflow.MlflowClient(sweep.uri)
    children = [
        r
        for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
        if "mlflow.parentRunId" in r.data.tags
    ]
    widgets = {}
    for number, run in enumerate(sorted(children, key=lambda r: r.data.params["batch_size"])):
        widgets[run.data.params["batch_size"]] = 10.0 * (number + 1)
        client.log_metric(run.info.run_id, "fake_widgets", widgets[run.data.params["batch_size"]])
    uri = ["--tracking-uri", sweep.uri]

    rows = json.loads(invoke("compare", *uri, "--format", "json").stdout)
    assert {str(row["batch_size"]): row["fake_widgets"] for row in rows} == widgets
    table = list(csv.DictReader(io.StringIO(invoke("compare", *uri, "--format", "csv").stdout)))
    assert {row["batch_size"]: float(row["fake_widgets"]) for row in table} == widgets
    wide = invoke("compare", *uri, "--wide", columns=400).stdout
    header = next(line for line in wide.splitlines() if "widgets" in line)
    assert header.index("compute %") < header.index("widgets") < header.index("speedup")
    assert "10.000" in wide and "20.000" in wide
    ordered = json.loads(invoke("compare", *uri, "--format", "json", "--sort", "widgets").stdout)
    assert [row["fake_widgets"] for row in ordered] == sorted(widgets.values(), reverse=True)

    # The report's table of every figure, and the UI's view: a column of each run's setting's value.
    report = tmp_path / "report.html"
    published = invoke("compare", *uri, "--publish", "--html", str(report))
    assert published.exit_code == 0, published.output
    every = report.read_text().split('id="every-figure"')[1].split("</table>")[0]
    assert "<th>widgets</th>" in every and '<td class="number">20.000</td>' in every
    experiment = client.get_experiment(children[0].info.experiment_id)
    (saved,) = [v for k, v in experiment.tags.items() if k.startswith("mlflow.sharedViewState.")]
    columns = view.read_envelope(saved)["selectedColumns"]
    assert columns.index("metrics.`setting_fake_widgets`") == columns.index("metrics.`setting_n`") - 1
    for run in children:
        logged = client.get_run(run.info.run_id).data.metrics
        assert logged["setting_fake_widgets"] == widgets[run.data.params["batch_size"]]
