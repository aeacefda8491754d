"""What the MLflow UI is given to open on: the saved view, the descriptions, the names, the model step.
(tests/test_ui.py opens the same thing in a real browser.)"""

from __future__ import annotations

import re

import mlflow
import pytest

from conftest import Sweep, checksums, invoke, isolated, new_store
from pipeline.present import view
from pipeline.present.answer import Answer

GRID = "experiment: ui\ngrid:\n  batch_size: [64, 128]\n  device: [cpu]\n  epochs: [2]\n"


def _opened(sweep: Sweep):
    """What `pipeline run` printed, a client of its store, its experiment and its parent run."""
    client = mlflow.MlflowClient(sweep.uri)
    experiment = client.get_experiment_by_name("shared")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`pipeline.role` = 'sweep'")
    return sweep.output, client, experiment.experiment_id, parent.info.run_id


@pytest.fixture(scope="module")
def swept(shared_sweep):
    """conftest's shared sweep (batch sizes 64 and 128), which these tests only read."""
    return _opened(shared_sweep)


def _swept(folder, data_dir, tracking_uri):
    (folder / "grid.yaml").write_text(GRID)
    out = invoke("run", str(folder / "grid.yaml"), "--tracking-uri", tracking_uri, "--data-dir", str(data_dir))
    assert out.exit_code == 0, out.output
    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("ui")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`pipeline.role` = 'sweep'")
    return out.output, client, experiment.experiment_id, parent.info.run_id


def test_the_printed_link_opens_the_sweeps_saved_view(swept):
    output, client, experiment_id, parent_id = swept
    words = " ".join(output.split())  # as printed, whatever the console wrapped
    link = re.search(r"http://127\.0\.0\.1:5000/#/experiments/(\d+)/runs\?\S+", words).group(0)
    assert f"viewStateShareKey=sweep-{parent_id}" in link and "workflowType=machine_learning" in link
    assert "compareRunsMode=TABLE" in link
    tags = client.get_experiment(experiment_id).tags
    state = view.read_envelope(tags[f"mlflow.sharedViewState.sweep-{parent_id}"])
    assert state["searchFilter"] == f"tags.`pipeline.in_sweep.{parent_id}` = 'setting'"  # one run a setting
    assert state["orderByKey"] == "metrics.`rank`" and state["orderByAsc"] is True  # the verdict's order
    # The figures first (each run's setting's: the numbers compare prints), then the settings.
    assert state["selectedColumns"] == [
        "metrics.`setting_steady_epoch_s`",
        "metrics.`setting_images_per_s`",
        "metrics.`setting_final_test_accuracy`",
        "metrics.`setting_mfu`",
        "metrics.`setting_n`",
        "tags.`pipeline.verdict`",
        "params.`device`",
        "params.`batch_size`",
        "attributes.`Dataset`",
    ]
    charts = {c["uuid"]: c for c in state["compareRunCharts"]}
    assert [c["type"] for c in charts.values()] == ["SCATTER", "BAR", "BAR", "PARALLEL"]
    first = state["compareRunCharts"][0]  # speed against accuracy, first
    assert (first["xaxis"], first["yaxis"]) == (
        {"key": "setting_steady_epoch_s", "type": "METRIC"},
        {"key": "setting_final_test_accuracy", "type": "METRIC"},
    )
    assert charts["epoch-time"]["metricKey"] == "setting_steady_epoch_s"
    # batch_size's values all read as numbers: the UI would draw it as a continuous axis
    assert charts["settings"]["selectedParams"] == ["device"]
    assert {c["metricSectionId"] for c in charts.values()} == {s["uuid"] for s in state["compareRunSections"]}
    # What the filter promises is what the store answers: the sweep's two children, nothing else.
    found = client.search_runs([experiment_id], state["searchFilter"])
    assert sorted(r.info.run_name for r in found) == ["cpu bs128", "cpu bs64"]


