"""The benchmark harness's report on tiny data, on the CPU: the GPU machine runs the same code
(benchmarks/gpu_check.sh) once, with no second chance, so a broken table must fail here first."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _harness():
    spec = importlib.util.spec_from_file_location("harness", REPO / "benchmarks" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_harness_reports_loops_and_per_epoch_times(data_dir, tmp_path):
    harness = _harness()
    args = _args(device=["cpu", "cuda"], data_dir=str(data_dir), no_loops=False)
    text, failures = harness.report(args, tmp_path)
    assert failures == []
    lines = text.splitlines()
    epochs_header = next(i for i, line in enumerate(lines) if line.startswith("| device | batch | workers | warm-up"))
    rows = [line.split(" | ") for line in lines[epochs_header + 2 :] if line.startswith("| cpu")]
    assert len(rows) == 1  # cuda is skipped on this machine, and the variants are cuda's
    epoch_times = [float(t) for t in rows[0][4].split(", ")]
    assert len(epoch_times) == 2 and float(rows[0][5]) == epoch_times[1]  # steady state: epoch 2
    assert "per-epoch seconds, 2 epochs; steady state = epoch 2" in text
    assert "tutorial" in text.lower()  # the side-by-side loop table is there too


def _args(**overrides):
    values = dict(
        device=["cpu"],
        batch_size=[100],
        workers=[0],
        rounds=1,
        data_dir=None,
        synthetic=False,
        accuracy_epochs=0,
        epochs=2,
        cuda_variants=True,
        overhead=False,
        no_loops=True,
        out=None,
        precision=["fp32"],
    )
    return argparse.Namespace(**{**values, **overrides})


def test_compiled_variants_are_timed_after_everything_else(monkeypatch):
    """On a one-shot GPU lease the slow compiles go last, so a time limit cuts them, not the table."""
    import torch

    harness = _harness()
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr(harness, "settings", lambda args: iter([(cuda, 100, 0), (cuda, 1000, 0), (cpu, 100, 0)]))
    jobs = list(harness._epoch_jobs(_args(batch_size=[100, 1000], precision=["fp32", "bf16"])))
    compiled = [i for i, job in enumerate(jobs) if job[3].get("compile")]
    assert len(compiled) == 3 and compiled == list(range(len(jobs) - 3, len(jobs)))
    assert all(jobs[i][:2] == (cuda, 100) for i in compiled)  # the smallest batch size only
    assert (cpu, 100, 0, {"precision": "bf16"}) in jobs  # --precision reaches the cpu rows
    assert sum(1 for job in jobs if job[:2] == (cuda, 100) and job[3] == {"precision": "bf16"}) == 1


def test_a_failing_variant_is_listed_and_the_others_are_measured(data_dir, monkeypatch):
    harness = _harness()
    real_fit = harness.fit

    def fit(config, dataset, device):
        if config.precision == "bf16":
            raise RuntimeError("no kernel for this\nsecond line")
        return real_fit(config, dataset, device)

    monkeypatch.setattr(harness, "fit", fit)
    text, failures = harness.epochs_table(_args(precision=["fp32", "bf16"]), harness.data_mod.load(data_dir))
    assert failures == ["cpu bf16 bs 100 w 0: RuntimeError: no kernel for this"]
    assert "- FAILED cpu bf16 bs 100 w 0: RuntimeError: no kernel for this" in text and "second line" not in text
    assert any(line.startswith("| cpu | 100 | 0 |") for line in text.splitlines())


@pytest.mark.slow  # a repeated sweep on Fashion-MNIST-sized data (60 s on 2 cores): make test-slow
def test_the_tracked_device_sweep_records_and_compares_its_cpu_half(data_dir, tmp_path, capfd):
    """gpu_check.sh's tracked sweep, on a machine without CUDA: the cuda points are skipped with the
    reason, the cpu points are trained once per repeat into a real store, each with its MFU, which the
    printed comparison shows, and the device chart is drawn."""
    import mlflow

    spec = importlib.util.spec_from_file_location("tracked_sweep", REPO / "benchmarks" / "tracked_sweep.py")
    tracked = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tracked)
    grid = tmp_path / "devices.yaml"
    grid.write_text(
        "experiment: devices\ndata: {train_size: 200, test_size: 100}\n"
        "grid:\n  batch_size: [50, 100]\n  device: [cuda, cpu]\n  epochs: [2]\n"
    )
    out, store = tmp_path / "out", tmp_path / "store"
    assert (
        tracked.main(
            [str(out), "--grid", str(grid), "--repeats", "2", "--data-dir", str(data_dir), "--store", str(store)]
        )
        == 0
    )
    client = mlflow.MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "devices"]
    children = client.search_runs([experiment.experiment_id], "tags.`pipeline.role` = 'point'")
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    assert sorted((r.data.params["batch_size"], r.data.params["repeat"]) for r in children) == [
        ("100", "1"),
        ("100", "2"),
        ("50", "1"),
        ("50", "2"),
    ]
    assert {r.data.tags["pipeline.device"] for r in children} == {"cpu"}
    assert (out / "devices-epoch-duration.png").stat().st_size > 0
    assert all(0 < r.data.metrics["mfu"] <= 1 for r in children)
    header = next(line for line in capfd.readouterr().out.splitlines() if line.startswith("| device"))
    assert "| TFLOP/s | MFU % |" in header
