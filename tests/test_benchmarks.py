"""The benchmark harness's report on tiny data, on the CPU: the GPU machine runs the same code
(benchmarks/gpu_check.sh) once, with no second chance, so a broken table must fail here first."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

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
    rows = [line.split(" | ") for line in lines[epochs_header + 2:] if line.startswith("| cpu")]
    assert len(rows) == 1  # cuda is skipped on this machine, and the variants are cuda's
    epoch_times = [float(t) for t in rows[0][4].split(", ")]
    assert len(epoch_times) == 2 and float(rows[0][5]) == epoch_times[1]  # steady state: epoch 2
    assert "per-epoch seconds, 2 epochs; steady state = epoch 2" in text
    assert "tutorial" in text.lower()  # the side-by-side loop table is there too


def _args(**overrides):
    values = dict(device=["cpu"], batch_size=[100], workers=[0], rounds=1, data_dir=None, synthetic=False,
                  accuracy_epochs=0, epochs=2, cuda_variants=True, overhead=False, no_loops=True, out=None,
                  precision=["fp32"])
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
