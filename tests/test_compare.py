"""Comparison reports on stores built by real small grids: rows, speedups, shares, charts, CLI."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from pathlib import Path

import mlflow
import numpy as np
import pytest
from click.testing import CliRunner
from mlflow.entities import Metric, Param, RunTag
from PIL import Image

from conftest import isolated, new_store
from pipeline.analysis.compare import CHART_HISTORIES, HISTORIES, CompareOptions, build
from pipeline.base import names
from pipeline.cli import main
from pipeline.measures.timing import histories_of
from pipeline.present import charts
from pipeline.present.answer import Answer
from pipeline.present.palette import colours
from pipeline.present.report import Reporter
from pipeline.present.sentences import notes, speedup_lines
from pipeline.present.tables import render
from pipeline.settings.config import load_grid
from pipeline.sweep.runner import Options, run_grid
from pipeline.tracking.records import read_sweep
from synthetic_sweeps import Run, jittered, write_sweep

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
    options = Options(tracking_uri=tracking_uri, data_dir=str(data_dir))
    result = run_grid(load_grid(folder / "grid.yaml"), Reporter(), options)
    client = mlflow.MlflowClient(tracking_uri)
    cpu = next(r for r in client.search_runs([result.experiment_id], "params.batch_size = '128'"))
    twin = client.create_run(
        result.experiment_id,
        run_name="batch_size=128 device=cuda",
        tags={"mlflow.parentRunId": result.parent_run_id, names.TAG_DEVICE: "cuda:0", names.TAG_HARDWARE: "Fake GPU"},
    )
    params = {**cpu.data.params, "device": "cuda"}
    metrics = []
    for name in HISTORIES + CHART_HISTORIES + ("train_loss", "train_accuracy", "test_loss"):
        for m in client.get_metric_history(cpu.info.run_id, name):
            value = m.value
            if name in ("epoch_duration_s", *names.TIME_BUCKETS):
                value *= 10 if m.step == 1 else 1 / 4
            metrics.append(Metric(name, value, m.timestamp, m.step))
    metrics.append(Metric("run_duration_s", 1.0, 0, 0))
    client.log_batch(
        twin.info.run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()], tags=[RunTag("x", "y")]
    )
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
    assert gpu["speedup"] == pytest.approx(4.0, rel=1e-3) and gpu["speedup_vs"] == ref["run_ids"]
    assert (gpu["n"], ref["n"]) == (1, 1) and gpu["speedup_significant"] is None  # one run each: no interval
    assert ref["speedup"] == 1.0 and math.isnan(lone["speedup"])  # no twin on another device
    history = sorted(client.get_metric_history(cpu.info.run_id, "epoch_duration_s"), key=lambda m: m.step)
    # Speed is the steady state: epoch 2 of 2; epoch 1 is shown on its own.
    # To 4 significant digits, as each run logs its summary (steady_epoch_s).
    assert ref["epoch_duration_s"] == pytest.approx(history[1].value, rel=1e-3) and ref["timed"] == "epoch 2"
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
    (line,) = speedup_lines(comparison)
    assert line.startswith("batch_size=128: cuda:0 4.00x faster (n too small (1 run))") and "vs cpu" in line
    assert line.endswith("timed on epoch 2")


def test_the_histories_a_sweep_keeps_are_the_ones_its_store_holds(sweep_store):
    """The sweep's comparison takes its runs' epochs from memory (histories_of), `pipeline compare
    --out` reads them back: the same numbers, the same order, the same gaps (energy where none was told)."""
    result, client, _ = sweep_store
    every = HISTORIES + CHART_HISTORIES
    stored = {
        r.run_id: r.histories for r in read_sweep(client, parent_run_id=result.parent_run_id, charted=every).children
    }
    finished = [o for o in result.outcomes if o.status == "FINISHED"]
    assert len(finished) == 2
    for outcome in finished:
        assert histories_of(outcome.epochs, every) == stored[outcome.run_id]


def test_formats_and_sort(sweep_store):
    result, client, _ = sweep_store
    sweep = read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES)
    comparison = build(sweep, CompareOptions(sort="epoch_duration_s"))
    # (not "cuda first": the fake twin is a quarter of its cpu twin, which the other cpu run can beat)
    assert list(comparison.table["epoch_duration_s"]) == sorted(comparison.table["epoch_duration_s"])
    assert list(build(sweep, CompareOptions(sort="speedup")).table["device"])[0] == "cuda:0"  # higher first
    rows = list(csv.DictReader(io.StringIO(render(comparison, "csv"))))
    assert len(rows) == 3
    assert {
        "device",
        "batch_size",
        "num_workers",
        "lr",
        "epochs",
        "train_loss",
        "test_accuracy",
        "epoch_duration_s",
        "images_per_s",
        "run_duration_s",
        "data_share",
        "speedup",
    } <= set(rows[0])
    records = json.loads(render(comparison, "json"))
    assert [r["device"] for r in records] == list(comparison.table["device"])
    lines = render(comparison, "markdown").splitlines()
    assert len(lines) == 5 and lines[1].startswith("|---")
    assert any("4.00x faster (n too small (1 run))" in line for line in lines[2:])


def test_cli_compare_pipes_csv_and_writes_charts(sweep_store, tmp_path):
    result, client, _ = sweep_store
    uri = client.tracking_uri
    out = CliRunner().invoke(main, ["compare", "--experiment", "cmp", "--format", "csv", "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    assert len(list(csv.DictReader(io.StringIO(out.stdout)))) == 3
    out = CliRunner().invoke(main, ["compare", "--tracking-uri", uri, "--out", str(tmp_path / "report")])
    assert out.exit_code == 0 and "speedup  batch_size=128: cuda:0 4.00x faster" in out.output
    for name in ("epoch_duration.png", "test_accuracy.png", "time_breakdown.png"):
        data = (tmp_path / "report" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert "4.00x faster (n too small (1 run))" in (tmp_path / "report" / "results.md").read_text()


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
    options = Options(tracking_uri=tracking_uri, data_dir=str(data_dir))
    result = run_grid(load_grid(write_grid(GRID)), Reporter(), options)
    logged = {a.path for a in mlflow.MlflowClient(tracking_uri).list_artifacts(result.parent_run_id, "comparison")}
    assert {
        f"comparison/{name}"
        for name in (charts.EPOCH_DURATION_PNG, charts.TEST_ACCURACY_PNG, charts.TIME_BREAKDOWN_PNG)
    } <= logged
    assert matplotlib.get_backend() == backend and matplotlib.pyplot.get_fignums() == figures


def test_sweep_logs_comparison_and_network_artifacts(sweep_store):
    result, client, cpu = sweep_store
    logged = {a.path for a in client.list_artifacts(result.parent_run_id, "comparison")}
    assert {
        "comparison/epoch_duration.png",
        "comparison/test_accuracy.png",
        "comparison/results.csv",
        "comparison/results.md",
    } <= logged
    assert {a.path for a in client.list_artifacts(cpu.info.run_id, "inputs")} == {names.ARTIFACT_BATCH}
    with Image.open(client.download_artifacts(cpu.info.run_id, names.ARTIFACT_BATCH)) as batch:
        assert batch.format == "PNG" and batch.size == (8 * 30 + 2, 8 * 30 + 2)  # 64 images, 8 wide, 2 px apart
    summary = Path(client.download_artifacts(cpu.info.run_id, names.ARTIFACT_SUMMARY)).read_text()
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
    result = run_grid(
        load_grid(grid), Reporter(), Options(tracking_uri=tracking_uri, data_dir=str(data_dir), system_metrics=True)
    )
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

    from pipeline.training.energy import energy_source

    result, client, cpu = sweep_store
    comparison = build(read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES))
    source = energy_source(torch.device("cpu"))
    history = client.get_metric_history(cpu.info.run_id, "energy_j")
    assert cpu.data.tags["pipeline.energy"] == source
    if source.startswith("not measured"):
        assert history == [] and any(source in note for note in notes(comparison))
    else:
        assert len(history) == 2 and all(m.value > 0 for m in history)


def test_an_energy_counter_that_did_not_advance_is_unknown_not_free():
    """NVML's counter moves every 100 ms: on an H200 an epoch of 25 ms read 0 J or one whole step.
    Zeros average in (the mean over the steady epochs is right to one step); all zeros mean unknown."""
    from pipeline.base.runs import RunRecord, SweepRecord

    def run(run_id, joules, batch_size):
        return RunRecord(
            run_id,
            run_id,
            {"batch_size": batch_size, "train_size": "60000"},
            {"test_accuracy": 0.8},
            {"pipeline.device": "cuda:0", "pipeline.energy": "NVML total energy of the whole GPU"},
            histories={"epoch_duration_s": [0.2, 0.03, 0.03], "energy_j": joules},
        )

    comparison = build(
        SweepRecord(
            "p", "p", "1", "x", [run("brief", [15.0, 0.0, 0.0], "1000"), run("some", [15.0, 0.0, 41.0], "2000")]
        )
    )
    rows = comparison.table.set_index("run_ids")
    assert math.isnan(rows.loc["brief", "energy_j"]) and math.isnan(rows.loc["brief", "images_per_j"])
    assert rows.loc["some", "energy_j"] == 20.5 and rows.loc["some", "images_per_j"] == pytest.approx(60000 / 20.5)
    said = notes(comparison)
    assert [note for note in said if note.startswith("energy of brief:")], said
    assert not [note for note in said if "some" in note.split(":")[0]]


def test_repeats_are_one_row_with_the_geometric_mean_and_iqr_of_their_steady_epochs():
    """Runs that differ only in `repeat` are one setting: n, run ids, and the epoch time's geometric
    mean (the estimate its speedups are ratios of) and quartiles over its runs, one value each (each
    run's median steady epoch, never epoch 1's 99 s); seeds stay rows of their own."""
    from pipeline.base.runs import RunRecord, SweepRecord

    def run(run_id, repeat, seconds, accuracy, seed="0"):
        return RunRecord(
            run_id,
            run_id,
            {"batch_size": "64", "seed": seed, names.REPEAT: str(repeat)},
            {"test_accuracy": accuracy},
            {"pipeline.device": "cpu"},
            histories={"epoch_duration_s": [99.0, *seconds]},
        )

    runs = [
        run("r1", 1, [4.0, 5.0], 0.80),
        run("r2", 2, [6.0, 7.0], 0.82),
        run("r3", 3, [5.0, 5.0], 0.84),
        run("other-seed", 1, [1.0, 1.0], 0.5, seed="1"),
    ]
    table = build(SweepRecord("p", "p", "1", "x", runs)).table.set_index("seed")
    assert table.loc[0, "n"] == 3 and table.loc[0, "run_ids"] == "r1,r2,r3" and table.loc[1, "n"] == 1
    assert table.loc[0, "epoch_duration_s"] == pytest.approx((4.5 * 6.5 * 5.0) ** (1 / 3))  # the runs' 4.5, 6.5, 5.0
    assert table.loc[0, "steady_epoch_s"] == 5.269  # as shown: 4 significant digits
    assert (table.loc[0, "epoch_duration_s_q1"], table.loc[0, "epoch_duration_s_q3"]) == (4.75, 5.75)
    assert table.loc[0, "test_accuracy"] == pytest.approx(0.82)  # the median over the runs
    assert "repeat" not in table.columns  # grouped away


# --- synthetic sweeps: controlled epoch times in a real store, no training -----------------------------


def _compare(uri, *args):
    return CliRunner().invoke(main, ["compare", "--tracking-uri", uri, *args])


def _repeats(device, seconds, count, rng, seed="0", **run):
    return [
        Run(jittered(seconds, 4, rng), device, {"seed": seed, names.REPEAT: str(r)}, **run) for r in range(1, count + 1)
    ]


def test_a_2x_difference_over_4_repeats_is_significant(tracking_uri):
    rng = np.random.default_rng(1)
    write_sweep(tracking_uri, "fast", _repeats("cpu", 1.0, 4, rng) + _repeats("cuda:0", 0.5, 4, rng))
    out = _compare(tracking_uri, "--format", "json")
    assert out.exit_code == 0, out.output
    rows = {r["device"]: r for r in json.loads(out.stdout)}
    gpu = rows["cuda:0"]
    assert gpu["n"] == 4 and gpu["speedup"] == pytest.approx(2.0, rel=0.05)
    assert 1 < gpu["speedup_low"] < gpu["speedup"] < gpu["speedup_high"] and gpu["speedup_significant"] is True
    assert rows["cpu"]["speedup"] == 1.0 and rows["cpu"]["speedup_significant"] is None
    markdown = _compare(tracking_uri, "--format", "markdown").stdout
    (line,) = [line for line in markdown.splitlines() if "cuda:0" in line]
    assert re.search(r"2\.\d\dx faster \[\d\.\d\d-\d\.\d\d\] \|", line) and "n.s." not in line, line
    table = _compare(tracking_uri).output
    assert re.search(r"speedup  all settings equal: cuda:0 2\.\d\dx faster \[[\d.-]+\] \(", table), table


def test_an_a_a_pair_of_seeds_is_not_significant(tracking_uri):
    """`--versus seed=0`: two seeds of one setting, drawn from one distribution: no difference."""
    rng = np.random.default_rng(2)
    write_sweep(tracking_uri, "aa", _repeats("cpu", 1.0, 4, rng, seed="0") + _repeats("cpu", 1.0, 4, rng, seed="1"))
    out = _compare(tracking_uri, "--versus", "seed=0", "--format", "json")
    assert out.exit_code == 0, out.output
    other = next(r for r in json.loads(out.stdout) if r["seed"] == 1)
    assert other["versus_speedup_low"] < 1 < other["versus_speedup_high"]
    assert other["versus_speedup_significant"] is False
    markdown = _compare(tracking_uri, "--versus", "seed=0", "--format", "markdown").stdout
    assert re.search(r"1\.\d\dx (faster|slower) \[[\d.-]+\] \(n\.s\.\)", markdown), markdown


def test_one_run_of_one_steady_epoch_per_side_is_too_small_for_an_interval(tracking_uri):
    write_sweep(tracking_uri, "tiny", [Run([2.0, 1.0]), Run([2.0, 0.5], "cuda:0")])
    out = _compare(tracking_uri, "--format", "json")
    gpu = next(r for r in json.loads(out.stdout) if r["device"] == "cuda:0")
    assert gpu["speedup"] == 2.0 and gpu["speedup_low"] is None and gpu["speedup_significant"] is None
    assert "2.00x faster (n too small (1 run))" in _compare(tracking_uri, "--format", "markdown").stdout


def test_slower_is_said_in_words_with_the_interval_inverted(tracking_uri):
    rng = np.random.default_rng(3)
    write_sweep(tracking_uri, "slow", _repeats("cpu", 1.0, 4, rng) + _repeats("cuda:0", 2.0, 4, rng))
    markdown = _compare(tracking_uri, "--format", "markdown").stdout
    match = re.search(r"(\d\.\d\d)x slower \[(\d\.\d\d)-(\d\.\d\d)\]", markdown)
    assert match and float(match[2]) < float(match[1]) < float(match[3]) and 1.8 < float(match[1]) < 2.2, markdown
    assert "x0." not in markdown


@pytest.mark.parametrize(
    "versus, message",
    [
        ("seed", "--versus seed: give KEY=VALUE"),
        ("speed=1", "speed is not a grid key; grid keys: device, lr, batch_size"),
        ("num_workers=0", "num_workers does not vary in this sweep (every run has num_workers=0)"),
        ("batch_size=999", "no run has batch_size=999; values in this sweep: 128, 256"),
    ],
)
def test_versus_refuses_what_the_sweep_cannot_answer(tracking_uri, versus, message):
    write_sweep(
        tracking_uri,
        "bs",
        [Run([1.0, 1.0], params={"batch_size": "128"}), Run([1.0, 0.5], params={"batch_size": "256"})],
    )
    out = _compare(tracking_uri, "--versus", versus)
    assert out.exit_code == 2 and message in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1
    ok = _compare(tracking_uri, "--versus", "batch_size=128", "--format", "json")
    assert next(r for r in json.loads(ok.stdout) if r["batch_size"] == 256)["versus_speedup"] == 2.0


def test_time_to_target_ranks_rows_and_names_untargeted_runs(tracking_uri):
    """With a target the rows that reached it in every run rank by the geometric mean of their times to
    it, the rest follow by epoch time; the device speedup on it sits beside the epoch one; runs
    trained before the target show "-" and one note."""
    target = {names.TAG_TARGET: "test_accuracy >= 0.85"}
    runs = [
        Run([2.0, 1.0], "cpu", {names.REPEAT: str(r)}, tags=target, metrics={names.TIME_TO_TARGET: t})
        for r, t in ((1, 3.0), (2, 3.2), (3, 3.4))
    ]
    runs += [
        Run([2.0, 0.5], "cuda:0", {names.REPEAT: str(r)}, tags=target, metrics={names.TIME_TO_TARGET: t})
        for r, t in ((1, 1.0), (2, 1.1), (3, 1.2))
    ]
    runs += [
        Run([2.0, 0.9], "cpu", {"batch_size": "256"}, tags=target),  # not reached
        Run([2.0, 0.8], "cpu", {"batch_size": "512"}),
    ]  # trained before the target was set
    write_sweep(tracking_uri, "target", runs, parent_tags=target)
    rows = json.loads(_compare(tracking_uri, "--format", "json").stdout)
    assert [(r["device"], r["batch_size"]) for r in rows] == [("cuda:0", 128), ("cpu", 128), ("cpu", 512), ("cpu", 256)]
    assert rows[0]["time_to_target_s"] == pytest.approx((1.0 * 1.1 * 1.2) ** (1 / 3), rel=1e-3)
    assert rows[0]["target_reached"] == 3
    # the ratio of the geometric means of the runs' times, Welch's interval on their logs
    assert rows[0]["target_speedup"] == pytest.approx(3.2 / 1.1, rel=0.01)
    assert rows[0]["target_speedup_significant"] is True
    assert rows[3]["target_reached"] == 0 and rows[3]["target_runs"] == 1
    out = _compare(tracking_uri, "--format", "markdown").stdout
    cells = [line.split(" | ") for line in out.splitlines() if "512" in line]
    assert "- " in " | ".join(cells[0]) or any(cell.strip() == "-" for cell in cells[0])
    table = _compare(tracking_uri).output
    (note,) = [line for line in table.splitlines() if "trained without the target" in line]
    assert "point7 cpu of 8 runs" in note and "--rerun" in note


def test_contended_runs_are_counted_and_left_out_of_speedups(tracking_uri):
    rng = np.random.default_rng(4)
    busy = {names.TAG_CONTENDED: "other processes took 60% of 2 cores"}
    runs = _repeats("cpu", 1.0, 3, rng) + _repeats("cuda:0", 0.5, 1, rng)
    runs.append(Run([1.0, 5.0, 5.0, 5.0], "cuda:0", {names.REPEAT: "2"}, tags=busy))  # slowed down by others
    write_sweep(tracking_uri, "busy", runs)
    rows = {r["device"]: r for r in json.loads(_compare(tracking_uri, "--format", "json").stdout)}
    assert rows["cuda:0"]["contended"] == 1 and rows["cuda:0"]["n"] == 2
    assert rows["cuda:0"]["speedup"] == pytest.approx(2.0, rel=0.1)
    included = {
        r["device"]: r for r in json.loads(_compare(tracking_uri, "--format", "json", "--include-contended").stdout)
    }
    assert included["cuda:0"]["speedup"] < 1.5
    table = _compare(tracking_uri).output
    assert "1 of 5 runs contended (other processes took the cores), left out of every speed figure" in table
    assert table.startswith("Best: cuda:0 (0.5") and "1 of 2 runs timed" in table.splitlines()[0]
    assert "60% of 2 cores" in table


def test_cli_run_then_compare_on_real_runs(tmp_path, data_dir, tracking_uri):
    """The real path once: `pipeline run` trains two seeds, `pipeline compare --versus seed=0` reads them."""
    grid = tmp_path / "seeds.yaml"
    grid.write_text("experiment: seeds\ngrid:\n  batch_size: [256]\n  seed: [0, 1]\n  device: [cpu]\n  epochs: [2]\n")
    out = CliRunner().invoke(main, ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    out = _compare(tracking_uri, "--versus", "seed=0", "--format", "json")
    assert out.exit_code == 0, out.output
    rows = {r["seed"]: r for r in json.loads(out.stdout)}
    assert rows[0]["versus_speedup"] == 1.0 and rows[1]["versus_speedup"] > 0 and rows[1]["n"] == 1
    assert rows[1]["versus_speedup_vs"] == rows[0]["run_ids"]


# --- the answer at a glance: one set of numbers, the verdict, the decision table, the trade-off chart ---


def _eight(tracking_uri, repeats=2, target=False):
    """An 8-setting sweep (device x batch size x precision), `repeats` runs each, with intervals."""
    rng = np.random.default_rng(8)
    tags = {names.TAG_TARGET: "test_accuracy >= 0.75"} if target else {}
    runs = []
    for device, base in (("cpu", 1.0), ("cuda:0", 0.4)):
        for batch_size in ("128", "256"):
            for precision, factor in (("fp32", 1.0), ("bf16", 0.6)):
                seconds = base * factor * (0.8 if batch_size == "256" else 1.0)
                metrics = {names.TIME_TO_TARGET: 3 * seconds} if target else {}
                params = {"batch_size": batch_size, "precision": precision}
                runs += [
                    Run(
                        jittered(seconds, 4, rng),
                        device,
                        {**params, names.REPEAT: str(r)},
                        tags=dict(tags),
                        metrics=metrics,
                    )
                    for r in range(1, repeats + 1)
                ]
    return write_sweep(tracking_uri, "eight", runs, parent_tags=tags)


EIGHT_TARGET = "test_accuracy >= 0.75"


@pytest.fixture(scope="module")
def eight(tmp_path_factory, _store_template):
    """The 8-setting sweep with a target (_eight), in a store of its own, and its comparison. One per
    module: the tests only read it."""
    folder = tmp_path_factory.mktemp("eight")
    with isolated(folder):
        uri = new_store(folder, _store_template)
        _eight(uri, target=True)
        comparison = build(
            read_sweep(mlflow.MlflowClient(uri), histories=HISTORIES), CompareOptions(target=EIGHT_TARGET)
        )
    return uri, comparison


def _table_words(text: str) -> tuple[set[str], set[str]]:
    """The words of the tables in `text`: in their header rows, and in any of their rows (not the
    verdict's or the speedup lines around them, which could hold a number a table split)."""

    def words(lines):
        return {word for line in lines for word in re.sub("[│┃]", " ", line).split()}

    lines = text.splitlines()
    headers = [line for line in lines if line.startswith("┃")]
    return words(headers), words(line for line in lines if line.startswith(("┃", "│")))


def _check_fits(text: str, frame, width: int) -> None:
    """Nothing in `text` is wider than `width` or cut (an ellipsis), every word of every cell of
    `frame` is whole on one line of a table (a number such as 0.370-0.379, 2,495 or 2.41x is never
    split), and so is every word of every header: none is broken, and so none is stacked a letter a line."""
    assert "…" not in text and max(map(len, text.splitlines())) <= width, text
    in_headers, in_tables = _table_words(text)
    cut = [word for column in frame for cell in frame[column] for word in str(cell).split() if word not in in_tables]
    assert not cut, (cut, text)
    broken = [word for column in frame for word in column.replace("_", " ").split() if word not in in_headers]
    assert not broken, (broken, text)


@pytest.mark.parametrize("width", [80, 120, 160])
@pytest.mark.parametrize("wide", [False, True])
def test_the_terminal_tables_fit_with_every_number_whole(eight, width, wide):
    """`pipeline compare` (its decision columns; --wide: every column) at 80, 120 and 160 columns on a
    realistic sweep (3 varying settings, 2 runs a setting so that every figure has an interval, a
    target, 3 speedups): within the width, nothing cut, no number split, no header stacked. Where one
    table cannot fit, the columns fold into several, each repeating the settings that name a row;
    the figures come first, and nothing is dropped."""
    from rich.console import Console

    from pipeline.present.tables import display_frame
    from pipeline.present.verdict import Verdict, comparison_tables

    _, comparison = eight
    console = Console(width=width, file=io.StringIO(), highlight=False)
    Verdict(console).comparison(Answer(comparison), wide)
    text = console.file.getvalue()
    frame = display_frame(comparison, compact=not wide, stacked=True)
    _check_fits(text, frame, width)
    tables = comparison_tables(comparison, wide, width)
    headers = [[column.header for column in table.columns] for table in tables]
    settings = {"device", "batch size", "precision"}
    assert all(settings <= set(shown) for shown in headers), headers  # each table names its rows
    others = sorted(header for shown in headers for header in shown if header not in settings)
    # every other column in one table: none dropped, none twice
    assert others == sorted({column.replace("_", " ") for column in frame.columns} - settings)
    assert "epochs 2-4" in " ".join(text.split("┏")[0].split())  # the title says which epochs were timed
    if wide:
        return
    assert list(frame.columns) == [
        "device",
        "batch_size",
        "precision",
        "n",
        "epoch_s",
        "to target s",
        "speedup",
        "precision speedup",
        "target speedup",
        "test acc",
        "img/s",
    ]
    assert {"n", "epoch s", "to target s", "test acc", "img/s"} <= set(headers[0]), headers
    assert len(tables) == (2 if width == 80 else 1) and "train" not in text


@pytest.mark.parametrize("wide", [False, True])
def test_compare_fits_an_80_column_terminal(eight, wide):
    """The real command at COLUMNS=80: the same guarantees as above, as a user's terminal shows it, up
    to the UI's link (never wrapped, so that it can be pasted)."""
    from pipeline.present.tables import display_frame

    uri, comparison = eight
    args = ["compare", "--tracking-uri", uri, *(["--wide"] if wide else [])]
    out = CliRunner(env={"COLUMNS": "80"}).invoke(main, args)
    assert out.exit_code == 0, out.output
    tables, link = out.output.split("In the MLflow UI:")
    assert link.count("\n") == 1
    _check_fits(tables, display_frame(comparison, compact=not wide, stacked=True), 80)


def test_the_verdict_comes_first_in_plain_words(tracking_uri):
    rng = np.random.default_rng(5)
    # the cuda runs logged their summary's accuracy (0.9), the cpu runs only their history (0.78)
    runs = _repeats("cpu", 1.0, 3, rng) + _repeats("cuda:0", 2.5, 3, rng, metrics={names.FINAL_ACCURACY: 0.9})
    write_sweep(tracking_uri, "verdict", runs)
    out = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["compare", "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    # The best: the fastest setting within the quality margin of the most accurate; here only cuda:0 is.
    assert re.fullmatch(
        r"Best: cuda:0 \(2\.\d{3} s/epoch, test acc 0\.9000, 3 runs; model from run [0-9a-f]{8}\): "
        r"the most accurate \(every faster setting is less accurate by more than the margin\)",
        lines[0],
    ), lines
    # The first on speed is another, less accurate setting: its speedup over the best, with the test.
    assert re.fullmatch(
        r"First on speed: cpu \(\d\.\d{3} s/epoch, test acc 0\.7800\): over the best, 2\.\d\dx faster "
        r"\[\d\.\d\d-\d\.\d\d\] \(significant\); but less accurate than the most accurate by more than 0\.005",
        lines[1],
    ), lines
    verdict = r"cuda:0 vs cpu, epoch time: 2\.\d\dx slower \[\d\.\d\d-\d\.\d\d\] \(significant\)"
    assert re.fullmatch(verdict, lines[2]), lines[2]
    assert "x0." not in out.output


def test_a_setting_of_one_run_shows_its_runs_figures():
    """A run that logged its summary shows it as logged; one made before (no summary metrics) shows
    what timing.summary makes of its history: the same rounding either way, in every column."""
    from pipeline.base.runs import RunRecord, SweepRecord
    from pipeline.measures.timing import summary

    # 128 images an epoch: each epoch's rate is 128 over its time, and so is the summary's (the images
    # of an epoch over the median epoch time, not the median of the rates, 1035.5 here).
    epochs = [2.0, 0.12345, 0.12361, 0.5]
    history = {"epoch_duration_s": epochs, "images_per_s": [128 / seconds for seconds in epochs]}
    # As logged (the run's own figures, from its in-memory epochs), told apart from the history's.
    logged = {
        "test_accuracy": 0.812345,
        names.STEADY_EPOCH: 0.125,
        names.STEADY_IMAGES: 1024.0,
        names.FINAL_ACCURACY: 0.8124,
    }
    new = RunRecord("new", "new", {"batch_size": "64"}, logged, {"pipeline.device": "cpu"}, histories=history)
    old = RunRecord(
        "old", "old", {"batch_size": "128"}, {"test_accuracy": 0.812345}, {"pipeline.device": "cpu"}, histories=history
    )
    table = build(SweepRecord("p", "p", "1", "x", [new, old])).table.set_index("run_ids")
    expected = summary(history["epoch_duration_s"], history["images_per_s"], 0.812345)
    assert expected == {names.STEADY_EPOCH: 0.1236, names.STEADY_IMAGES: 1036.0, names.FINAL_ACCURACY: 0.8123}
    assert table.loc["old", list(expected)].to_dict() == expected
    assert table.loc["new", list(expected)].to_dict() == {k: logged[k] for k in expected}


def test_speed_against_accuracy_comes_first_with_its_best_trade_offs(sweep_store, tmp_path):
    result, client, _ = sweep_store
    comparison = build(
        read_sweep(client, parent_run_id=result.parent_run_id, histories=HISTORIES, charted=CHART_HISTORIES)
    )  # as `compare --out` reads it
    planned = charts.plan(comparison)
    assert list(planned)[0] == charts.TRADEOFF_PNG == sorted(list(planned) + ["results.csv", "results.md"])[0]
    chart = planned[charts.TRADEOFF_PNG]
    labels = [point["label"] for point in chart["points"]]
    assert sorted(labels) == sorted(comparison.label(row) for _, row in comparison.table.iterrows())
    assert len({point["colour"] for point in chart["points"]}) == len(labels)  # a colour per setting
    settings = planned[charts.TEST_ACCURACY_PNG]["settings"]
    assert len({setting["colour"] for setting in settings}) == len(settings) == len(labels)
    assert planned[charts.EPOCH_DURATION_PNG]["legend"] == "setting"
    # faster and more accurate: (1, .8) and (2, .9) are the front; (3, .85) and (2.5, .9) are not
    assert charts.pareto([(3.0, 0.85), (1.0, 0.8), (2.0, 0.9), (2.5, 0.9)]) == [1, 2]
    (png,) = charts.draw({charts.TRADEOFF_PNG: chart}, tmp_path)
    assert png.read_bytes().startswith(b"\x89PNG")


# --- charts that hide nothing: every setting on every chart, in its one colour, on axes that can be ---


def _hide_nothing(tracking_uri):
    """Five settings of 2 runs, timed against a target: three reach it (the faster to it, the less
    accurate: a front of three), cpu bs256 misses it in both runs, every run of cpu bs512 is contended."""
    rng = np.random.default_rng(34)
    target = {names.TAG_TARGET: "test_accuracy >= 0.85"}
    busy = {names.TAG_CONTENDED: "other processes took 60% of 2 cores"}
    settings = [
        ("cuda:0", "128", 0.4, 1.2, 0.88),
        ("cuda:0", "256", 0.32, 1.0, 0.86),
        ("cpu", "128", 1.0, 3.0, 0.89),
        ("cpu", "256", 0.8, None, 0.80),
        ("cpu", "512", 0.7, None, 0.84),
    ]
    runs = []
    for device, batch_size, seconds, to_target, accuracy in settings:
        for r in (1, 2):
            epochs = jittered(seconds, 4, rng)
            buckets = {
                "data_time_s": [0.1 * e for e in epochs],
                "transfer_time_s": [0.0] * 4,
                "compute_time_s": [0.9 * e for e in epochs],
            }
            metrics = {names.FINAL_ACCURACY: accuracy, **({names.TIME_TO_TARGET: to_target} if to_target else {})}
            runs.append(
                Run(
                    epochs,
                    device,
                    {"batch_size": batch_size, names.REPEAT: str(r)},
                    tags={**target, **(busy if batch_size == "512" else {})},
                    metrics=metrics,
                    histories=buckets,
                )
            )
    parent = write_sweep(tracking_uri, "hide-nothing", runs, parent_tags=target)
    client = mlflow.MlflowClient(tracking_uri)
    return build(read_sweep(client, parent_run_id=parent, histories=HISTORIES, charted=CHART_HISTORIES))


def _dashed(ax) -> list:
    """The axes' dashed lines: the trade-off chart's join of its best trade-offs (error bar caps are lines too)."""
    return [line for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_every_setting_is_on_every_chart_in_its_one_colour(tracking_uri):
    """Each chart draws each setting, or names it under its x axis with why; in the colour the UI
    gives it; legends list settings, not runs. With a target, the setting that missed it is drawn
    hollow at its training time, and the three best trade-offs are joined."""
    from matplotlib.colors import to_hex

    comparison = _hide_nothing(tracking_uri)
    labels = [comparison.label(row) for _, row in comparison.table.iterrows()]
    colour = dict(zip(labels, colours(comparison)))
    assert sorted(colour) == ["cpu bs128", "cpu bs256", "cpu bs512", "cuda:0 bs128", "cuda:0 bs256"]
    planned = charts.plan(comparison)
    tradeoff, epochs, accuracy, breakdown = (
        planned[name]
        for name in (
            charts.TRADEOFF_PNG,
            charts.EPOCH_DURATION_PNG,
            charts.TEST_ACCURACY_PNG,
            charts.TIME_BREAKDOWN_PNG,
        )
    )
    drawn = {
        "tradeoff": {point["label"].split(" (")[0]: point["colour"] for point in tradeoff["points"]},
        "epochs": {bar["label"]: bar["colour"] for bar in epochs["bars"]},
        "accuracy": {setting["label"]: setting["colour"] for setting in accuracy["settings"]},
        "breakdown": {label.split(" (")[0]: c for label, c in zip(breakdown["labels"], breakdown["colours"])},
    }
    contended = "cpu bs512 (every run contended)"
    for name, chart in zip(drawn, (tradeoff, epochs, accuracy, breakdown)):
        timed = name != "accuracy"  # what was learnt counts every run, contended or not
        assert drawn[name] == {label: c for label, c in colour.items() if not (timed and label == "cpu bs512")}, name
        assert chart["left_out"] == ([contended] if timed else []), name

    # Trade-off: at the time to the target where it counts, at the training time where it was missed.
    row = comparison.table.iloc[labels.index("cpu bs256")]
    assert {point["label"]: (point["x"], point["y"], point["missed"]) for point in tradeoff["points"]} == {
        "cuda:0 bs256": (1.0, 0.86, False),
        "cuda:0 bs128": (1.2, 0.88, False),
        "cpu bs128": (3.0, 0.89, False),
        "cpu bs256 (reached in 0/2 runs)": (round(row["run_duration_s"], 3), 0.8, True),
    }
    assert row["run_duration_s"] > 3.0  # the whole of training: slower than any time to the target
    assert {(point["low"], point["high"]) for point in tradeoff["points"]} == {(None, None)}  # no epoch whiskers
    assert [tradeoff["points"][i]["label"] for i in tradeoff["front"]] == ["cuda:0 bs256", "cuda:0 bs128", "cpu bs128"]
    ax = charts.figure(tradeoff).axes[0]
    low, high = ax.get_ylim()
    assert 0.0 <= low < 0.80 and 0.89 < high <= 1.0 and ax.get_xlim()[0] >= 0.0
    assert "settings that missed it in any run: total training time" in ax.get_xlabel()
    assert ax.get_xlabel().endswith(f"not shown: {contended}")
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "missed the target: drawn at total training time" in legend and tradeoff["front_label"] in legend
    assert len(_dashed(ax)) == 1 and "joined" in tradeoff["front_label"]

    # Test accuracy: a line per run, an entry per setting, the runs of a setting in its colour.
    ax = charts.figure(accuracy).axes[0]
    assert [text.get_text() for text in ax.get_legend().get_texts()] == list(drawn["accuracy"])
    assert [to_hex(line.get_color()) for line in ax.get_lines()] == [
        colour[label] for label in drawn["accuracy"] for _ in range(2)
    ]
    assert ax.get_ylim()[0] >= 0.0 and ax.get_ylim()[1] <= 1.0

    # Epoch duration: a bar per setting in its colour, named in the legend, whiskers said in words.
    ax = charts.figure(epochs).axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert dict(zip(legend, (to_hex(bar.get_facecolor()) for bar in ax.patches))) == drawn["epochs"]
    assert "whiskers: first to third quartile" in ax.get_ylabel() and contended in ax.get_xlabel()
    quartiles = ("epoch_duration_s_q1", "epoch_duration_s", "epoch_duration_s_q3")
    assert [(bar["low"], bar["value"], bar["high"]) for bar in epochs["bars"]] == [
        tuple(round(comparison.table.iloc[labels.index(bar["label"])][q], 3) for q in quartiles)
        for bar in epochs["bars"]
    ]

    # Time breakdown: bars in the shares' colours, each setting's name in its own.
    ax = charts.figure(breakdown).axes[0]
    ticks = {text.get_text().split(" (")[0]: to_hex(text.get_color()) for text in ax.get_yticklabels()}
    assert ticks == drawn["breakdown"]
    assert contended in ax.get_xlabel() and ax.get_xlim()[0] == 0.0


def test_the_trade_off_axes_stay_within_what_can_be_and_one_best_trade_off_is_ringed_not_joined(tracking_uri):
    """No target: epoch time, whiskers at its quartiles. Accuracies near 1 and an epoch time near 0,
    where matplotlib's margins drew an accuracy above 1 and a negative time; one best trade-off
    (cuda is both faster and more accurate), ringed, and no line drawn or promised. Every number
    shown is rounded: 3 decimals for seconds, 4 for accuracy."""
    rng = np.random.default_rng(35)
    runs = [
        Run(
            jittered(seconds, 4, rng, spread=0.1),
            device,
            {names.REPEAT: str(r)},
            metrics={names.FINAL_ACCURACY: accuracy + 0.001 * r},
        )
        for device, seconds, accuracy in (("cuda:0", 0.05, 0.995), ("cpu", 2.0, 0.97))
        for r in (1, 2, 3)
    ]
    write_sweep(tracking_uri, "near-edges", runs)
    client = mlflow.MlflowClient(tracking_uri)
    comparison = build(read_sweep(client, experiment="near-edges", histories=HISTORIES, charted=CHART_HISTORIES))
    chart = charts.plan(comparison)[charts.TRADEOFF_PNG]
    assert [point["label"] for point in chart["points"]] == ["cuda:0", "cpu"]
    assert chart["front"] == [0] and "joined" not in chart["front_label"] + chart["title"]
    for point in chart["points"]:
        assert point["low"] < point["high"] and point["low"] <= point["x"] <= point["high"]
        seconds = [point["x"], point["low"], point["high"]]
        assert [round(v, 3) for v in seconds] == seconds
    ax = charts.figure(chart).axes[0]
    low, high = ax.get_ylim()
    assert 0.0 <= low < 0.971 and 0.998 < high <= 1.0
    low, high = ax.get_xlim()
    assert 0.0 <= low < 0.05 and high > 2.0
    assert not _dashed(ax) and "whiskers" in ax.get_xlabel()
    assert chart["front_label"] in [text.get_text() for text in ax.get_legend().get_texts()]
    numbers = [text.get_text().splitlines()[1] for text in ax.texts]
    assert len(numbers) == 2 and all(re.fullmatch(r"\d+\.\d{3} s, \d\.\d{4}", n) for n in numbers), numbers


def test_the_docs_table_sample_is_what_compare_prints(tracking_uri):
    """docs/comparing.md's terminal sample: `pipeline compare` at 120 columns on these synthetic
    timings (4 repeats a setting, one run contended), verbatim up to the UI link (a local path)."""
    from pathlib import Path

    rng = np.random.default_rng(7)
    busy = {names.TAG_CONTENDED: "other processes took 41% of 2 cores"}
    runs = []
    for device, base in (("cpu", 1.0), ("cuda:0", 0.5)):
        for batch_size, factor in (("128", 1.0), ("256", 0.8)):
            for r in range(1, 5):
                contended = device == "cuda:0" and batch_size == "256" and r == 4
                accuracy = 0.784 if batch_size == "128" else 0.78
                runs.append(
                    Run(
                        jittered(base * factor, 4, rng),
                        device,
                        {"batch_size": batch_size, names.REPEAT: str(r)},
                        tags=busy if contended else {},
                        metrics={names.FINAL_ACCURACY: accuracy},
                    )
                )
    write_sweep(tracking_uri, "smoke", runs)
    out = CliRunner(env={"COLUMNS": "120"}).invoke(main, ["compare", "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    # Run ids are random: the page shows one made up.
    printed = re.sub(r"model from run [0-9a-f]{8}", "model from run 1a2b3c4d", out.output.split("In the MLflow UI:")[0])
    path = Path(__file__).resolve().parents[1] / "docs" / "comparing.md"
    page = path.read_text(encoding="utf-8")
    if os.environ.get("PIPELINE_UPDATE_DOCS") == "1":  # as test_docs' samples: rewritten from this run
        page = re.sub(r"```text\nBest: cuda:0.*?```", lambda _: f"```text\n{printed}```", page, count=1, flags=re.S)
        path.write_text(page, encoding="utf-8")
    assert f"```text\n{printed}```" in page, printed


def test_a_setting_that_rarely_reaches_the_target_ranks_below_one_that_always_does(tracking_uri):
    """1 of 4 runs to the target in 8 s against 4 of 4 in 10 s: the reliable one is first and headlines,
    first as the only one to reach it every time (not on a speedup from the one run that made it); the
    other shows "reached in 1 of 4", ranks by epoch time, and is named as such."""
    target = {names.TAG_TARGET: "test_accuracy >= 0.85"}
    rng = np.random.default_rng(21)
    runs = [
        Run(
            jittered(1.0, 4, rng),
            "cpu",
            {"batch_size": "256", names.REPEAT: str(r)},
            tags=target,
            metrics={names.TIME_TO_TARGET: 8.0} if r == 1 else {},
        )
        for r in range(1, 5)
    ]
    runs += [
        Run(
            jittered(1.2, 4, rng),
            "cpu",
            {"batch_size": "128", names.REPEAT: str(r)},
            tags=target,
            metrics={names.TIME_TO_TARGET: 10.0 + 0.1 * r},
        )
        for r in range(1, 5)
    ]
    write_sweep(tracking_uri, "rare", runs, parent_tags=target)
    rows = json.loads(_compare(tracking_uri, "--format", "json").stdout)
    assert [(r["batch_size"], r["target_reached"]) for r in rows] == [(128, 4), (256, 1)]
    table = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["compare", "--tracking-uri", tracking_uri]).output
    assert "First to test_accuracy >= 0.85: cpu bs128 in 10.25 s (4/4 runs)" in table
    words = " ".join(table.split())
    said = "Reached test_accuracy >= 0.85 in only some of their runs (ranked by epoch time instead): cpu bs256 (1 of 4)"
    assert said in words
    assert "reached in" in table and "1 of 4" in table  # the time to target cell, on two lines
    best = next(line for line in table.splitlines() if line.startswith("Best: "))
    assert best.startswith("Best: cpu bs128 (10.25 s to target"), best
    assert "first, as the only one to reach test_accuracy >= 0.85 in every run" in words
    assert rows[1]["target_speedup"] is None  # no speedup from its one run that made it


def test_when_every_run_is_contended_the_verdict_is_withheld_and_says_why(tracking_uri, tmp_path):
    """16 of 16 runs contended: no speed claim, no best, and the two lines the docs show."""
    from pathlib import Path

    rng = np.random.default_rng(22)
    busy = {names.TAG_CONTENDED: "other processes took 43% of 2 cores"}
    runs = [
        Run(
            jittered(seconds, 4, rng),
            device,
            {"batch_size": bs, names.REPEAT: str(r)},
            tags=busy,
            metrics={names.OTHERS_CPU_SHARE: 0.43},
        )
        for device, seconds in (("cpu", 1.0), ("cuda:0", 0.5))
        for bs in ("128", "256")
        for r in range(1, 5)
    ]
    write_sweep(tracking_uri, "busy16", runs)
    out = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["compare", "--tracking-uri", tracking_uri])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[:2] == [
        "Speed withheld: 16 of 16 runs contended (others took 43% of the cores)",
        "Rerun on a quiet machine, or pass --include-contended to count them",
    ], lines[:3]
    assert not [line for line in lines if line.startswith(("Best: ", "Fastest: "))]
    page = (Path(__file__).resolve().parents[1] / "docs" / "comparing.md").read_text(encoding="utf-8")
    assert "\n".join(lines[:2]) in page
    counted = (
        CliRunner(env={"COLUMNS": "200"})
        .invoke(main, ["compare", "--tracking-uri", tracking_uri, "--include-contended"])
        .output
    )
    assert counted.startswith("Best: cuda:0") and "Speed withheld" not in counted
    # The speed charts have nothing to draw: only test accuracy is, and the view is still published.
    report = tmp_path / "report"
    drawn = CliRunner().invoke(main, ["compare", "--tracking-uri", tracking_uri, "--out", str(report), "--publish"])
    assert drawn.exit_code == 0 and "viewStateShareKey=" in drawn.output, drawn.output
    assert sorted(p.name for p in report.glob("*.png")) == ["test_accuracy.png"]
    register = CliRunner().invoke(
        main, ["register", "--experiment", "busy16", "--by", "speed", "--name", "m", "--tracking-uri", tracking_uri]
    )
    assert register.exit_code == 2 and "every run is contended" in register.output, register.output


@pytest.mark.parametrize("margin, worse", [(None, True), ("0.05", False)])
def test_a_faster_but_less_accurate_setting_is_no_win(tracking_uri, margin, worse):
    """cuda:0 is 2x faster but 0.02 less accurate, run after run: beyond the default margin (0.005)
    the speedup reads "but less accurate by 0.0200 [...]" and is no win; within --quality-margin 0.05
    it is a win."""
    rng = np.random.default_rng(23)
    runs = [
        Run(jittered(1.0, 4, rng), "cpu", {names.REPEAT: str(r)}, metrics={names.FINAL_ACCURACY: 0.80 + 0.001 * r})
        for r in range(1, 4)
    ]
    runs += [
        Run(jittered(0.5, 4, rng), "cuda:0", {names.REPEAT: str(r)}, metrics={names.FINAL_ACCURACY: 0.78 + 0.001 * r})
        for r in range(1, 4)
    ]
    write_sweep(tracking_uri, "quality", runs)
    args = ["--quality-margin", margin] if margin else []
    gpu = next(
        r for r in json.loads(_compare(tracking_uri, "--format", "json", *args).stdout) if r["device"] == "cuda:0"
    )
    assert gpu["speedup_significant"] is True and gpu["speedup_accuracy_change"] == pytest.approx(-0.02)
    assert gpu["speedup_win"] is (not worse)
    markdown = _compare(tracking_uri, "--format", "markdown", *args).stdout
    said = re.search(r"\d\.\d\dx faster \[[\d.]+-[\d.]+\], but less accurate by 0\.0200 \[[\d.]+-[\d.]+\]", markdown)
    assert bool(said) is worse, markdown
