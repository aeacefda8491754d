"""FLOPs counted, and utilisation on every run: a real sweep through the real CLI on generated IDX
files logs each run's FLOPs per epoch (checked against torch's FlopCounterMode counted here, batch by
batch, as the loader batches), its achieved FLOP/s and its MFU, and `pipeline compare --format json`,
the UI's view and the HTML report show them."""

from __future__ import annotations

import json
import re

import mlflow
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from conftest import invoke, isolated, new_store
from pipeline.model import Network
from pipeline.present import view
from pipeline.present.tables import percent
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
    """One real sweep of two batch sizes, published, with the report written."""
    folder = tmp_path_factory.mktemp("mfu")
    with isolated(folder):
        uri = new_store(folder, _store_template)
        (folder / "grid.yaml").write_text(GRID)
        out = invoke("run", "grid.yaml", "--data-dir", str(data_dir), "--tracking-uri", uri)
        assert out.exit_code == 0, out.output
        report = folder / "report.html"
        compared = invoke("compare", "--tracking-uri", uri, "--format", "json", "--html", str(report))
        assert compared.exit_code == 0, compared.output
        yield uri, json.loads(compared.stdout), report.read_text()


def test_a_runs_flops_per_epoch_are_torchs_count_batch_by_batch(swept, data_dir):
    uri, _, _ = swept
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
    uri, rows, _ = swept
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
    uri, rows, report = swept
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("mfu")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`pipeline.role` = 'sweep'")
    # The view: a column of each run's setting's MFU, and the parent's table has it in percent.
    state = view.read_envelope(experiment.tags[f"mlflow.sharedViewState.sweep-{parent.info.run_id}"])
    assert "metrics.`setting_mfu`" in state["selectedColumns"]
    for run in client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"):
        row = next(r for r in rows if r["run_ids"] == run.info.run_id)
        assert run.data.metrics["setting_mfu"] == pytest.approx(row["mfu"])
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
