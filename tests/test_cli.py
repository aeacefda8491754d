"""The real CLI through CliRunner and subprocesses: exit codes, messages, what lands in MLflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
import yaml
from click.testing import CliRunner

from catalogue import BAD_GRIDS
from conftest import REPO, invoke
from pipeline.cli import main

SMALL = "experiment: cli-test\ngrid:\n  batch_size: [128]\n  device: [cpu, cuda]\n  epochs: [1]\n"


@pytest.fixture
def cli():
    return invoke


def test_version_is_the_installed_distributions():
    """pyproject.toml reads the version from pipeline/__init__.py: `pipeline --version`, the package
    and what pip installed say the same."""
    from importlib.metadata import version

    import pipeline

    out = invoke("--version")
    assert out.exit_code == 0 and out.output.strip() == f"pipeline, version {pipeline.__version__}"
    assert version("pipeline") == pipeline.__version__


def test_validate_prints_the_expanded_grid(cli):
    result = cli("validate", str(REPO / "experiments" / "devices.yaml"))
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())
    assert "12 grid points" in words and "cpu bs20000 w1" in words


@pytest.mark.parametrize(
    "text, fragments", [(text, fragments) for _, text, fragments in BAD_GRIDS], ids=[name for name, _, _ in BAD_GRIDS]
)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_grid_exits_2_with_one_line_and_no_mlflow_state(cli, write_grid, tmp_path, text, fragments, command):
    result = cli(command, str(write_grid(text)))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert all(fragment in lines[0] for fragment in fragments), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def test_missing_grid_file(cli, tmp_path):
    result = cli("run", "nope.yaml")
    assert result.exit_code == 2 and result.output.startswith("error: nope.yaml: no such grid file")
    assert not (tmp_path / "mlflow.db").exists()


def test_missing_data_exits_2(cli, write_grid, tmp_path):
    result = cli("run", str(write_grid(SMALL)), "--data-dir", str(tmp_path / "nothing"))
    assert result.exit_code == 2 and "Fashion-MNIST not found" in result.output
    assert not (tmp_path / "mlflow.db").exists()


def test_unreachable_tracking_server_exits_2(cli, write_grid, data_dir):
    result = cli("run", str(write_grid(SMALL)), "--data-dir", str(data_dir), "--tracking-uri", "http://127.0.0.1:9")
    assert result.exit_code == 2 and "tracking server http://127.0.0.1:9 is unreachable" in result.output


def test_run_skips_missing_devices_and_prints_results(cli, write_grid, data_dir, tmp_path):
    import torch

    result = cli("run", str(write_grid(SMALL)), "--data-dir", str(data_dir))
    assert result.exit_code == 0, result.output
    assert "Results" in result.output and "FINISHED" in result.output
    assert "mlflow ui --backend-store-uri sqlite:///" in result.output and "/#/experiments/" in result.output
    if not torch.cuda.is_available():
        assert "skipped #2: cuda is not available" in result.output
    # The default store is ./mlflow.db.
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cli-test")
    statuses = sorted(r.info.status for r in client.search_runs([experiment.experiment_id]))
    assert statuses == ["FINISHED"] * (3 if torch.cuda.is_available() else 2)


def test_require_devices_exits_2(cli, write_grid, data_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = cli("run", str(write_grid(SMALL)), "--data-dir", str(data_dir), "--require-devices")
    assert result.exit_code == 2 and "--require-devices" in result.output
    assert not (tmp_path / "mlflow.db").exists()


def test_dry_run_trains_nothing(cli, write_grid, data_dir, tmp_path):
    result = cli("run", str(write_grid(SMALL)), "--data-dir", str(data_dir), "--dry-run")
    words = " ".join(result.output.split())  # as printed, whatever the console wrapped (long tmp paths)
    assert result.exit_code == 0 and "(dry run, nothing trained)" in words
    assert not (tmp_path / "mlflow.db").exists()
    if not torch.cuda.is_available():  # the cuda point's reason is printed once, under the table
        assert "(1) 1 point would be skipped: cuda is not available" in words


def test_a_dry_run_says_how_much_data_it_would_train_on(cli, write_grid, data_dir):
    """An override of the data's size shows in the plan, so a dry run confirms it took."""
    result = cli(
        "run", str(write_grid(SMALL)), "--data-dir", str(data_dir), "--dry-run", "--set", "data.train_size=300"
    )
    words = " ".join(result.output.split())
    assert result.exit_code == 0 and "(first 300 train, all test images)" in words, result.output


