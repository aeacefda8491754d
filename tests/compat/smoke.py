"""The compatibility smoke: the installed pipeline, end to end, through its real CLI.

Run with the Python of the environment under test (`make compat` runs it in each throwaway venv):
a two-point sweep on small generated IDX files and a temporary sqlite store, a rerun that must
skip both FINISHED points, compare (and its charts), register, predict, a pyfunc load of the
registered model, and, where torchvision cannot be imported, `pipeline data --download`'s one-line
error. Each step checks its outcome (exit code, run statuses, the registered version, accuracies
that agree), not only that the command ran. Exits 1 at the first check that fails, naming it.

Standard library, numpy and mlflow only: nothing from the test suite, which needs pytest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the IDX files the suite makes too
from idx_files import SEEDS, make_idx, synthetic  # noqa: E402

EXPERIMENT = "compat-smoke"
MODEL = "compat-cnn"
GRID = f"""experiment: {EXPERIMENT}
repeats: 2
grid:
  lr: [0.01, 0.001]
  batch_size: [64]
  device: [cpu]
  epochs: [1]
"""
POINTS = 4  # 2 settings x 2 repeats: two runs a side, so the comparison's intervals (scipy) are computed
PINNED = (
    "torch",
    "torchvision",
    "mlflow",
    "mlflow-skinny",
    "sqlalchemy",
    "alembic",
    "numpy",
    "pandas",
    "scipy",
    "matplotlib",
    "click",
    "pyyaml",
    "rich",
    "psutil",
    "nvidia-ml-py",
    "cloudpickle",
)


class SmokeFailed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SmokeFailed(what)


class Cli:
    """`pipeline` of this environment, run in a scratch folder with none of the caller's MLflow settings."""

    def __init__(self, cwd: Path, store: str) -> None:
        self.exe = str(Path(sys.executable).with_name("pipeline"))
        self.cwd, self.store = cwd, store
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PIPELINE_"))}
        # The smoke checks versions, not the machine's load: no run counts as contended, so a busy
        # machine still has a best run to register and two runs a side for scipy's interval.
        self.env["PIPELINE_CONTENDED_SHARE"] = "1"

    def __call__(self, *args: str, expect: int = 0, store: bool = True) -> subprocess.CompletedProcess:
        command = [self.exe, *args, *(["--tracking-uri", self.store] if store else [])]
        started = time.monotonic()
        done = subprocess.run(command, cwd=self.cwd, env=self.env, capture_output=True, text=True)
        print(f"  pipeline {args[0]}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
        if done.returncode != expect:
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
            raise SmokeFailed(f"`pipeline {' '.join(args)}` exited {done.returncode}, expected {expect}")
        return done


def children(client, experiment_id: str) -> list:
    return client.search_runs([experiment_id], "tags.`mlflow.parentRunId` != ''", max_results=100)


def smoke(tmp: Path) -> None:
    import mlflow
    import mlflow.pyfunc

    logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines on every store opened here
    data = tmp / "data"
    make_idx(data)
    test_images, test_labels = synthetic(256, SEEDS["test"])  # make_idx's test split
    grid = tmp / "grid.yaml"
    grid.write_text(GRID)
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    cli = Cli(tmp, store)

    print("sweep")
    cli("run", str(grid), "--data-dir", str(data))
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    check(experiment is not None, f"the sweep made no experiment {EXPERIMENT!r}")
    runs = children(client, experiment.experiment_id)
    check(len(runs) == POINTS, f"{len(runs)} grid-point runs, expected {POINTS}")
    statuses = sorted(r.info.status for r in runs)
    check(statuses == ["FINISHED"] * POINTS, f"grid-point statuses {statuses}, expected all FINISHED")
    check(all("test_accuracy" in r.data.metrics for r in runs), "a FINISHED run has no test_accuracy")
    by_id = {r.info.run_id: r for r in runs}

    print("rerun (skips the FINISHED points)")
    rerun = cli("run", str(grid), "--data-dir", str(data))
    again = children(client, experiment.experiment_id)
    check(len(again) == POINTS, f"the rerun trained again: {len(again)} grid-point runs, expected {POINTS}")
    check("FINISHED" in rerun.stdout + rerun.stderr, "the rerun did not say it skipped FINISHED points")

    print("compare")
    rows = json.loads(cli("compare", "--experiment", EXPERIMENT, "--format", "json").stdout)
    listed = sorted(run_id for row in rows for run_id in row["run_ids"].split(","))
    check(listed == sorted(by_id), f"compare's {len(rows)} rows hold {len(listed)} runs, not the sweep's {POINTS}")
    versus = json.loads(cli("compare", "--experiment", EXPERIMENT, "--versus", "lr=0.01", "--format", "json").stdout)
    other = [row for row in versus if row["lr"] == 0.001]
    check(
        len(other) == 1 and other[0]["versus_speedup_low"] is not None,
        f"compare --versus lr=0.01 gave the lr 0.001 row no interval: {other}",
    )
    report = tmp / "report"
    cli("compare", "--experiment", EXPERIMENT, "--out", str(report))  # the charts: matplotlib
    charts = sorted(path.name for path in report.glob("*.png"))
    check(bool(charts), f"compare --out wrote no chart into {report}")
    check((report / "results.csv").is_file(), f"compare --out wrote no results.csv into {report}")

    print("register")
    cli("register", "--experiment", EXPERIMENT, "--name", MODEL)
    version = client.get_model_version_by_alias(MODEL, "champion")
    check(str(version.version) == "1", f"registered version {version.version}, expected 1")
    check(version.run_id in by_id, "the registered version is not from one of the sweep's runs")
    check(version.status == "READY", f"registered version status {version.status}, expected READY")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`pipeline.role` = 'sweep'")
    best = by_id[parent.data.tags["pipeline.best_run"]]
    check(version.run_id == best.info.run_id, "register did not pick the run the sweep's verdict names best")
    expected = best.data.metrics["test_accuracy"]

    print("predict")
    out = cli("predict", "--model", f"models:/{MODEL}@champion", "--data-dir", str(data)).stdout
    check("accuracy " in out, "predict printed no accuracy")
    accuracy = float(out.split("accuracy ")[1].split()[0])
    check(abs(accuracy - expected) < 1e-3, f"predict's accuracy {accuracy} is not the run's test_accuracy {expected}")

    print("pyfunc load")
    mlflow.set_tracking_uri(store)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    logits = np.asarray(model.predict(test_images[:, None].astype(np.float32) / 255))
    check(
        logits.shape == (len(test_labels), 10),
        f"pyfunc predicted shape {logits.shape}, expected ({len(test_labels)}, 10)",
    )
    pyfunc_accuracy = float((logits.argmax(axis=1) == test_labels).mean())
    check(
        abs(pyfunc_accuracy - expected) < 1e-3,
        f"pyfunc's accuracy {pyfunc_accuracy} is not the run's test_accuracy {expected}",
    )

    print("data --download where torchvision cannot be imported")
    importable = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True).returncode == 0
    if importable:
        print("  torchvision imports here: nothing to check")
    else:
        done = cli("data", "--download", expect=2, store=False)
        lines = done.stderr.strip().splitlines()
        check(
            len(lines) == 1 and "torchvision" in lines[0],
            f"`pipeline data --download` said {done.stderr.strip()!r}; expected one line about torchvision",
        )
        print(f"  {lines[0]}")


def main() -> int:
    versions = []
    for name in PINNED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{name} {metadata.version(name)}")
    print(f"compat smoke: Python {sys.version.split()[0]}; " + ", ".join(versions))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pipeline-compat-") as tmp:
        try:
            smoke(Path(tmp))
        except SmokeFailed as exc:
            print(f"compat smoke FAILED: {exc}", file=sys.stderr)
            return 1
    print(f"compat smoke passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
