"""FLOPs and bytes counted, and utilisation on every run: a real sweep through the real CLI on
generated IDX files logs each run's FLOPs per epoch (checked against torch's FlopCounterMode counted
here, batch by batch, as the loader batches), its bytes per epoch (the eager count, checked by hand on
small graphs), its achieved FLOP/s and its MFU, and `pipeline compare --format json`, the UI's view,
the HTML report and the comparison folder (its roofline chart) show them."""

from __future__ import annotations

import json
import re

import mlflow
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

from conftest import invoke, isolated, new_store
from pipeline.analysis.compare import build
from pipeline.analysis.figures import percent
from pipeline.base import names
from pipeline.model import Network
from pipeline.present import charts, view
from pipeline.present.answer import Answer
from pipeline.present.comparison_folder import write_report
from pipeline.present.tables import display_frame, markdown, utilisation_frame
from pipeline.tracking.records import read_sweep
from pipeline.training import data, flops

# 300 training images: batch size 64 gives 4 full batches and one of 44, 128 gives 2 and one of 44.
GRID = """experiment: mfu
data:
  train_size: 300
  test_size: 100
grid:
  batch_size: [64, 128]
  device: [cpu]
  epochs: [2]
"""


def counted_step(batch: int) -> int:
    """FLOPs of one training step as FlopCounterMode counts them on real CPU tensors (not the meta
    device flops.py counts on): forward, loss, backward."""
    model = Network()
    images, labels = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(images), labels).backward()
    return counter.get_total_flops()


@pytest.fixture(scope="module")
def swept(tmp_path_factory, data_dir, _store_template):
    """One real sweep of two batch sizes, published, with the report and the comparison folder written:
    (store, compare's json rows, the report's text, the folder)."""
    folder = tmp_path_factory.mktemp("mfu")
    with isolated(folder):
        measured = invoke("devices", "--peak")  # what a run's mfu divides by: runs never measure it
        assert measured.exit_code == 0, measured.output
        uri = new_store(folder, _store_template)
        (folder / "grid.yaml").write_text(GRID)
        out = invoke("run", "grid.yaml", "--data-dir", str(data_dir), "--tracking-uri", uri)
        assert out.exit_code == 0, out.output
        report = folder / "report.html"
        compared = invoke(
            "compare", "--tracking-uri", uri, "--format", "json", "--html", str(report), "--out", str(folder / "out")
        )
        assert compared.exit_code == 0, compared.output
        yield uri, json.loads(compared.stdout), report.read_text(), folder / "out"


def test_a_runs_flops_per_epoch_are_torchs_count_batch_by_batch(swept, data_dir):
    uri, *_ = swept
    runs = [
        r
        for r in mlflow.MlflowClient(uri).search_runs(
            [mlflow.MlflowClient(uri).get_experiment_by_name("mfu").experiment_id]
        )
        if "mlflow.parentRunId" in r.data.tags
    ]
    assert len(runs) == 2
    for run in runs:
        batch_size = int(run.data.params["batch_size"])
        train = int(run.data.params["train_size"])
        # The loader's own batches, as the run trained on them: the last one smaller.
        split = data.load(str(data_dir), train_size=train, test_size=100).train
        sizes = [len(labels) for _, labels in data.batches(split, batch_size)]
        assert sizes[-1] == 300 % batch_size == 44
        expected = sum(counted_step(size) for size in sizes)
        logged = run.data.metrics["train_flops_per_epoch"]
        assert abs(logged - expected) <= 0.01 * expected, (logged, expected)
        assert logged == flops.epoch_flops(train, batch_size)


def test_every_run_has_an_mfu_in_0_1_and_its_achieved_flops(swept):
    uri, rows, *_ = swept
    client = mlflow.MlflowClient(uri)
    runs = [
        r
        for r in client.search_runs([client.get_experiment_by_name("mfu").experiment_id])
        if "mlflow.parentRunId" in r.data.tags
    ]
    for run in runs:
        metrics = run.data.metrics
        assert 0 < metrics["mfu"] <= 1, run.data.tags.get("pipeline.peak")
        steady = metrics["steady_epoch_s"]  # 4 significant digits; achieved_tflops divides by the unrounded median
        assert metrics["achieved_tflops"] == pytest.approx(metrics["train_flops_per_epoch"] / steady / 1e12, rel=1e-3)
        assert metrics["mfu"] == pytest.approx(metrics["achieved_tflops"] / metrics["peak_tflops"])
        assert run.data.tags["pipeline.peak"].startswith("fp32 matmul peak ")
    # compare --format json: one row per setting, each with its run's figures
    assert len(rows) == 2
    by_run = {r.info.run_id: r.data.metrics for r in runs}
    for row in rows:
        metrics = by_run[row["run_ids"]]
        for name in ("train_flops_per_epoch", "achieved_tflops", "peak_tflops", "mfu"):
            assert row[name] == pytest.approx(metrics[name]), name
        assert 0 < row["mfu"] <= 1