def test_descriptions_say_what_was_swept_and_show_the_results(swept):
    _, client, experiment_id, parent_id = swept
    note = client.get_experiment(experiment_id).tags["mlflow.note.content"]
    assert "`batch_size` [64, 128]" in note and "pipeline run" in note and ".yaml" in note
    parent = client.get_run(parent_id).data.tags["mlflow.note.content"]
    # The decision table the terminal and the report show (answer.py), one row per setting, escaped
    # as MLflow's markdown reads it: no bracket becomes a link, no underscore italics.
    header = next(line for line in parent.splitlines() if line.startswith("| device |"))
    assert "batch\\_size" in header and "test acc" in header and "img/s" in header, header
    assert parent.count("| cpu |") >= 2 and "epoch 2" in parent  # the decision table, the utilisation table
    image = f"get-artifact?path=comparison%2Fepoch_duration.png&run_uuid={parent_id}"
    tradeoff = f"get-artifact?path=comparison%2Faccuracy_vs_time.png&run_uuid={parent_id}"
    assert parent.index(f"]({tradeoff})") < parent.index(f"]({image})")
    # The verdict first; then a link to the children's view, in the experiment's description too.
    verdict = parent.split("\n\n")[0]  # "Best: ...", then the first on speed and the most accurate where they differ
    assert re.match(
        r"\*\*Best: cpu bs\d+ \(\d\.\d{3} s/epoch, test acc \d\.\d{4}, 1 run; model from run [0-9a-f]{8}\)", verdict
    ), verdict
    said = ("Most accurate: cpu bs", "and the most accurate", "First on speed: cpu bs")
    assert sum(words in verdict for words in said) >= 1, verdict
    back = f"(#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=sweep-{parent_id}"
    assert f"[Open the children's view]{back}" in parent
    # The experiment's description opens on the latest sweep's verdict in one line (the UI folds it to
    # that line) with the links to the best model, the view and the report; then each claim a line.
    first, _, _, claims = note.splitlines()[:4]
    report = f"#/experiments/{experiment_id}/runs/{parent_id}/artifactPath/report.html?workflowType=machine_learning"
    assert re.match(
        rf"\[its model\]\(#/experiments/{experiment_id}/models/m-\w+\?workflowType=machine_learning\) · "
        rf"\[comparison view\]{re.escape(back)}&compareRunsMode=TABLE\) · \[report\]\({re.escape(report)}\) · "
        r"\*\*Best: cpu bs\d+: .+\*\*$",
        first,
    ), first
    # The verdict whole, in under 80 characters: the best and its claim, as the headline says it.
    said = first.split(" · **")[1].removesuffix("**").replace("\\", "")
    assert len(said) < 80 and said.split(":")[0] in parent.splitlines()[0], said
    assert ("most accurate" in said) == ("the most accurate" in parent.splitlines()[0]), (said, parent)
    assert claims == parent.splitlines()[0], note
    assert f"[Open its comparison view]{back}" in note
    assert "report.html" in [a.path for a in client.list_artifacts(parent_id)]
    assert "comparison/epoch_duration.png" in [a.path for a in client.list_artifacts(parent_id, "comparison")]


def test_children_carry_the_figures_and_a_colour_of_their_own(swept):
    """Each child's summary metrics are the comparison's figures for it (compare --format json), its
    colour (the UI's mlflow.runColor) is its setting's own."""
    _, client, experiment_id, parent_id = swept
    out = invoke("compare", "--parent-run", parent_id, "--tracking-uri", client.tracking_uri, "--format", "json")
    rows = {r["run_ids"]: r for r in __import__("json").loads(out.stdout)}
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    for run in children:
        row = rows[run.info.run_id]  # n=1: the row is the run
        for name, setting in (
            ("steady_epoch_s", "setting_steady_epoch_s"),
            ("steady_images_per_s", "setting_images_per_s"),
            ("final_test_accuracy", "setting_final_test_accuracy"),
        ):
            assert run.data.metrics[name] == row[name], name
            assert run.data.metrics[setting] == row[name], name  # its setting's figure: here its own
        assert run.data.metrics["setting_n"] == row["n"] == 1
        assert run.data.metrics["steady_epoch_s"] == float(f"{run.data.metrics['steady_epoch_s']:.4g}")
    assert len({run.data.tags[view.RUN_COLOR_TAG] for run in children}) == len(children) == 2


def test_children_lead_with_what_varies_and_link_the_model_to_the_last_epoch(swept):
    _, client, experiment_id, parent_id = swept
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    for run in children:
        assert run.info.run_name in ("cpu bs64", "cpu bs128")
        assert run.data.params["batch_size"] in run.info.run_name  # every setting stays in params
        assert "gpus_per_run" not in run.data.params  # it means something on cuda points only
        (output,) = run.outputs.model_outputs
        assert output.step == 2  # the final epoch: the model shows that epoch's metrics
        metrics = {m.key: m.step for m in client.get_logged_model(output.model_id).metrics}
        assert metrics["test_accuracy"] == 2


