"""The precision axis: autocast on the run's device, skip reasons, twins against fp32."""

from __future__ import annotations

import csv
import io
import re

import mlflow
import pytest
import torch

from conftest import invoke
from pipeline.settings.config import RunConfig
from pipeline.training.data import load
from pipeline.training.train import fit

GRID = (
    "experiment: precision\n"
    "grid:\n  batch_size: [128]\n  precision: [fp32, bf16, fp16]\n  device: [cpu]\n  epochs: [2]\n"
)


def test_bf16_runs_the_network_in_bf16_and_learns_like_fp32(data_dir, monkeypatch):
    from pipeline.model import Network

    dataset, seen, original = load(data_dir), [], Network.forward
    fp32 = fit(RunConfig(batch_size=64, epochs=2, seed=1), dataset, torch.device("cpu"))

    def forward(self, t):
        out = original(self, t)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(Network, "forward", forward)
    bf16 = fit(RunConfig(batch_size=64, epochs=2, seed=1, precision="bf16"), dataset, torch.device("cpu"))
    assert set(seen) == {torch.bfloat16}  # training, warm-up and evaluation all ran under autocast
    assert next(bf16.model.parameters()).dtype == torch.float32  # weights and Adam stay fp32
    assert bf16.final.test_accuracy == pytest.approx(fp32.final.test_accuracy, abs=0.1)


def test_a_precision_sweep_skips_what_the_device_cannot_and_compares_with_fp32(write_grid, data_dir, tracking_uri):
    grid = str(write_grid(GRID))
    refused = invoke("run", grid, "--tracking-uri", tracking_uri, "--data-dir", str(data_dir), "--require-devices")
    assert refused.exit_code == 2 and "precision fp16 is for GPUs" in refused.output
    out = invoke("run", grid, "--tracking-uri", tracking_uri, "--data-dir", str(data_dir))
    assert out.exit_code == 0, out.output
    assert "skipped #3: precision fp16 is for GPUs" in " ".join(out.output.split())
    client = mlflow.MlflowClient(tracking_uri)
    names = sorted(
        r.info.run_name
        for r in client.search_runs(
            [client.get_experiment_by_name("precision").experiment_id], "tags.`pipeline.role` = 'point'"
        )
    )
    assert names == ["cpu bf16", "cpu fp32"]
    data = invoke("compare", "--tracking-uri", tracking_uri, "--format", "csv")
    rows = {r["precision"]: r for r in csv.DictReader(io.StringIO(data.stdout))}
    assert set(rows) == {"fp32", "bf16"} and rows["fp32"]["precision_speedup"] == "1.0"
    ratio = float(rows["fp32"]["epoch_duration_s"]) / float(rows["bf16"]["epoch_duration_s"])
    assert float(rows["bf16"]["precision_speedup"]) == pytest.approx(ratio)
    assert rows["bf16"]["precision_speedup_vs"] == rows["fp32"]["run_ids"]
    assert all(float(r["peak_memory_mb"]) >= 0 for r in rows.values())
    table = invoke("compare", "--tracking-uri", tracking_uri)
    assert re.search(r"bf16 \d+\.\d\dx (faster|slower)", " ".join(table.output.split())) and "vs fp32" in table.output


def test_old_runs_count_as_fp32_twins(tmp_path):
    """A run made before the precision key existed has no precision param: it is the fp32 twin."""
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord

    def run(run_id, seconds, **params):
        return RunRecord(
            run_id,
            run_id,
            {"batch_size": "64", **params},
            {"test_accuracy": 0.8},
            {"pipeline.device": "cpu"},
            histories={"epoch_duration_s": [9.0, seconds]},
        )

    sweep = SweepRecord("p", "p", "1", "x", [run("old", 2.0), run("new", 1.0, precision="bf16")])
    table = build(sweep).table.set_index("run_ids")
    assert table.loc["old", "precision"] == "fp32" and table.loc["new", "precision_speedup"] == 2.0