def test_train_one_run(cli, data_dir, tracking_uri):
    result = cli(
        "train",
        "--device",
        "cpu",
        "--batch-size",
        "128",
        "--epochs",
        "2",
        "--lr",
        "0.01",
        "--data-dir",
        str(data_dir),
        "--tracking-uri",
        tracking_uri,
        "--experiment",
        "single",
    )
    assert result.exit_code == 0, result.output
    client = mlflow.MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("single").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["epochs"] == "2"
    assert "mlflow.parentRunId" not in run.data.tags
    # Its table shows the settings given that are not the defaults, whole, at 80 columns (all the
    # keys cut every header to a letter and an ellipsis).
    header = next(line for line in result.output.splitlines() if "test acc" in line)
    assert "batch_size" in header and "device" in header and "…" not in header, result.output
    assert "shuffle" not in header, result.output


def test_train_rejects_bad_values(cli):
    result = CliRunner().invoke(main, ["train", "--batch-size", "0"])
    assert result.exit_code == 2 and "positive integer" in result.output
    result = CliRunner().invoke(main, ["train", "--device", "gpu"])
    assert result.exit_code == 2 and "cpu, cuda, cuda:N, mps or auto" in result.output
    for flag in ("--prefetch", "--data-on-device"):  # the grid file's rule, for one run's flags
        result = CliRunner().invoke(main, ["train", flag, "true", "--num-workers", "1"])
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert f"{flag} true" in result.output and "set --num-workers 0" in result.output


def test_devices_and_data_commands(cli, data_dir):
    result = cli("devices")
    assert result.exit_code == 0 and "cpu" in result.output and "torch.cuda.is_available()" in result.output
    result = cli("data", "--data-dir", str(data_dir))
    assert result.exit_code == 0 and "512 train / 256 test" in result.output


HEAVY = ("torch", "mlflow", "ray", "matplotlib", "pandas", "scipy")  # a tenth of a second to seconds each


def _exit_and_heavy(cwd: Path, args: list[str]) -> tuple[int, str]:
    """`pipeline ARGS` in a process of its own: its exit code, and which of HEAVY it had imported by then."""
    code = (
        "import sys\nfrom pipeline.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.rsplit("EXIT ", 1)[-1].split()[0]), out.stdout.rsplit("HEAVY ", 1)[-1].strip()


@pytest.mark.parametrize(
    "args",
    [["--help"], ["validate", str(REPO / "experiments" / "quickstart.yaml")], ["schema"], ["init", "experiments"]],
    ids=lambda args: args[0],
)
def test_quick_commands_import_no_heavy_library(tmp_path, args):
    """The commands a user runs first answer at once: none imports any of HEAVY (the package's modules
    that need one import it inside a function)."""
    code, heavy = _exit_and_heavy(tmp_path, args)
    assert code == 0
    assert heavy == "[]", f"pipeline {args[0]} imported {heavy}"


@pytest.mark.parametrize(
    "args", [["run", str(REPO / "experiments" / "quickstart.yaml")], ["train"]], ids=lambda args: args[0]
)
def test_a_store_that_cannot_be_used_fails_before_torch_and_pandas(tmp_path, args):
    """Bad input is one line at once: the store is checked before the sweep imports torch or pandas."""
    code, heavy = _exit_and_heavy(tmp_path, [*args, "--tracking-uri", f"sqlite:///{tmp_path}/missing/mlflow.db"])
    assert code == 2
    assert heavy == "[]", f"pipeline {args[0]} imported {heavy}"


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "pipeline", "--version"], capture_output=True, text=True, check=True)
    assert "pipeline, version" in out.stdout


# --- MLproject -------------------------------------------------------------------------------------


def _mlproject():
    return yaml.safe_load((REPO / "MLproject").read_text())


@pytest.mark.parametrize("entry, command", [("main", "run"), ("train", "train"), ("register", "register")])
def test_mlproject_parameters_are_cli_options(entry, command):
    spec = _mlproject()["entry_points"][entry]
    click_command = main.commands[command]
    options = {opt for p in click_command.params for opt in p.opts}
    arguments = {p.name for p in click_command.params if p.param_type_name == "argument"}
    for name in spec["parameters"]:
        flag = "--" + name.replace("_", "-")
        assert flag in options or name in arguments, f"MLproject {entry}.{name} is no option of `pipeline {command}`"
        assert "{" + name + "}" in spec["command"]
    if command in ("train", "register"):  # every option is declared
        declared = {"--" + n.replace("_", "-") for n in spec["parameters"]}
        assert {p.opts[0] for p in click_command.params if p.opts[0].startswith("--")} <= declared