def test_each_model_carries_its_settings_name_and_keeps_its_runs_uri(swept, monkeypatch):
    """The experiment's models can be searched by setting, as the runs are grouped by it; each is
    still `runs:/RUN_ID/model`."""
    _, client, experiment_id, parent_id = swept
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    for run in children:
        setting = run.data.tags["pipeline.setting"]
        (model,) = client.search_logged_models([experiment_id], filter_string=f"tags.`pipeline.setting` = '{setting}'")
        assert model.source_run_id == run.info.run_id and model.name == "model"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
        assert mlflow.models.get_model_info(f"runs:/{run.info.run_id}/model").model_id == model.model_id


def test_sweep_wide_options_are_a_tag_of_the_parent_not_params(write_grid, data_dir, tracking_uri):
    out = invoke(
        "run",
        str(write_grid(GRID)),
        "--tracking-uri",
        tracking_uri,
        "--data-dir",
        str(data_dir),
        "--rerun",
        "--fail-fast",
        "--register",
        "ui-model",
    )
    assert out.exit_code == 0, out.output
    client = mlflow.MlflowClient(tracking_uri)
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("ui").experiment_id], "tags.`pipeline.role` = 'sweep'"
    )
    assert parent.data.tags["pipeline.options"] == "--rerun --fail-fast --register ui-model"
    # The parent's params are what the grid sweeps (so the UI shows it as a training run), never the options.
    assert not {"rerun", "fail_fast", "register"} & set(parent.data.params)
    assert parent.data.params["repeats"] == "1"


def test_envelope_round_trip_and_size():
    state = view.state("abc", ["device", "batch_size", "num_workers"])
    value = view.envelope("sweep", state)
    assert view.read_envelope(value) == state
    assert len(value) < 20000  # the UI and the server refuse longer tag values


@pytest.mark.parametrize(
    "axes, expected",
    [
        (
            (("device", ("cuda", "cpu")), ("batch_size", (1000, 10000)), ("num_workers", (0, 1))),
            ["cuda bs1000 w0", "cuda bs1000 w1", "cuda bs10000 w0"],
        ),
        ((("lr", (0.01, 0.001)), ("device", ("cpu",))), ["cpu lr0.01", "cpu lr0.001"]),
        ((("lr", (0.01, 0.001)),), ["lr0.01", "lr0.001"]),
        ((("seed", (0, 1)), ("shuffle", (True, False))), ["seed0 shuffle", "seed0 noshuffle"]),
        ((("device", ("cpu",)),), ["cpu"]),
        ((), ["defaults"]),
    ],
)
def test_point_names_are_short_and_lead_with_what_varies(axes, expected):
    from pathlib import Path

    from pipeline.settings.config import GridSpec
    from pipeline.settings.grid import expand

    names = [p.name for p in expand(GridSpec(Path("g.yaml"), "g", axes=axes))]
    assert names[: len(expected)] == expected
    assert all(len(n) <= 24 for n in names)