def test_the_view_and_the_report_show_the_mfu(swept):
    uri, rows, report, _ = swept
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("mfu")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`pipeline.role` = 'sweep'")
    # The view: a column of each run's setting's MFU, and the parent's table has it in percent.
    state = view.read_envelope(experiment.tags[f"mlflow.sharedViewState.sweep-{parent.info.run_id}"])
    assert "metrics.`setting_mfu`" in state["selectedColumns"]
    for run in client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"):
        row = next(r for r in rows if r["run_ids"] == run.info.run_id)
        assert run.data.metrics["setting_mfu"] == round(row["mfu"], 4)  # as the table rounds its percent
    note = parent.data.tags[view.NOTE_TAG]
    assert "MFU %" in note
    for row in rows:
        assert f"| {percent(row['mfu'])} |" in note
    # The report: its utilisation table, one row per setting, and the numbers in its JSON.
    table = re.search(r'<table id="utilisation">(.*?)</table>', report, re.S).group(1)
    assert table.count("<tr>") == 1 + len(rows)  # the head and one row a setting
    for row in rows:
        assert f'<td class="number">{percent(row["mfu"])}</td>' in table
    block = re.search(r'<script type="application/json" id="comparison">\n(.*?)\n</script>', report, re.S).group(1)
    assert sorted(r["mfu"] for r in json.loads(block)) == sorted(r["mfu"] for r in rows)


def test_an_epoch_keeps_its_last_smaller_batch():
    assert flops.epoch_flops(300, 64) == 4 * flops.step_flops(64) + flops.step_flops(44)
    assert flops.epoch_flops(256, 64) == 4 * flops.step_flops(64)
    assert flops.epoch_flops(50, 64) == flops.step_flops(50)  # one batch, smaller than batch_size
    assert flops.step_flops(100) == 122_184_000  # docs/benchmarks.md's figure: 73.3 GFLOP per 60,000 images
    assert flops.epoch_flops(60_000, 100) == 73_310_400_000


