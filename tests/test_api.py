"""pipeline.api: a grid from Python (a mapping or a file) runs as `pipeline run` runs it, and the
comparison comes back as a DataFrame; bad input raises UserError with the CLI's message."""

from __future__ import annotations

import pandas
import pytest

from conftest import invoke
from pipeline import api
from pipeline.base import names
from pipeline.errors import UserError


def _docs_block() -> str:
    """docs/getting-started.md's "From Python" block, as a reader would paste it."""
    import re

    from conftest import REPO

    section = (REPO / "docs" / "getting-started.md").read_text().split("## From Python", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    return block


def test_the_getting_started_block_runs_a_mapping_and_compares(tmp_path, data_dir, monkeypatch, _store_template):
    """The docs' example (a mapping grid, an override, the store in the working folder, the data
    found through $PIPELINE_DATA_DIR) trains, and its comparison is the DataFrame compare() gives."""
    import shutil

    import mlflow

    monkeypatch.setenv("PIPELINE_DATA_DIR", str(data_dir))
    shutil.copy(_store_template, tmp_path / "mlflow.db")  # migrated already: the block's store, seconds sooner
    scope: dict = {}
    exec(compile(_docs_block(), "getting-started.md", "exec"), scope)  # noqa: S102 - the docs' own example
    sweep, table = scope["sweep"], scope["sweep"].comparison
    assert sweep.exit_code == 0
    assert [o.status for o in sweep.outcomes] == ["FINISHED", "FINISHED"]
    assert {o.point.config.lr for o in sweep.outcomes} == {0.02}  # overrides=["lr=0.02"]
    assert sweep.parent_run_id and sweep.experiment_id and sweep.tracking_uri.endswith(f"{tmp_path}/mlflow.db")
    assert isinstance(table, pandas.DataFrame) and len(table) == 2
    assert {"batch_size", "device", "epoch_duration_s", "test_accuracy", "n"} <= set(table.columns)
    assert sorted(table["batch_size"]) == [100, 1000]
    pandas.testing.assert_frame_equal(scope["table"], table)
    assert not [p for p in tmp_path.rglob("*.yaml") if "mlruns" not in p.parts]  # no grid file written for it
    client = mlflow.MlflowClient(sweep.tracking_uri)
    assert client.get_run(sweep.parent_run_id).data.params["batch_size"] == "100,1000"
    assert {f.path for f in client.list_artifacts(sweep.parent_run_id, "grid")} == {names.ARTIFACT_EFFECTIVE_GRID}


def test_a_mapping_is_not_changed_by_overrides():
    from pipeline.settings.config import load_grid

    grid = {"grid": {"batch_size": [128, 256], "device": ["cpu"]}}
    spec = load_grid(grid, ["batch_size=64", "epochs=2"])
    assert dict(spec.axes)["batch_size"] == (64,)
    assert grid == {"grid": {"batch_size": [128, 256], "device": ["cpu"]}}


def test_a_file_grid_with_overrides_and_done_points(tracking_uri, data_dir, write_grid):
    grid = write_grid("experiment: filed\ngrid:\n  batch_size: [512]\n  device: [cpu]\n  epochs: [1]\n")
    first = api.run(grid, tracking_uri=tracking_uri, data_dir=str(data_dir), overrides=["batch_size=256"])
    assert [o.point.config.batch_size for o in first.outcomes] == [256]
    second = api.run(str(grid), tracking_uri=tracking_uri, data_dir=str(data_dir), overrides=["batch_size=256"])
    assert [o.status for o in second.outcomes] == ["DONE"]
    assert second.parent_run_id is None and second.comparison.empty
    assert len(api.compare(parent_run=first.parent_run_id, tracking_uri=tracking_uri)) == 1


@pytest.mark.parametrize(
    "grid, overrides",
    [
        ({"grid": {"batch_size": [0]}}, ()),
        ({"grid": {"bacth_size": [10]}}, ()),
        ({"grid": {"device": ["cpu"]}}, ("epochs=0",)),
    ],
)
def test_a_bad_grid_raises_the_message_the_cli_prints(grid, overrides, tracking_uri, data_dir, write_grid):
    import yaml

    with pytest.raises(UserError) as raised:
        api.run(grid, overrides=overrides, tracking_uri=tracking_uri, data_dir=str(data_dir))
    path = write_grid(yaml.safe_dump(grid))
    out = invoke(
        "run",
        str(path),
        *(a for item in overrides for a in ("--set", item)),
        "--tracking-uri",
        tracking_uri,
        "--data-dir",
        str(data_dir),
    )
    assert out.exit_code == 2
    message = str(raised.value)
    assert "\n" not in message
    # The same message after the source's name: the file's path, or "grid dict" for a mapping.
    assert message.removeprefix("grid dict: ") in out.output.replace(f"{path}: ", "")
    import mlflow

    assert [e.name for e in mlflow.MlflowClient(tracking_uri).search_experiments()] == ["Default"]


def test_numpy_values_run_and_log_as_python_values(tracking_uri, data_dir):
    """np.int64(256), np.float32(0.01), np.bool_ and a numpy repeats count run as 256, 0.01, true
    and 1: the params and the run name are those of the CLI's grid (np.int64 was refused)."""
    np = pytest.importorskip("numpy")
    import mlflow

    grid = {
        "grid": {
            "batch_size": [np.int64(256)],
            "lr": [np.float32(0.01)],
            "shuffle": np.bool_(False),
            "epochs": list(np.arange(1, 2)),
            "device": ["cpu"],
        }
    }
    sweep = api.run(grid, tracking_uri=tracking_uri, experiment="numpy", data_dir=str(data_dir), repeats=np.int64(1))
    assert [o.status for o in sweep.outcomes] == ["FINISHED"]
    (run,) = [
        r
        for r in mlflow.MlflowClient(tracking_uri).search_runs([sweep.experiment_id])
        if "mlflow.parentRunId" in r.data.tags
    ]
    assert {k: run.data.params[k] for k in ("batch_size", "lr", "shuffle", "epochs")} == {
        "batch_size": "256",
        "lr": "0.01",
        "shuffle": "false",
        "epochs": "1",
    }


def test_overrides_as_a_string_is_refused_before_the_store_is_touched(tracking_uri, data_dir):
    import mlflow

    expected = r"^overrides: got a string 'epochs=2'; pass a list, e\.g\. overrides=\['epochs=2'\]$"
    with pytest.raises(UserError, match=expected):
        api.run({"grid": {"device": ["cpu"]}}, overrides="epochs=2", tracking_uri=tracking_uri, data_dir=str(data_dir))
    assert [e.name for e in mlflow.MlflowClient(tracking_uri).search_experiments()] == ["Default"]
