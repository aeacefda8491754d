"""Comparison reports on stores built by real small grids: rows, speedups, shares, charts, CLI."""

from __future__ import annotations

import csv
import io
import json
import math

import mlflow
import pytest
from PIL import Image
from click.testing import CliRunner
from mlflow.entities import Metric, Param, RunTag

from conftest import isolated, new_store
from pipeline import charts, names
from pipeline.cli import main
from pipeline.compare import HISTORIES, build, render
from pipeline.config import load_grid
from pipeline.report import Reporter
from pipeline.runner import Options, run_grid
from pipeline.records import histories_of, read_sweep

GRID = "experiment: cmp\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n  epochs: [2]\n"


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory, data_dir, _store_template):
    """A real 2-point cpu sweep, plus a fake 'cuda:0' twin of the batch_size=128 run logged by hand
    (this machine has no GPU), whose steady-state epoch takes a quarter of the cpu twin's time and
    whose cold first epoch takes ten times as long. One per module: the tests only read it."""
    folder = tmp_path_factory.mktemp("cmp")
    with isolated(folder):
        return _sweep_store(folder, data_dir, new_store(folder, _store_template))


def _sweep_store(folder, data_dir, tracking_uri):
    (folder / "grid.yaml").write_text(GRID)
    result = run_grid(load_grid(folder / "grid.yaml"), Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir)))
    client = mlflow.MlflowClient(tracking_uri)
    cpu = next(r for r in client.search_runs([result.experiment_id], "params.batch_size = '128'"))
    twin = client.create_run(result.experiment_id, run_name="batch_size=128 device=cuda", tags={
        "mlflow.parentRunId": result.parent_run_id, names.TAG_DEVICE: "cuda:0", names.TAG_HARDWARE: "Fake GPU"})
    params = {**cpu.data.params, "device": "cuda"}
    metrics = []
    for name in HISTORIES + ("train_loss", "train_accuracy", "test_loss"):
        for m in client.get_metric_history(cpu.info.run_id, name):
            value = m.value * (10 if m.step == 1 else 1 / 4) if name in ("epoch_duration_s", *names.TIME_BUCKETS) else m.value
            metrics.append(Metric(name, value, m.timestamp, m.step))
    metrics.append(Metric("run_duration_s", 1.0, 0, 0))
    client.log_batch(twin.info.run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()],
                     tags=[RunTag("x", "y")])
    client.set_terminated(twin.info.run_id, "FINISHED")
    return result, client, cpu


def test_rows_speedups_and_shares(sweep_store):
    result, client, cpu = sweep_store
    comparison = build(read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES))
    table = comparison.table
    assert len(table) == 3 and set(table["device"]) == {"cpu", "cuda:0"}
    gpu = table[table["device"] == "cuda:0"].iloc[0]
    ref = table[(table["device"] == "cpu") & (table["batch_size"] == 128)].iloc[0]
    lone = table[table["batch_size"] == 256].iloc[0]
    assert gpu["speedup"] == pytest.approx(4.0) and gpu["speedup_vs"] == ref["run_id"]
    assert ref["speedup"] == 1.0 and math.isnan(lone["speedup"])  # no twin on another device
    history = sorted(client.get_metric_history(cpu.info.run_id, "epoch_duration_s"), key=lambda m: m.step)
    # Speed is the steady state: epoch 2 of 2; epoch 1 is shown on its own.
    assert ref["epoch_duration_s"] == pytest.approx(history[1].value) and ref["timed"] == "epoch 2"
    assert ref["first_epoch_s"] == pytest.approx(history[0].value)
    assert gpu["first_epoch_s"] == pytest.approx(10 * history[0].value)
    assert ref["warmup_s"] > 0 and ref["peak_memory_mb"] >= 0
    # Each share is the steady epochs' time in that bucket over their duration, as stored. Whether
    # the clock's buckets fill the epoch is test_train's: in this module's loaded sweep, time spent
    # outside every bucket once made them sum to 0.41 of a 0.26 s epoch (both runs' second epoch
    # took 0.12 s more than their first; not pinned down).
    for bucket in ("data", "transfer", "compute"):
        (spent,) = [m.value for m in client.get_metric_history(cpu.info.run_id, f"{bucket}_time_s") if m.step == 2]
        assert ref[f"{bucket}_share"] == pytest.approx(spent / history[1].value)
    assert 0 < ref[["data_share", "transfer_share", "compute_share"]].sum() <= 1.01
    (line,) = comparison.speedups
    assert line.startswith("batch_size=128: cuda:0 x4.00") and "vs cpu" in line and line.endswith("timed on epoch 2")