def test_an_unverified_mlflow_gets_the_filtered_link_and_a_note_and_publish_writes_the_view_later(
    tmp_path, data_dir, _store_template, monkeypatch
):
    """The saved view is MLflow's UI format, with no public API: on a version it was not checked on
    (here: this one, taken off the verified list) no view is written, and the printed link filters
    the runs page to the sweep's children, with a note. Nothing fails. Later, on a verified MLflow,
    `pipeline compare` of that sweep (an older sweep whose view is missing) writes nothing, in any
    format: the store and its artifacts keep their bytes; it gives the runs' link and the way to
    publish, and --publish writes the view, the descriptions and the report."""
    from urllib.parse import parse_qs, urlsplit

    assert view.supported("3.17.2") and not view.supported("3.18.0") and not view.supported("4.0.0rc1")
    monkeypatch.setattr(view, "VERIFIED_UI", ((3, 99),))
    with isolated(tmp_path):
        output, client, experiment_id, parent_id = _swept(tmp_path, data_dir, new_store(tmp_path, _store_template))
    words = " ".join(output.split())
    assert "the link lists the sweep's runs instead" in words and "written only for MLflow 3.99" in words
    link = re.search(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs\?\S+", words).group(0)
    assert "viewStateShareKey" not in link
    query = parse_qs(urlsplit(link.replace("/#/", "/")).query)
    children = client.search_runs([experiment_id], query["searchFilter"][0])
    assert len(children) == 2 and {r.data.tags["mlflow.parentRunId"] for r in children} == {parent_id}
    tags = client.get_experiment(experiment_id).tags
    assert not [key for key in tags if key.startswith(view.VIEW_TAG_PREFIX)]
    assert client.get_run(parent_id).data.tags[view.NOTE_TAG]  # the description is still written

    monkeypatch.undo()  # a verified MLflow again
    folders = (tmp_path / "store", tmp_path / "mlruns")
    before = [checksums(folder) for folder in folders]
    for fmt in ("table", "json", "csv", "markdown"):
        out = invoke("compare", "--parent-run", parent_id, "--tracking-uri", client.tracking_uri, "--format", fmt)
        assert out.exit_code == 0, out.output
        assert [checksums(folder) for folder in folders] == before, fmt
    said = " ".join(out.output.split())
    assert "viewStateShareKey" not in said and "searchFilter=" in said and "compare --publish" in said, said
    out = invoke("compare", "--parent-run", parent_id, "--tracking-uri", client.tracking_uri, "--publish")
    assert out.exit_code == 0, out.output
    assert f"viewStateShareKey=sweep-{parent_id}" in " ".join(out.output.split())
    assert f"mlflow.sharedViewState.sweep-{parent_id}" in client.get_experiment(experiment_id).tags


def test_the_parent_description_carries_speedup_intervals_and_the_not_significant_label():
    """The parent run's description says each speedup as the comparison does: its 95% interval in
    words, (n.s.) where the interval includes no difference, and the summary lines under the table."""
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord

    def run(run_id, device, batch_size, seconds):
        return RunRecord(
            run_id,
            run_id,
            {"batch_size": batch_size, "repeat": run_id[-1]},
            {"test_accuracy": 0.8},
            {"pipeline.device": device},
            histories={"epoch_duration_s": [9.0, *seconds]},
        )

    # Each run's steady epochs; the comparison takes one value per run (their median), 1% apart run to run.
    runs = [run(f"c{b}{r}", "cpu", b, [1.0 + 0.01 * r] * 2) for b in ("64", "128") for r in range(4)]
    runs += [run(f"g64{r}", "cuda:0", "64", [0.5 + 0.01 * r] * 2) for r in range(4)]
    runs += [run(f"g128{r}", "cuda:0", "128", [1.03 - 0.01 * r] * 2) for r in range(4)]
    note = view.parent_note(Answer(build(SweepRecord("p", "p", "1", "x", runs))), "p", "summary")
    (fast,) = [line for line in note.splitlines() if line.startswith("| cuda:0 | 64 |")]
    (same,) = [line for line in note.splitlines() if line.startswith("| cuda:0 | 128 |")]
    assert "| 4 |" in fast and re.search(r"1\.9\dx faster \\\[\d\.\d\d-\d\.\d\d\\\] \|", fast), fast
    assert "(n.s.)" in same and "(n.s.)" not in fast
    assert re.search(r"- batch\\_size=64: cuda:0 1\.9\dx faster \\\[", note), note
    # Nothing bracketed but our own links and images: showdown would turn "[0.66-1.72] (n.s.)" into one.
    bare = re.sub(r"!?\[[^\]]*\]\([^)]*\)", "", note.replace("\\[", "").replace("\\]", ""))
    assert "[" not in bare and "]" not in bare, bare


def test_markdown_text_shows_our_words_as_written():
    """Escaped as MLflow's markdown (showdown) reads them: no link, no italics, no tag; code spans kept."""
    assert (
        view.markdown_text("test_loss <= 0.3: 1.19x faster [0.66-1.72] (n.s.), `pipeline run a_b`")
        == "test\\_loss &lt;= 0.3: 1.19x faster \\[0.66-1.72\\] (n.s.), `pipeline run a_b`"
    )


def test_settings_that_share_a_label_get_names_of_their_own():
    """Rows on two kinds of hardware share a label ("cpu bs64"); the view folds runs by name, so each
    row's name says what tells it apart."""
    from pipeline.analysis.compare import build
    from pipeline.base.runs import RunRecord, SweepRecord

    runs = [
        RunRecord(
            f"{h}{b}",
            f"cpu bs{b}",
            {"batch_size": b},
            {"test_accuracy": 0.8},
            {"pipeline.device": "cpu", "pipeline.hardware": hardware},
            histories={"epoch_duration_s": [2.0, 1.0, 1.0]},
        )
        for h, hardware in (("a", "EPYC"), ("b", "Xeon"))
        for b in ("64", "128")
    ]
    names = view.setting_names(build(SweepRecord("p", "p", "1", "x", runs)))
    assert len(names) == len(set(names)) == 4 and {n.split(" hardware=")[1] for n in names} == {"EPYC", "Xeon"}
