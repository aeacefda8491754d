"""One set of numbers on every surface of a sweep, and compare as a read command.

A sweep with repeats, written straight into a real sqlite store (synthetic_sweeps), is compared
through the real CLI; each setting's figures must be the same numbers in `--format json`, csv, the
terminal table, its runs' columns in the UI (names.SETTING_*), the descriptions and the report
(`--html`, and `report.html` on the parent run). `compare` without `--publish` changes no byte of
the store or its artifacts.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import re
from pathlib import Path

import mlflow
import numpy as np
import pytest

from conftest import checksums, invoke
from pipeline.base import names
from synthetic_sweeps import Run, jittered, write_sweep

SETTING_FIGURES = {
    "setting_steady_epoch_s": "steady_epoch_s",
    "setting_images_per_s": "steady_images_per_s",
    "setting_final_test_accuracy": "final_test_accuracy",
    "setting_n": "n",
}


@pytest.fixture
def repeated(tracking_uri):
    """4 settings (cpu and cuda:0, batch sizes 64 and 128), 3 runs each, clearly apart in speed."""
    rng = np.random.default_rng(7)
    runs = [
        Run(jittered(seconds, 4, rng), device, params={"batch_size": batch})
        for device, batch, seconds in (
            ("cpu", "64", 1.0),
            ("cpu", "128", 0.8),
            ("cuda:0", "64", 0.4),
            ("cuda:0", "128", 0.3),
        )
        for _ in range(3)
    ]
    parent_id = write_sweep(tracking_uri, "surfaces", runs, {"pipeline.grid_file": "grid.yaml"})
    return tracking_uri, parent_id


def _compare(uri: str, *args: str) -> str:
    out = invoke("compare", "--tracking-uri", uri, *args)
    assert out.exit_code == 0, out.output
    return out.stdout


def _report_records(text: str) -> list[dict]:
    block = re.search(r'<script type="application/json" id="comparison">\n(.*?)\n</script>', text, re.S).group(1)
    return json.loads(block)


def test_every_surface_shows_each_settings_same_numbers(repeated, tmp_path, monkeypatch):
    uri, parent_id = repeated
    _compare(uri, "--publish")
    rows = json.loads(_compare(uri, "--format", "json"))
    assert len(rows) == 4 and {row["n"] for row in rows} == {3}

    # csv: the same values, to the last digit
    parsed = {r["run_ids"]: r for r in csv.DictReader(io.StringIO(_compare(uri, "--format", "csv")))}
    for row in rows:
        for name in ("steady_epoch_s", "steady_images_per_s", "final_test_accuracy"):
            assert float(parsed[row["run_ids"]][name]) == row[name], name

    # the terminal table and the markdown: each setting's figures as the table rounds them
    monkeypatch.setenv("COLUMNS", "200")
    table, markdown = _compare(uri, "--wide"), _compare(uri, "--format", "markdown")
    for row in rows:
        for text in (table, markdown):
            assert f"{row['steady_epoch_s']:.3f}" in text and f"{row['final_test_accuracy']:.4f}" in text

    # the UI: every run of a setting carries its setting's figures, the row's numbers
    client = mlflow.MlflowClient(uri)
    for row in rows:
        for run_id in row["run_ids"].split(","):
            metrics = client.get_run(run_id).data.metrics
            for metric, column in SETTING_FIGURES.items():
                assert metrics[metric] == row[column], (metric, run_id)

    # one row per setting: the view shows the run that stands for each (no UI aggregate over the
    # repeats), named by its setting in full, with its part of the verdict beside its figures
    from pipeline.present import view

    experiment = client.get_experiment_by_name("surfaces")
    state = view.read_envelope(experiment.tags[f"mlflow.sharedViewState.sweep-{parent_id}"])
    assert "groupBy" not in state
    shown = client.search_runs([experiment.experiment_id], state["searchFilter"])
    assert len(shown) == len(rows) and all(
        r.info.run_id in row["run_ids"] for r, row in zip(sorted(shown, key=lambda r: r.data.metrics["rank"]), rows)
    )
    tags = [run.data.tags for run in shown]
    said = {t["pipeline.setting"]: t["pipeline.verdict"] for t in tags}
    assert len(said) == 4 and [name for name, words in said.items() if "best" in words.split("; ")] == [
        "cuda:0 bs128"
    ], said
    assert re.search(r"cuda:0 vs cpu, epoch time: \d\.\d\dx faster \[[\d.-]+\] \(significant\)", said["cuda:0 bs64"])

    # the descriptions: the verdict the terminal prints, and each setting's epoch time
    verdict = [line for line in table.splitlines() if line.startswith(("Best:", "First on speed:", "Most accurate:"))]
    assert verdict
    parent = client.get_run(parent_id).data.tags["mlflow.note.content"]
    experiment = client.get_experiment_by_name("surfaces").tags["mlflow.note.content"]
    for line in verdict:
        escaped = line.replace("_", "\\_").replace("[", "\\[").replace("]", "\\]")
        assert f"**{escaped}**" in parent and f"**{escaped}**" in experiment, line
    for row in rows:
        assert f"{row['steady_epoch_s']:.3f}" in parent

    # the PNG charts: each setting's point and bar at its figures, as the charts round them
    from pipeline.analysis.compare import CHART_HISTORIES, HISTORIES, build
    from pipeline.present import charts
    from pipeline.tracking.records import read_sweep

    comparison = build(read_sweep(client, parent_run_id=parent_id, histories=HISTORIES, charted=CHART_HISTORIES))
    planned = charts.plan(comparison)
    labels = {comparison.label(row): row["run_ids"] for _, row in comparison.table.iterrows()}
    by_ids = {row["run_ids"]: row for row in rows}
    points = {point["label"]: point for point in planned[charts.TRADEOFF_PNG]["points"]}
    bars = {bar["label"]: bar for bar in planned[charts.EPOCH_DURATION_PNG]["bars"]}
    assert sorted(points) == sorted(bars) == sorted(labels)
    for label, ids in labels.items():
        row = by_ids[ids]
        assert points[label]["x"] == bars[label]["value"] == round(row["steady_epoch_s"], 3), label
        assert points[label]["y"] == round(row["final_test_accuracy"], 4), label

    # the report on the parent run: the verdict, and the very records `--format json` prints
    folder = Path(client.download_artifacts(parent_id, "report.html", str(tmp_path)))
    report = folder.read_text(encoding="utf-8")
    assert _report_records(report) == rows
    for line in verdict:
        assert f"<p>{html.escape(line)}</p>" in report, line
    for row in rows:
        assert f"{row['steady_epoch_s']:.3f}" in report


def test_the_terminal_the_uis_first_line_the_report_and_json_agree(repeated, tmp_path, monkeypatch):
    """One answer on every path: `compare`'s terminal output, the UI's first line (the experiment's
    description), report.html and `compare --format json` name the same best setting, the same lead
    over the next, the same speedups, and list the settings in one order (best first)."""
    uri, parent_id = repeated
    _compare(uri, "--publish")
    rows = json.loads(_compare(uri, "--format", "json"))
    order = [f"{row['device']} bs{row['batch_size']}" for row in rows]
    assert rows[0]["best"] and not any(row["best"] for row in rows[1:]), rows
    speedups = [
        f"{row['speedup']:.2f}x faster [{row['speedup_low']:.2f}-{row['speedup_high']:.2f}]"
        for row in rows
        if row["speedup_vs"]
    ]
    assert len(speedups) == 2

    monkeypatch.setenv("COLUMNS", "200")
    terminal = _compare(uri)
    best_line = next(line for line in terminal.splitlines() if line.startswith("Best: "))
    lead = re.search(r"\((\d\.\d\dx \[[\d.]+-[\d.]+\] over [^)]+)\)", best_line).group(1)
    assert best_line.startswith(f"Best: {order[0]} (")
    table = terminal[terminal.index("┏") :]
    positions = [table.index(f"{row['steady_epoch_s']:.3f}") for row in rows]
    assert positions == sorted(positions), (order, table)

    client = mlflow.MlflowClient(uri)
    first = client.get_experiment_by_name("surfaces").tags["mlflow.note.content"].splitlines()[0]
    ui = first.split(" · **")[1].removesuffix("**").replace("\\", "")
    assert ui.startswith(f"Best: {order[0]}: fastest, {lead}"), (ui, lead)

    folder = Path(client.download_artifacts(parent_id, "report.html", str(tmp_path)))
    report = html.unescape(folder.read_text(encoding="utf-8"))
    assert [f"{r['device']} bs{r['batch_size']}" for r in _report_records(report)] == order
    assert best_line in report and lead in report
    assert all(speedup in terminal and speedup in report for speedup in speedups), speedups


def test_compare_without_publish_changes_no_byte_of_the_store(repeated, tmp_path):
    uri, _ = repeated
    before = checksums(tmp_path)
    for args in (
        ("--format", "table"),
        ("--format", "json"),
        ("--format", "csv"),
        ("--wide",),
        ("--versus", "batch_size=64"),
    ):
        _compare(uri, *args)
        assert checksums(tmp_path) == before, args


def test_compare_html_writes_one_offline_report(repeated, tmp_path):
    uri, parent_id = repeated
    target = tmp_path / "out" / "report.html"
    before = checksums(tmp_path)
    out = invoke("compare", "--tracking-uri", uri, "--html", str(target))
    assert out.exit_code == 0, out.output
    assert f"wrote {target}" in out.stderr
    assert checksums(tmp_path, leave_out=target) == before  # the report, and nothing else
    text = target.read_text(encoding="utf-8")
    assert _report_records(text) == json.loads(_compare(uri, "--format", "json"))
    # Offline: nothing is fetched; the charts are inside the file.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text) and "<link" not in text
    # Speed against accuracy, epoch time, test accuracy and speedups (no time shares logged here: no
    # breakdown).
    assert text.count('src="data:image/png;base64,') == 4
    assert 'alt="Speed against accuracy' in text and 'alt="Epoch duration' in text and 'alt="Test accuracy' in text
    assert 'id="verdict"' in text and 'id="hosts"' in text and "host-a" in text
    assert f"--run-id {parent_id} --artifact-path grid/effective.yaml --dst-path ." in text
    assert "pipeline run grid/effective.yaml" in text  # where the download puts it
    assert f"export MLFLOW_TRACKING_URI={uri}" in text and "pipeline compare --experiment surfaces" in text


def test_a_publish_piped_into_a_reader_that_stops_early_still_publishes(repeated, tmp_path):
    """`pipeline compare --publish | head -1`: the reader closes the pipe early (here at once: `true`
    reads nothing); the view, the descriptions and the report are written all the same (the printing
    once came first, and its broken pipe ended the command)."""
    import subprocess
    import sys

    uri, parent_id = repeated
    client = mlflow.MlflowClient(uri)
    assert [a.path for a in client.list_artifacts(parent_id)] == []
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run(
        f"{sys.executable} -m pipeline compare --publish --tracking-uri {uri} | true",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert {"comparison", "report.html"} <= {a.path for a in client.list_artifacts(parent_id)}, done.stderr
    assert "pipeline.best_run" in client.get_run(parent_id).data.tags


def test_compare_html_refuses_a_folder_and_the_gate(repeated, tmp_path):
    uri, parent_id = repeated
    out = invoke("compare", "--tracking-uri", uri, "--html", str(tmp_path))
    assert out.exit_code == 2 and "--html" in out.output and "a folder" in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1
    out = invoke("compare", "--tracking-uri", uri, "--baseline", parent_id, "--publish")
    assert out.exit_code == 2 and "--baseline" in out.output, out.output


def test_a_report_of_100_settings_stays_under_3_mb():
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord
    from pipeline.present import html_report
    from pipeline.present.answer import Answer

    def name(b, lr):  # one name tries to close the report's script element
        return f"cpu bs{b} lr{lr}" + ("</script><!--<script>" if b == 32 and lr == 0.001 else "")

    rng = np.random.default_rng(1)
    runs = [
        RunRecord(
            f"r{b}-{lr}",
            name(b, lr),
            {"batch_size": str(b), "lr": str(lr), "epochs": "3"},
            {"test_accuracy": float(0.8 + 0.001 * rng.standard_normal())},
            {"pipeline.device": "cpu"},
            histories={"epoch_duration_s": [2.0, *(b / 100 * (1 + 0.02 * rng.standard_normal(2)))]},
        )
        for b in range(32, 32 * 11, 32)
        for lr in (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3)
    ]
    comparison = build(SweepRecord("p", "big", "1", "big", runs))
    assert len(comparison.table) == 100
    text = html_report.render(Answer(comparison))
    assert len(text.encode("utf-8")) < 3_000_000, len(text)
    # A name that would end or open a block in the page stays inside the JSON, which still parses.
    records = _report_records(text)
    assert len(records) == 100 and text.count("</script>") == 1
    assert [r["run_name"] for r in records if "<!--" in r["run_name"]] == ["cpu bs32 lr0.001</script><!--<script>"]


def test_a_report_where_every_run_is_contended_still_charts_the_accuracy():
    """No speed figure counts, so there is no speed chart; the accuracy per epoch still is one, and the
    page says why the speed charts are missing (the Charts heading stood empty)."""
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord
    from pipeline.present import html_report
    from pipeline.present.answer import Answer

    runs = [
        RunRecord(
            f"r{b}-{repeat}",
            f"cpu bs{b}",
            {"batch_size": str(b), "epochs": "3"},
            {"test_accuracy": 0.8},
            {"pipeline.device": "cpu", names.TAG_CONTENDED: "others took 90%"},
            histories={"epoch_duration_s": [2.0, 1.0, 1.0], "test_accuracy": [0.6, 0.7, 0.8]},
        )
        for b in (64, 128)
        for repeat in (1, 2)
    ]
    text = html_report.render(Answer(build(SweepRecord("p", "busy", "1", "busy", runs))))
    charts_part = text.split("<h2>Charts</h2>")[1].split("<h2>")[0]
    assert charts_part.count('src="data:image/png;base64,') == 1 and 'alt="Test accuracy' in charts_part
    assert "every run was contended" in charts_part


def test_the_contended_note_names_five_runs_and_counts_the_rest():
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord
    from pipeline.present.sentences import notes

    runs = [
        RunRecord(
            f"r{i}",
            f"cpu bs64 r{i}",
            {"batch_size": "64", "epochs": "3"},
            {"test_accuracy": 0.8},
            {"pipeline.device": "cpu", names.TAG_CONTENDED: f"others took {80 + i}%"},
            histories={"epoch_duration_s": [2.0, 1.0, 1.0]},
        )
        for i in range(7)
    ]
    comparison = build(SweepRecord("p", "busy", "1", "busy", runs))
    (note,) = [line for line in notes(comparison) if "contended" in line]
    assert note.startswith("7 of 7 runs contended") and "others took 84%" in note, note
    assert "others took 85%" not in note and "; and 2 more; --include-contended counts them" in note, note
    # Every withheld figure of the wide table reads "-", none "nan".
    from pipeline.present.tables import display_frame

    wide = display_frame(comparison, compact=False, stacked=True)
    assert not [column for column in wide if wide[column].astype(str).str.contains("nan").any()], wide.T


def test_a_figure_withheld_on_a_later_publish_is_no_longer_shown(tracking_uri):
    """Published with --include-contended, every run shows its setting's epoch time; published again
    without it (every run contended: speed withheld), no run keeps the old number (NaN over it)."""
    rng = np.random.default_rng(5)
    busy = {"pipeline.contended": "other processes took 60% of 2 cores"}
    runs = [
        Run(jittered(seconds, 3, rng), "cpu", params={"batch_size": batch}, tags=busy)
        for batch, seconds in (("64", 1.0), ("128", 0.7))
        for _ in range(2)
    ]
    parent_id = write_sweep(tracking_uri, "busy", runs)
    client = mlflow.MlflowClient(tracking_uri)
    children = client.search_runs(
        [client.get_experiment_by_name("busy").experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'"
    )
    _compare(tracking_uri, "--include-contended", "--publish")
    assert all(client.get_run(r.info.run_id).data.metrics["setting_steady_epoch_s"] > 0 for r in children)
    _compare(tracking_uri, "--publish")
    for run in children:
        metrics = client.get_run(run.info.run_id).data.metrics
        assert metrics["setting_steady_epoch_s"] != metrics["setting_steady_epoch_s"]  # NaN
        assert metrics["setting_final_test_accuracy"] > 0  # accuracy is never withheld