def test_declared_ranges_end_at_the_newest_tested_release():
    """pyproject.toml admits the releases `make test` installs (constraints.txt's pins) and the floors
    `make compat` installs, and nothing past the newest tested minor release of torch, torchvision
    and MLflow. (tests/test_dependencies.py checks that everything else reads constraints.txt.)"""
    import tomllib

    from packaging.requirements import Requirement

    from test_dependencies import pins

    declared = {
        r.name: r.specifier
        for r in map(Requirement, tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    }
    newest = pins()
    for name, floor, untested in (
        ("torch", "2.13.0", "2.15.0"),
        ("torchvision", "0.28.0", "0.30.0"),
        ("mlflow", "3.9.0", "3.18.0"),
    ):
        assert declared[name].contains(newest[name]), (name, declared[name])
        assert declared[name].contains(floor), (name, declared[name])
        assert not declared[name].contains(untested), (name, declared[name])


@pytest.mark.slow
def test_mlflow_run_makes_the_project_run_the_parent(tmp_path, data_dir):
    grid = tmp_path / "e2e.yaml"
    grid.write_text("grid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    store = f"sqlite:///{tmp_path / 'e2e.db'}"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": store,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "run",
            str(REPO),
            "--env-manager",
            "local",
            "--experiment-name",
            "e2e",
            "-P",
            f"grid={grid}",
            "-P",
            f"data_dir={data_dir}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    client = mlflow.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 3
    project_run = parents[0]
    assert project_run.data.tags.get("mlflow.project.entryPoint") == "main"
    assert project_run.info.status == "FINISHED"
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == project_run.info.run_id]
    assert sorted(r.data.params["batch_size"] for r in kids) == ["128", "256"]
    assert all(r.info.status == "FINISHED" for r in kids)


@pytest.mark.slow
def test_mlflow_run_honours_the_experiment_parameter_of_each_entry_point(tmp_path, data_dir):
    """`mlflow run . -P experiment=foo`, with no --experiment-name (the project runs are in Default):
    the main and train entry points train into foo, and the register entry point registers foo's best."""
    store = f"sqlite:///{tmp_path / 'p.db'}"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": store,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    grid = tmp_path / "g.yaml"
    grid.write_text("grid:\n  batch_size: [128]\n  device: [cpu]\n")
    for entry, parameters in (
        ("main", [f"grid={grid}", f"data_dir={data_dir}"]),
        ("train", ["device=cpu", "epochs=1", f"data_dir={data_dir}"]),
        ("register", ["name=foo-cnn"]),
    ):
        command = [sys.executable, "-m", "mlflow", "run", str(REPO), "--env-manager", "local", "-e", entry]
        for parameter in [*parameters, "experiment=foo"]:
            command += ["-P", parameter]
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    client = mlflow.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("foo").experiment_id])
    assert sorted(r.data.tags.get("pipeline.role") for r in runs) == ["point", "single", "sweep"], runs
    project_runs = client.search_runs(["0"])
    assert {r.data.tags["mlflow.project.entryPoint"] for r in project_runs} == {"main", "train", "register"}
    version = client.get_model_version_by_alias("foo-cnn", "champion")
    assert version.run_id in {r.info.run_id for r in runs}


@pytest.mark.parametrize(
    "scheme, expected",
    [
        ("postgresql", "cannot connect (OperationalError"),  # psycopg (the server extra) finds nothing listening
        ("mysql", "no driver for it (No module named 'MySQLdb'); install its driver"),
    ],
)
def test_server_refuses_a_database_it_cannot_use_in_one_line(scheme, expected):
    """Before becoming mlflow server: exit 2, one line, the password masked, nothing started."""
    from conftest import free_port

    uri = f"{scheme}://mlflow:hunter2@127.0.0.1:{free_port()}/mlflow"
    out = CliRunner().invoke(main, ["server", "--backend-store-uri", uri, "--port", str(free_port())])
    assert out.exit_code == 2, out.output
    assert len(out.output.strip().splitlines()) == 1 and expected in out.output, out.output
    assert "hunter2" not in out.output and "mlflow:***@127.0.0.1" in out.output


def test_make_run_with_a_missing_grid_file_stops_before_mlflow_starts(tmp_path):
    """`make run GRID=typo.yaml` once left an experiment and a RUNNING project run behind: MLflow
    makes both before it checks the file. The Makefile checks it first, sets nothing up, starts nothing."""
    missing = tmp_path / "typo.yaml"
    done = subprocess.run(
        ["make", "-C", str(REPO), "run", f"GRID={missing}", "EXPERIMENT=typo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: GRID={missing}: no such grid file; pick one of experiments/*.yaml, "
        "e.g. make run GRID=experiments/quickstart.yaml"
    ], done.stderr
    assert "mlflow" not in done.stdout


@pytest.mark.parametrize("columns", ["0", "", "wide", "3", "20"])
def test_a_degenerate_terminal_width_still_prints_the_table(columns):
    """COLUMNS=0 (and other widths no terminal has) printed nothing at all, and COLUMNS=20 a table of
    blank cells: a width under MIN_COLUMNS is ignored."""
    from pipeline.cli import main

    grid = Path(__file__).parents[1] / "pipeline" / "examples" / "quickstart.yaml"
    out = CliRunner(env={"COLUMNS": columns, "TERM": "dumb"}).invoke(main, ["validate", str(grid)])
    assert out.exit_code == 0 and "4 grid points" in " ".join(out.output.split()), out.output
    assert "cpu bs100 w0" in out.output, out.output