def test_the_histories_a_sweep_keeps_are_the_ones_its_store_holds(sweep_store):
    """The sweep's comparison takes its runs' epochs from memory (histories_of), `pipeline compare`
    reads them back: the same numbers, the same order, the same gaps (energy where none was told)."""
    result, client, _ = sweep_store
    stored = {r.run_id: r.histories for r in read_sweep(client, parent_run_id=result.parent_run_id,
                                                        histories=HISTORIES).children}
    finished = [o for o in result.outcomes if o.status == "FINISHED"]
    assert len(finished) == 2
    for outcome in finished:
        assert histories_of(outcome.epochs, HISTORIES) == stored[outcome.run_id]


def test_formats_and_sort(sweep_store):
    result, client, _ = sweep_store
    sweep = read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES)
    comparison = build(sweep, sort="epoch_duration_s")
    # (not "cuda first": the fake twin is a quarter of its cpu twin, which the other cpu run can beat)
    assert list(comparison.table["epoch_duration_s"]) == sorted(comparison.table["epoch_duration_s"])
    assert list(build(sweep, sort="speedup").table["device"])[0] == "cuda:0"  # higher first
    rows = list(csv.DictReader(io.StringIO(render(comparison, "csv"))))
    assert len(rows) == 3 and {"device", "batch_size", "num_workers", "lr", "epochs", "train_loss", "test_accuracy",
                               "epoch_duration_s", "images_per_s", "run_duration_s", "data_share", "speedup"} <= set(rows[0])
    records = json.loads(render(comparison, "json"))
    assert [r["device"] for r in records] == list(comparison.table["device"])
    lines = render(comparison, "markdown").splitlines()
    assert len(lines) == 5 and lines[1].startswith("|---") and any("x4.00" in line for line in lines[2:])


def test_cli_compare_pipes_csv_and_writes_charts(sweep_store, tmp_path):
    result, client, _ = sweep_store
    uri = client.tracking_uri
    out = CliRunner().invoke(main, ["compare", "--experiment", "cmp", "--format", "csv", "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    assert len(list(csv.DictReader(io.StringIO(out.stdout)))) == 3
    out = CliRunner().invoke(main, ["compare", "--tracking-uri", uri, "--out", str(tmp_path / "report")])
    assert out.exit_code == 0 and "speedup  batch_size=128: cuda:0 x4.00" in out.output
    for name in ("epoch_duration.png", "test_accuracy.png", "time_breakdown.png"):
        data = (tmp_path / "report" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert "x4.00" in (tmp_path / "report" / "results.md").read_text()


def test_time_breakdown_legend_covers_no_bar(sweep_store, tmp_path):
    import matplotlib

    result, client, _ = sweep_store
    comparison = build(read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES))
    # Runs of equal length (a seed sweep, say) fill the plot's width: no place inside it is free of bars.
    comparison.table["epoch_duration_s"] = 1.0
    planned = {charts.TIME_BREAKDOWN_PNG: charts.plan(comparison)[charts.TIME_BREAKDOWN_PNG]}
    fig = charts.figure(planned[charts.TIME_BREAKDOWN_PNG])
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [patch.get_window_extent(renderer) for patch in ax.patches]
    assert len(bars) == 3 * len(comparison.table)  # data, transfer and compute for each run
    assert not [bar for bar in bars if legend.overlaps(bar)], legend
    # The saved image spans the figure's tight box, out to the legend's right edge.
    tight = fig.get_tightbbox(renderer)  # inches
    assert tight.x1 >= legend.x1 / fig.dpi
    (png,) = charts.draw(planned, tmp_path)
    pad = matplotlib.rcParams["savefig.pad_inches"]  # the tight box's margin on each side
    with Image.open(png) as image:
        assert image.width == pytest.approx((tight.width + 2 * pad) * charts.DPI, abs=2)


def test_a_sweep_draws_its_charts_beside_a_notebooks_plots(write_grid, data_dir, tracking_uri):
    """Charts are Agg figures of their own: a process that uses pyplot (a notebook's) keeps its
    backend and its figures."""
    import matplotlib
    import matplotlib.pyplot  # noqa: F401  (a notebook's, say)

    backend, figures = matplotlib.get_backend(), matplotlib.pyplot.get_fignums()
    result = run_grid(load_grid(write_grid(GRID)), Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir)))
    logged = {a.path for a in mlflow.MlflowClient(tracking_uri).list_artifacts(result.parent_run_id, "comparison")}
    assert {f"comparison/{name}" for name in (charts.EPOCH_DURATION_PNG, charts.TEST_ACCURACY_PNG,
                                              charts.TIME_BREAKDOWN_PNG)} <= logged
    assert matplotlib.get_backend() == backend and matplotlib.pyplot.get_fignums() == figures