def _children(uri: str) -> list:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("mfu")
    return [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" in r.data.tags]


def test_a_linear_layers_bytes_are_its_inputs_and_output():
    # y = x @ w.T + b, x (4, 3), w (2, 3), b (2,), fp32: the transpose is a view (nothing moved); addmm
    # reads b (8 bytes), x (48) and w (24) and writes y (4 x 2 x 4 = 32).
    traced = make_fx(F.linear)(
        torch.empty(4, 3, device="meta"), torch.empty(2, 3, device="meta"), torch.empty(2, device="meta")
    )
    assert flops.graph_bytes(traced) == 8 + 48 + 24 + 32


def test_the_networks_first_conv_and_relu_at_batch_1_by_hand():
    with torch.device("meta"):
        conv = Network().conv1
        images = torch.empty(1, 1, 28, 28)

    def first(images):
        return F.relu(conv(images))

    traced = make_fx(first)(images)
    image, weight, bias = 28 * 28 * 4, 6 * 5 * 5 * 4, 6 * 4
    out = 6 * 24 * 24 * 4  # 5x5 kernel, no padding: 24 x 24 per channel
    assert flops.graph_bytes(traced) == (image + weight + bias + out) + (out + out)  # conv, then relu


def test_a_step_moves_fewer_bytes_at_half_precision_and_an_epoch_keeps_its_last_batch():
    fp32, bf16, fp16 = (flops.step_bytes(100, precision) for precision in ("fp32", "bf16", "fp16"))
    assert fp32 == 23_025_568  # docs/benchmarks.md's figure: 13.8 GB per 60,000-image epoch
    assert flops.epoch_bytes(60_000, 100) == 600 * fp32
    # Autocast runs the convolutions and linear layers and their activations at 2 bytes, the loss at 4.
    assert bf16 == fp16 == 13_448_772  # the docs figure: 13.4 MB, 0.58 of fp32's
    assert flops.epoch_bytes(300, 64, "bf16") == 4 * flops.step_bytes(64, "bf16") + flops.step_bytes(44, "bf16")
    # Per image the traffic is the same at any batch size; only the weights' share is fixed: the
    # count from two small traces is the trace's at any size.
    assert flops.traced_step_bytes(3) - flops.traced_step_bytes(2) == flops.step_bytes(2) - flops.step_bytes(1) > 0
    for batch_size, precision in ((100, "fp32"), (333, "fp32"), (100, "bf16")):
        assert flops.step_bytes(batch_size, precision) == flops.traced_step_bytes(batch_size, precision)
    with pytest.raises(ValueError, match="precision"):
        flops.step_bytes(10, "int8")


def test_a_runs_bytes_per_epoch_are_logged_with_no_bandwidth_share_on_the_cpu(swept):
    uri, rows, *_ = swept
    runs = _children(uri)
    assert len(runs) == 2
    for run in runs:
        metrics, tags = run.data.metrics, run.data.tags
        train, batch_size = int(run.data.params["train_size"]), int(run.data.params["batch_size"])
        assert metrics[names.TRAIN_BYTES] == flops.epoch_bytes(train, batch_size, "fp32")
        assert names.BANDWIDTH_SHARE not in metrics
        assert tags[names.TAG_BANDWIDTH].startswith("no bandwidth_share on cpu: the bytes are counted as if no cache")
        assert metrics[names.PEAK_BANDWIDTH] > 0
    by_run = {r.info.run_id: r.data.metrics for r in runs}
    for row in rows:  # compare --format json carries them beside the mfu
        assert row[names.TRAIN_BYTES] == by_run[row["run_ids"]][names.TRAIN_BYTES]
        assert row[names.PEAK_BANDWIDTH] == pytest.approx(by_run[row["run_ids"]][names.PEAK_BANDWIDTH])
        assert row[names.BANDWIDTH_SHARE] is None


def test_the_roofline_places_each_setting_under_its_devices_roof(swept):
    uri, _, report, folder = swept
    assert (folder / charts.ROOFLINE_PNG).stat().st_size > 0
    assert "<figcaption>Roofline: achieved FLOP/s under each device&#x27;s measured peaks</figcaption>" in report

    comparison = build(read_sweep(mlflow.MlflowClient(uri), experiment="mfu"))
    chart = charts.plan(comparison)[charts.ROOFLINE_PNG]
    assert chart["left_out"] == []
    by_label = {point["label"]: point for point in chart["points"]}
    for _, row in comparison.table.iterrows():
        point = by_label[comparison.label(row)]
        assert point["x"] == pytest.approx(row[names.TRAIN_FLOPS] / row[names.TRAIN_BYTES], rel=1e-3)
        assert point["y"] == pytest.approx(row[names.ACHIEVED_TFLOPS] * 1e12, rel=1e-3)
    (roof,) = chart["roofs"]  # one CPU at fp32: its runs' measured peaks, as they logged them
    row = comparison.table.iloc[0]
    assert roof["peak"] == pytest.approx(row[names.PEAK_TFLOPS] * 1e12, rel=1e-3)
    assert roof["bandwidth"] == pytest.approx(row[names.PEAK_BANDWIDTH] * 1e9, rel=1e-3)


def test_a_sweep_without_the_byte_counts_gets_no_roofline(swept, tmp_path):
    uri, *_ = swept
    sweep = read_sweep(mlflow.MlflowClient(uri), experiment="mfu")
    for child in sweep.children:  # as runs logged before the bytes were counted
        for name in (names.TRAIN_BYTES, names.PEAK_BANDWIDTH, names.BANDWIDTH_SHARE):
            child.metrics.pop(name, None)
    written = write_report(Answer(build(sweep)), tmp_path / "comparison")
    assert tmp_path / "comparison" / charts.EPOCH_DURATION_PNG in written
    assert not (tmp_path / "comparison" / charts.ROOFLINE_PNG).exists()
    assert charts.ROOFLINE_PNG not in charts.plan(build(sweep))


def test_wide_and_the_utilisation_table_show_bytes_and_a_bandwidth_share_where_runs_have_one(swept):
    uri, *_ = swept
    wide = invoke("compare", "--tracking-uri", uri, "--wide", "--format", "markdown")
    assert wide.exit_code == 0, wide.output
    header = next(line for line in wide.stdout.splitlines() if line.startswith("| device"))
    assert "| TFLOP/s | MFU % |" in header and "BW %" not in header  # CPU runs: no share

    sweep = read_sweep(mlflow.MlflowClient(uri), experiment="mfu")
    for child in sweep.children:  # as a CUDA run with compile off logs it
        child.metrics[names.BANDWIDTH_SHARE] = 0.25
    comparison = build(sweep)
    assert "| TFLOP/s | MFU % | BW % |" in markdown(display_frame(comparison)).splitlines()[0]
    frame = utilisation_frame(comparison)
    assert list(frame["BW %"]) == ["25.0", "25.0"]
    for (_, row), moved, intensity in zip(comparison.table.iterrows(), frame["GB/epoch"], frame["FLOP/byte"]):
        assert moved == f"{row[names.TRAIN_BYTES] / 1e9:,.2f}"
        assert intensity == f"{row[names.TRAIN_FLOPS] / row[names.TRAIN_BYTES]:.3g}"


def test_a_step_that_torch_cannot_trace_leaves_the_run_its_mfu(tmp_path, data_dir, _store_template, monkeypatch):
    def untraceable(batch_size: int, precision: str = "fp32") -> int:
        raise RuntimeError("this torch cannot trace the step")

    monkeypatch.setattr(flops, "step_bytes", untraceable)
    grid = GRID.replace("batch_size: [64, 128]", "batch_size: [64]")
    with isolated(tmp_path):
        assert invoke("devices", "--peak").exit_code == 0
        uri = new_store(tmp_path, _store_template)
        (tmp_path / "grid.yaml").write_text(grid)
        out = invoke("run", "grid.yaml", "--data-dir", str(data_dir), "--tracking-uri", uri)
    assert out.exit_code == 0, out.output
    (run,) = _children(uri)
    assert run.info.status == "FINISHED" and 0 < run.data.metrics["mfu"] <= 1
    assert names.TRAIN_BYTES not in run.data.metrics and names.BANDWIDTH_SHARE not in run.data.metrics
    assert run.data.tags[names.TAG_BANDWIDTH] == (
        "no byte count: tracing the step failed (RuntimeError: this torch cannot trace the step)"
    )


def test_a_sweep_with_no_peak_measured_writes_nothing_outside_its_store_and_says_how(tmp_path, data_dir, monkeypatch):
    """A machine whose cache is empty: the sweep benchmarks nothing and writes nothing of its own in
    the home folder (no ~/.cache/pipeline); its runs have their FLOPs and rate but no mfu, and say
    which command measures the peak. After `pipeline devices --peak`, the next run has its mfu."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("PIPELINE_CACHE_DIR")
    monkeypatch.chdir(work)
    (work / "grid.yaml").write_text(GRID.replace("batch_size: [64, 128]", "batch_size: [64]"))
    out = invoke("run", "grid.yaml", "--data-dir", str(data_dir))
    assert out.exit_code == 0, out.output
    # Only the libraries' own files, which docs/environment.md names: matplotlib's font cache and
    # MLflow's telemetry id. No peak cache, nothing of the pipeline's.
    libraries = {".cache", ".cache/matplotlib", ".config", ".config/matplotlib", ".config/mlflow"}
    written = {str(p.relative_to(home)) for p in home.rglob("*") if p.is_dir()}
    assert written <= libraries, written
    own = {"grid.yaml", "mlflow.db", "mlflow.db.lock", "mlruns", "pipeline-results.jsonl"}
    assert {p.name for p in work.iterdir()} <= own
    uri = f"sqlite:///{work / 'mlflow.db'}"
    (run,) = _children(uri)
    assert names.ACHIEVED_TFLOPS in run.data.metrics and names.MFU not in run.data.metrics
    note = run.data.tags[names.TAG_PEAK]
    assert note.startswith("no mfu: no peak measured for ") and "pipeline devices --peak` measures it" in note

    assert invoke("devices", "--peak").exit_code == 0
    assert (home / ".cache" / "pipeline" / "peaks.json").is_file()
    assert invoke("run", "grid.yaml", "--data-dir", str(data_dir), "--rerun").exit_code == 0
    latest = max(_children(uri), key=lambda r: r.info.start_time)
    assert 0 < latest.data.metrics[names.MFU] <= 1
