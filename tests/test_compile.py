"""The compile axis: torch.compile of the model, compiling timed on its own, twins against eager.

These compile for real with inductor (C++ on the CPU). Compiling is the slow part (about a minute
cold on 2 cores), so the tests that compile are `slow` (`make test-slow`) and share one dataset and
batch size: the first pays the cold compile, the others find the same kernels in inductor's on-disk
cache. What needs no compiling (planning, refusals, reading old runs) runs in `make test`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re

import mlflow
import pytest
import torch

from conftest import invoke, make_idx
from pipeline.settings.config import RunConfig
from pipeline.training.data import load
from pipeline.training.train import Hooks, fit

GRID = "experiment: compiled\ngrid:\n  batch_size: [100]\n  compile: [false, true]\n  device: [cpu]\n  epochs: [2]\n"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """150 training images in batches of 100 (a full and a last batch of 50), 100 test images."""
    return make_idx(tmp_path_factory.mktemp("small"), n_train=150, n_test=100)


@pytest.mark.slow
def test_compiling_happens_before_epoch_1_at_every_shape_the_run_uses(small):
    """The warm-up compiles the full and the last training batch and the evaluation batch; the
    epochs compile nothing: from the first epoch on, the compiler's public stance
    "fail_on_recompile" turns any compiling into an error."""
    dataset = load(small)
    stances = []

    class NoCompilingInTheEpochs(Hooks):
        def before_training(self, one_off):
            stances.append("fail_on_recompile")
            torch.compiler.set_stance("fail_on_recompile")

    config = RunConfig(batch_size=100, epochs=2, device="cpu")
    try:
        compiled = fit(
            dataclasses.replace(config, compile=True), dataset, torch.device("cpu"), NoCompilingInTheEpochs()
        )
    finally:
        torch.compiler.set_stance("default")
    assert stances == ["fail_on_recompile"]  # the epochs ran under it
    assert compiled.one_off["compile_s"] > 0 and "warmup_s" not in compiled.one_off
    eager = fit(config, dataset, torch.device("cpu"))
    assert "compile_s" not in eager.one_off and eager.warmup_s > 0
    # The same training: compiled kernels round differently, not differently enough to learn otherwise.
    assert compiled.final.train_loss == pytest.approx(eager.final.train_loss, rel=1e-3)
    # The model a compiled run returns is the plain network: its state dict loads into a new one.
    assert set(compiled.model.state_dict()) == set(eager.model.state_dict())


def test_a_warm_up_that_misses_a_shape_is_caught_by_the_stance(small):
    """The check above can fail: a compiled function met at a shape it was not compiled for, under
    "fail_on_recompile", raises instead of compiling quietly."""
    function = torch.compile(lambda x: x * 2, dynamic=False, backend="eager")
    function(torch.ones(3))
    try:
        torch.compiler.set_stance("fail_on_recompile")
        with pytest.raises(Exception, match="(?i)recompil"):
            function(torch.ones(4))
    finally:
        torch.compiler.set_stance("default")


@pytest.mark.slow
def test_a_compile_sweep_reports_compile_time_apart_and_compares_with_eager(write_grid, small, tracking_uri):
    out = invoke("run", str(write_grid(GRID)), "--tracking-uri", tracking_uri, "--data-dir", str(small))
    assert out.exit_code == 0, out.output
    client = mlflow.MlflowClient(tracking_uri)
    runs = {
        r.info.run_name: r
        for r in client.search_runs(
            [client.get_experiment_by_name("compiled").experiment_id], "tags.`pipeline.role` = 'point'"
        )
    }
    assert sorted(runs) == ["cpu compiled", "cpu eager"]
    compiled, eager = runs["cpu compiled"].data, runs["cpu eager"].data
    assert compiled.params["compile"] == "true" and compiled.metrics["compile_s"] > 0
    assert "warmup_s" not in compiled.metrics and "compile_s" not in eager.metrics
    data = invoke("compare", "--tracking-uri", tracking_uri, "--format", "csv")
    rows = {r["compile"]: r for r in csv.DictReader(io.StringIO(data.stdout))}
    assert rows["false"]["compile_speedup"] == "1.0"
    ratio = float(rows["false"]["epoch_duration_s"]) / float(rows["true"]["epoch_duration_s"])
    assert float(rows["true"]["compile_speedup"]) == pytest.approx(ratio)
    assert float(rows["true"]["compile_s"]) == pytest.approx(compiled.metrics["compile_s"])
    table = " ".join(invoke("compare", "--tracking-uri", tracking_uri).output.split())
    assert re.search(r"compile[ _]s", table) and "vs compile=false" in table
    assert re.search(r"compile=true \d+\.\d\dx (faster|slower)", table), table


@pytest.mark.slow
def test_a_compile_failure_fails_that_run_only(write_grid, small, tracking_uri, tmp_path):
    """A C++ compiler that answers --version but cannot build (as when Python's headers are
    missing) fails the compiled point with the reason; the eager point after it trains. Inductor
    takes its compiler from $CXX; TORCHINDUCTOR_FX_GRAPH_CACHE=0, else kernels cached by the other
    tests need no compiler."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "broken-c++"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && exec g++ --version\n'
        'echo "fatal error: Python.h: No such file or directory" >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    grid = GRID.replace("[false, true]", "[true, false]").replace("[2]", "[1]")
    env = {**os.environ, "CXX": str(fake), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            str(write_grid(grid)),
            "--tracking-uri",
            tracking_uri,
            "--data-dir",
            str(small),
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=600,
    )
    assert out.returncode == 1, out.stdout
    text = " ".join(out.stdout.split())
    assert "torch.compile failed" in text and "set compile: false" in text
    client = mlflow.MlflowClient(tracking_uri)
    runs = {
        r.info.run_name: r.info.status
        for r in client.search_runs(
            [client.get_experiment_by_name("compiled").experiment_id], "tags.`pipeline.role` = 'point'"
        )
    }
    assert runs == {"cpu compiled": "FAILED", "cpu eager": "FINISHED"}