def test_sweep_logs_comparison_and_network_artifacts(sweep_store):
    result, client, cpu = sweep_store
    logged = {a.path for a in client.list_artifacts(result.parent_run_id, "comparison")}
    assert {"comparison/epoch_duration.png", "comparison/test_accuracy.png", "comparison/results.csv",
            "comparison/results.md"} <= logged
    assert {a.path for a in client.list_artifacts(cpu.info.run_id, "inputs")} == {names.ARTIFACT_BATCH}
    with Image.open(client.download_artifacts(cpu.info.run_id, names.ARTIFACT_BATCH)) as batch:
        assert batch.format == "PNG" and batch.size == (8 * 30 + 2, 8 * 30 + 2)  # 64 images, 8 wide, 2 px apart
    summary = open(client.download_artifacts(cpu.info.run_id, names.ARTIFACT_SUMMARY)).read()
    assert "conv1.weight" in summary and "(6, 1, 5, 5)" in summary and "out.bias" in summary and "cpu" in summary
    assert cpu.data.tags[names.TAG_PARAM_DEVICES] == "cpu"
    for name in names.TIME_BUCKETS:
        assert [m.step for m in client.get_metric_history(cpu.info.run_id, name)] == [1, 2]


def test_compare_errors_exit_2_without_creating_a_store(tmp_path, tracking_uri):
    out = CliRunner().invoke(main, ["compare"])
    assert out.exit_code == 2 and "no tracking store" in out.output
    assert not (tmp_path / "mlflow.db").exists()
    out = CliRunner().invoke(main, ["compare", "--tracking-uri", tracking_uri])
    assert out.exit_code == 2 and "no sweep" in out.output
    out = CliRunner().invoke(main, ["compare", "--tracking-uri", tracking_uri, "--experiment", "nope"])
    assert out.exit_code == 2 and "no experiment 'nope'" in out.output


def test_system_metrics(write_grid, data_dir, tracking_uri, monkeypatch):
    """MLflow's system metrics of each run, sampled at the interval the user sets (here shorter than
    the run, which lasts about a second; the pipeline's own 2 s would give none)."""
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    grid = write_grid("grid:\n  batch_size: [16]\n  device: [cpu]\n  epochs: [2]\n")
    result = run_grid(load_grid(grid), Reporter(),
                      Options(tracking_uri=tracking_uri, data_dir=str(data_dir), system_metrics=True))
    run = mlflow.MlflowClient(tracking_uri).get_run(result.outcomes[0].run_id)
    assert any(k.startswith("system/cpu_utilization") for k in run.data.metrics), run.data.metrics.keys()
    assert __import__("os").environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] == "0.2"  # the user's, kept


