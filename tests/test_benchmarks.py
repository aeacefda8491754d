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
    args = argparse.Namespace(device=["cpu", "cuda"], batch_size=[100], workers=[0], rounds=1, data_dir=str(data_dir),
                              synthetic=False, accuracy_epochs=0, epochs=2, cuda_variants=True, overhead=False,
                              no_loops=False, out=None)
    text = harness.report(args, tmp_path)
    lines = text.splitlines()
    epochs_header = next(i for i, line in enumerate(lines) if line.startswith("| device | batch | workers | warm-up"))
    rows = [line.split(" | ") for line in lines[epochs_header + 2:] if line.startswith("| cpu")]
    assert len(rows) == 1  # cuda is skipped on this machine, and the variants are cuda's
    epoch_times = [float(t) for t in rows[0][4].split(", ")]
    assert len(epoch_times) == 2 and float(rows[0][5]) == epoch_times[1]  # steady state: epoch 2
    assert "per-epoch seconds, 2 epochs; steady state = epoch 2" in text
    assert "tutorial" in text.lower()  # the side-by-side loop table is there too