def test_compile_is_refused_with_the_reason_where_it_cannot_build(write_grid, monkeypatch):
    from pipeline.execution.executors import plan
    from pipeline.settings.config import load_grid
    from pipeline.settings.grid import expand

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    planned = plan(expand(load_grid(write_grid(GRID))))
    monkeypatch.delenv("CXX")
    assert [p.reason for p in planned] == ["", planned[1].reason] and "needs a C++ compiler" in planned[1].reason
    graph = write_grid("grid:\n  device: [cpu]\n  compile: [true]\n  cuda_graph: [true]\n", "g.yaml")
    assert "cuda_graph" in plan(expand(load_grid(graph)))[0].reason


def test_runs_from_before_later_keys_are_their_defaults_and_flags_read_as_logged():
    """A run made before `compile` existed is the eager twin; boolean params are logged lower-case."""
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord
    from pipeline.present.tables import display_frame

    def run(run_id, seconds, **params):
        return RunRecord(
            run_id,
            run_id,
            {"batch_size": "64", **params},
            {"test_accuracy": 0.8},
            {"pipeline.device": "cpu"},
            histories={"epoch_duration_s": [9.0, seconds]},
        )

    sweep = SweepRecord(
        "p",
        "p",
        "1",
        "x",
        [run("old", 3.0), run("new", 1.5, compile="true"), run("upload", 2.0, data_on_device="true")],
    )
    comparison = build(sweep)
    table = comparison.table.set_index("run_ids")
    assert table.loc["old", "compile"] == "false" and table.loc["new", "compile_speedup"] == 2.0
    shown = display_frame(comparison).set_index(comparison.table["run_ids"])
    assert shown.loc["upload", "data path"] == "on device (no host data path)"
    assert shown.loc["old", "data path"] == "host"
    assert shown.loc["old", "compile speedup"] == "ref"
    assert shown.loc["new", "compile speedup"] == "2.00x faster (n too small (1 run))"