def test_against_a_real_tracking_server(tracking_server, tmp_path, write_grid, data_dir):
    uri = tracking_server
    grid = write_grid("experiment: remote\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    out = CliRunner().invoke(main, ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    # One link at the end, not MLflow's "View run / View experiment" pair after every run.
    assert out.output.count(f"{uri}/#/experiments/") == 1 and "View run" not in out.output
    out = CliRunner().invoke(main, ["compare", "--experiment", "remote", "--format", "json", "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    assert sorted(r["batch_size"] for r in json.loads(out.stdout)) == [128, 256]
    assert not (tmp_path / "mlflow.db").exists()


def test_energy_is_measured_or_absent_with_the_reason(sweep_store):
    """Never a zero that means 'unknown': where no counter is readable the metric is missing and
    the comparison says why; where one is (RAPL readable), every epoch has a positive energy."""
    import torch

    from pipeline.energy import energy_source

    result, client, cpu = sweep_store
    comparison = build(read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES))
    source = energy_source(torch.device("cpu"))
    history = client.get_metric_history(cpu.info.run_id, "energy_j")
    assert cpu.data.tags["pipeline.energy"] == source
    if source.startswith("not measured"):
        assert history == [] and any(source in note for note in comparison.notes)
    else:
        assert len(history) == 2 and all(m.value > 0 for m in history)


def test_an_energy_counter_that_did_not_advance_is_unknown_not_free():
    """NVML's counter moves every 100 ms: on an H200 an epoch of 25 ms read 0 J or one whole step.
    Zeros average in (the mean over the steady epochs is right to one step); all zeros mean unknown."""
    from pipeline.records import RunRecord, SweepRecord

    def run(run_id, joules):
        return RunRecord(run_id, run_id, {"batch_size": "1000", "train_size": "60000"}, {"test_accuracy": 0.8},
                         {"pipeline.device": "cuda:0", "pipeline.energy": "NVML total energy of the whole GPU"},
                         histories={"epoch_duration_s": [0.2, 0.03, 0.03], "energy_j": joules})

    comparison = build(SweepRecord("p", "p", "1", "x", [run("brief", [15.0, 0.0, 0.0]), run("some", [15.0, 0.0, 41.0])]))
    rows = comparison.table.set_index("run_id")
    assert math.isnan(rows.loc["brief", "energy_j"]) and math.isnan(rows.loc["brief", "images_per_j"])
    assert rows.loc["some", "energy_j"] == 20.5 and rows.loc["some", "images_per_j"] == pytest.approx(60000 / 20.5)
    assert [note for note in comparison.notes if note.startswith("energy of brief:")], comparison.notes
    assert not [note for note in comparison.notes if "some" in note.split(":")[0]]


def test_repeats_are_aggregated_and_speedups_use_their_medians():
    """Points that differ only in seed: n, median and min-max; the device speedup is median/median."""
    from pipeline.records import RunRecord, SweepRecord

    def run(run_id, device, seed, seconds, accuracy):
        return RunRecord(run_id, run_id, {"batch_size": "64", "seed": str(seed)}, {"test_accuracy": accuracy},
                         {"pipeline.device": device}, histories={"epoch_duration_s": [99.0, seconds]})

    runs = [run("c0", "cpu", 0, 4.0, 0.80), run("c1", "cpu", 1, 6.0, 0.82), run("c2", "cpu", 2, 5.0, 0.84),
            run("g0", "cuda:0", 0, 1.0, 0.81), run("g1", "cuda:0", 1, 3.0, 0.83)]
    comparison = build(SweepRecord("p", "p", "1", "x", runs))
    repeats = comparison.repeats.set_index("device")
    assert repeats.loc["cpu", "n"] == 3 and repeats.loc["cuda:0", "n"] == 2
    assert repeats.loc["cpu", "epoch_duration_s"] == 5.0  # the median, not epoch 1's 99 s
    assert (repeats.loc["cpu", "epoch_duration_s_min"], repeats.loc["cpu", "epoch_duration_s_max"]) == (4.0, 6.0)
    assert repeats.loc["cpu", "test_accuracy"] == pytest.approx(0.82)
    assert repeats.loc["cuda:0", "speedup"] == pytest.approx(5.0 / 2.0)
    assert any(line.startswith("median of repeats, all settings equal: cuda:0 x2.50") for line in comparison.speedups)
    output = io.StringIO()
    from rich.console import Console

    Reporter(Console(file=output, width=200)).comparison(comparison)
    assert "Repeats" in output.getvalue() and "5.000 [4.000-6.000]" in output.getvalue()
