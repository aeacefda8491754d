"""Sweeps past one page of MLflow's search: every store read pages to the end (records.every), on a
real sqlite store through the real client; and benchmarks/scale.py, which measures how they grow.

The 1,100-run sweep is one more page than MLflow's default (1000): before paging, it compared as 1000
rows. It is built once for the module in a RAM-backed folder where there is one (see
scale.store_folder: on this disk each of the ~7 commits per run written syncs, about 100 ms a run),
with two per-epoch metrics, the end figures a child logs and four params, but without the datasets
and model a real child records: about the cheapest sweep the public client writes. Its children
logged their end figures, so comparing it reads no history.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, invoke, isolated

BIG = 1100  # MLflow's default page is 1000 runs
# Every run of the big sweep is a setting of its own (its seed), so that it is a row of its own in
# the comparison (a row is one setting, its repeats together); benchmarks/scale.py times a grid's
# realistic spread of twins.
ONE_POINT = {"device": "cpu", "lr": "0.01", "batch_size": "1000", "epochs": "3"}


def _scale():
    spec = importlib.util.spec_from_file_location("scale", REPO / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its own module up while it is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def big_sweep(tmp_path_factory):
    scale = _scale()
    with (
        tempfile.TemporaryDirectory(prefix="pipeline-test-scale-", dir=scale.store_folder()) as folder,
        isolated(tmp_path_factory.mktemp("scale")),
    ):
        yield scale.build_sweep(
            f"sqlite:///{Path(folder) / 'mlflow.db'}",
            BIG,
            metrics=("epoch_duration_s", "test_accuracy"),
            inputs_and_model=False,
            point=lambda index: {**ONE_POINT, "seed": str(index)},
        )


@pytest.mark.slow  # the big sweep is written run by run (a minute on 2 cores): make test-slow
def test_a_sweep_past_one_page_compares_as_all_of_its_runs(big_sweep):
    result = invoke(
        "compare",
        "--parent-run",
        big_sweep.parent_run_id,
        "--format",
        "json",
        "--tracking-uri",
        big_sweep.client.tracking_uri,
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == BIG
    assert len({row["run_ids"] for row in rows}) == BIG and {row["n"] for row in rows} == {1}
    # Every run, none lost past the first page (in the verdict's order: best first, then fastest).
    assert sorted(row["run_name"] for row in rows) == sorted(f"point-{i}" for i in range(BIG))
    last = next(row for row in rows if row["run_name"] == f"point-{BIG - 1}")
    assert last["test_accuracy"] == pytest.approx(0.68 + 0.15 + (BIG - 1) % 10 * 0.001)  # the epoch-3 value


@pytest.mark.slow
def test_a_sweep_whose_children_logged_their_end_figures_is_read_without_histories(big_sweep):
    from pipeline.analysis.compare import HISTORIES
    from pipeline.tracking.records import read_sweep

    sweep = read_sweep(big_sweep.client, parent_run_id=big_sweep.parent_run_id, histories=HISTORIES)
    assert len(sweep.children) == BIG and all(child.histories == {} for child in sweep.children)


@pytest.mark.slow
def test_the_resume_lookup_finds_every_finished_run_past_one_page(big_sweep):
    from pipeline.tracking.records import finished_by_key

    finished = finished_by_key(big_sweep.client, big_sweep.experiment_id)
    assert sorted(finished) == sorted(f"synthetic-{BIG}-{i}" for i in range(BIG))


def test_paging_crosses_page_boundaries_without_losing_or_repeating_runs(tracking_uri):
    """25 runs with one start time (the order's tie is broken by run id), read 10 at a time."""
    import mlflow

    from pipeline.tracking.records import all_runs, every

    client = mlflow.MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("paging")
    made = {client.create_run(experiment_id, start_time=1000, tags={"kept": str(i % 2)}).info.run_id for i in range(25)}
    pages = []
    read = all_runs(client, [experiment_id], order_by=["attributes.start_time ASC"], page_size=10)
    assert len(read) == 25
    assert {r.info.run_id for r in read} == made
    kept = all_runs(client, [experiment_id], "tags.kept = '1'", page_size=10)
    assert len(kept) == 12
    assert {r.data.tags["kept"] for r in kept} == {"1"}
    assert all_runs(client, [experiment_id], "tags.kept = 'none'", page_size=10) == []

    def search(*args, max_results, page_token, **kwargs):  # the client's search, recording each page
        page = client.search_runs(*args, max_results=max_results, page_token=page_token, **kwargs)
        pages.append(len(page))
        return page

    assert len(list(every(search, [experiment_id], page_size=10))) == 25
    assert pages == [10, 10, 5]


@pytest.mark.slow  # writes sweeps of 10 and 20 runs, as benchmarks/scale.py does: make test-slow
def test_the_scale_benchmark_writes_its_table(tmp_path, monkeypatch, capsys):
    scale = _scale()
    out = tmp_path / "scale.md"
    monkeypatch.setattr(
        sys,
        "argv",
        ["benchmarks/scale.py", "--sizes", "10", "20", "--rounds", "1", "--old-runs-up-to", "10", "--out", str(out)],
    )
    scale.main()
    text = out.read_text()
    assert text in capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("# Store reads at scale (20")  # the date
    assert "MLflow 3." in text
    assert " cores" in text
    assert "Command: `python benchmarks/scale.py --sizes 10 20 --rounds 1 --old-runs-up-to 10 --out" in text
    header = lines.index("| runs | measurement | seconds | ms per run | ms/run vs 10 runs |")
    rows = [line.split(" | ") for line in lines[header + 2 :] if line.startswith("| ")]
    every_size = (
        "comparison: read_sweep + compare.build",
        "of which read_sweep",
        "of which compare.build",
        "pipeline compare --format json (in process)",
    )
    assert [(r[0], r[1]) for r in rows] == [
        *((f"| {size}", what) for what in every_size for size in (10, 20)),
        ("| 10", "comparison of runs without end figures"),  # 20 is past --old-runs-up-to
        ("| 10", "resume lookup: finished_by_key"),
        ("| 20", "resume lookup: finished_by_key"),
        ("| 10", "building the sweep (one time, not a read)"),
        ("| 20", "building the sweep (one time, not a read)"),
    ]
    assert all(r[4] == "1.00 |" for r in rows if r[0] == "| 10")  # the reference against itself
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
