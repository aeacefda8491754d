"""What a user meets around a sweep: dry runs, DONE points, registration, sorting, checkpoints,
hung servers, option mistakes and the words printed. Each case was a bug found as a new user."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time

import mlflow
import pytest
import torch

from conftest import children, free_port, invoke, runs_of
from pipeline.base import names
from pipeline.tracking import store

TWO = "experiment: two\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n  epochs: [2]\n"


def point_runs(uri: str, experiment: str):
    return children(runs_of(uri, experiment))


def test_dry_run_shows_the_points_a_run_would_skip_as_done(shared_sweep):
    before = len(mlflow.MlflowClient(shared_sweep.uri).search_runs(["1"]))
    out = invoke(*shared_sweep.run_args, "--dry-run")
    assert out.exit_code == 0, out.output
    assert out.output.count("DONE") == 2 and "2 of 2 already FINISHED here would be skipped" in out.output
    assert len(mlflow.MlflowClient(shared_sweep.uri).search_runs(["1"])) == before
    assert invoke(*shared_sweep.run_args, "--dry-run", "--rerun").output.count("DONE") == 0


def test_dry_run_on_a_new_store_creates_nothing(write_grid, data_dir, tmp_path):
    out = invoke("run", str(write_grid(TWO)), "--data-dir", str(data_dir), "--dry-run")
    assert out.exit_code == 0 and "DONE" not in out.output
    assert not (tmp_path / "mlflow.db").exists()


def test_done_rows_show_the_steady_state_epoch_time(sweep_copy):
    from pipeline.present.report import Reporter
    from pipeline.settings.config import load_grid
    from pipeline.sweep.runner import Options, run_grid

    spec = load_grid(sweep_copy.grid)
    result = run_grid(spec, Reporter(), Options(tracking_uri=sweep_copy.uri, data_dir=str(sweep_copy.data_dir)))
    client = mlflow.MlflowClient(sweep_copy.uri)
    for outcome in result.outcomes:
        assert outcome.status == "DONE"
        history = sorted(client.get_metric_history(outcome.run_id, "epoch_duration_s"), key=lambda m: m.step)
        assert len(history) == 2 and outcome.mean_epoch_s == pytest.approx(history[1].value)  # epoch 2 of 2


def _result_rows(output: str) -> dict[str, list[str]]:
    """The sweep-end Results table's rows, by their first cell (#): their cells, stripped."""
    table = output.split("Results", 1)[1]
    rows = [
        [cell.strip() for cell in line.strip("│").split("│")] for line in table.splitlines() if line.startswith("│")
    ]
    return {row[0]: row for row in rows}


def test_a_done_row_shows_the_figures_it_finished_with(write_grid, data_dir, tracking_uri):
    """A point run again is DONE, and its row in the Results table shows the steady-state summary it
    logged when it finished (test acc, epoch s, img/s: names.FINAL_ACCURACY, STEADY_EPOCH,
    STEADY_IMAGES), the figures printed then, never its last epoch's: here a last epoch made
    unmistakable (a second value logged for it, 9.999 s), which a row built from the run's latest
    metrics would show."""
    grid = write_grid("experiment: again\ngrid:\n  batch_size: [128]\n  device: [cpu]\n  epochs: [3]\n")
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    (run,) = point_runs(tracking_uri, "again")
    mlflow.MlflowClient(tracking_uri).log_metric(run.info.run_id, "epoch_duration_s", 9.999, step=3)
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    finished, done = _result_rows(first.output)["1"], _result_rows(again.output)["1"]
    assert (finished[-1], done[-1]) == ("FINISHED", "DONE")
    stored = run.data.metrics
    figures = [
        f"{stored[names.FINAL_ACCURACY]:.4f}",
        f"{stored[names.STEADY_EPOCH]:.3f}",
        f"{stored[names.STEADY_IMAGES]:,.0f}",
    ]
    assert finished[-4:-1] == figures and done[-4:-1] == figures, (finished, done)


def test_register_when_every_point_is_done_registers_the_best(sweep_copy):
    out = invoke(*sweep_copy.run_args, "--register", "fashion")
    assert out.exit_code == 0, out.output
    assert "registered fashion version 1" in out.output and "alias champion -> version 1" in out.output
    best = max(point_runs(sweep_copy.uri, "shared"), key=lambda r: r.data.metrics["test_accuracy"])
    version = mlflow.MlflowClient(sweep_copy.uri).get_model_version_by_alias("fashion", "champion")
    assert version.run_id == best.info.run_id


def test_compare_sorts_by_the_labels_it_shows(shared_sweep):
    uri = shared_sweep.uri
    rows = json.loads(invoke("compare", "--tracking-uri", uri, "--sort", "epoch_s", "--format", "json").stdout)
    assert [r["epoch_duration_s"] for r in rows] == sorted(r["epoch_duration_s"] for r in rows)
    out = invoke("compare", "--tracking-uri", uri, "--sort", "test acc", "--format", "json")
    rows = json.loads(out.stdout)
    assert [r["test_accuracy"] for r in rows] == sorted((r["test_accuracy"] for r in rows), reverse=True)


def test_a_finished_point_removes_its_checkpoint_and_rerun_never_resumes(write_grid, data_dir, tracking_uri):
    """A stale checkpoint (an interrupted --checkpoint run) must not be continued by --rerun, and a
    point that finishes removes it whatever the flags."""
    from pipeline.settings.config import load_grid
    from pipeline.settings.grid import expand
    from pipeline.sweep.runner import run_key
    from pipeline.tracking.store import local_state_dir
    from pipeline.training.data import load
    from pipeline.training.device import hardware_name
    from pipeline.training.train import Hooks, fit

    grid = write_grid("experiment: stale\ngrid:\n  batch_size: [128]\n  device: [cpu]\n  epochs: [2]\n")
    config = expand(load_grid(grid))[0].config
    dataset = load(data_dir)
    key = run_key(config, dataset.identity, hardware_name(torch.device("cpu")))
    path = local_state_dir(tracking_uri) / names.CHECKPOINT_DIR / f"{key}.pt"

    class Keep(Hooks):
        checkpointing = True

        def save_state(self, state):
            if state["epoch"] == 1:
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({**state, "run_id": "stale"}, path)

    fit(config, dataset, torch.device("cpu"), Keep())
    assert path.exists()
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri]
    out = invoke(*args, "--rerun", "--checkpoint")
    assert out.exit_code == 0 and "resuming" not in out.output, out.output
    (run,) = point_runs(tracking_uri, "stale")
    assert names.TAG_RESUMED_FROM not in run.data.tags
    history = mlflow.MlflowClient(tracking_uri).get_metric_history(run.info.run_id, "epoch_duration_s")
    assert [m.step for m in history] == [1, 2]
    assert not path.exists()

    fit(config, dataset, torch.device("cpu"), Keep())  # stale again; this time finish without --checkpoint
    assert invoke(*args, "--rerun").exit_code == 0
    assert not path.exists()


def test_a_server_that_accepts_but_never_answers_is_refused_in_seconds(write_grid, data_dir):
    with socket.socket() as listener:  # the kernel completes connections; nobody ever reads them
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        out = invoke("run", str(write_grid(TWO)), "--data-dir", str(data_dir), "--tracking-uri", uri)
        elapsed = time.monotonic() - started
    assert out.exit_code == 2
    assert out.output.strip() == (
        f"error: tracking server {uri} accepted the connection but did not answer within "
        "3 s; check that it is healthy, or start it (e.g. `pipeline server --port 5000`) "
        "or pass another --tracking-uri"
    )
    assert elapsed < 30  # it was 65 s when only the TCP connect was checked


def _self_signed(folder):
    """A certificate for 127.0.0.1 signed by its own key, as a team's private server might have."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # asked for, with INSECURE_TLS
def test_a_https_server_with_its_own_certificate_is_reached_with_mlflows_tls_settings(
    write_grid, data_dir, tmp_path, monkeypatch, _store_template
):
    """A real `mlflow server` on HTTPS with a self-signed certificate: without MLflow's TLS variables
    the start-up check says how to trust it (exit 2, nothing created); with the certificate in
    MLFLOW_TRACKING_SERVER_CERT_PATH, or with MLFLOW_TRACKING_INSECURE_TLS=true, the check lets the
    sweep through as MLflow's own client would (it used to call such a server unreachable)."""
    from conftest import free_port, start_service, stop_service, wait_for

    cert, key = _self_signed(tmp_path)
    shutil.copy(_store_template, tmp_path / "tls.db")  # migrated already: the server starts in seconds
    port = free_port()
    server = start_service(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'tls.db'}",
            "--workers",
            "1",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--uvicorn-opts",
            f"--ssl-keyfile {key} --ssl-certfile {cert}",
        ],
        cwd=tmp_path,
    )
    uri = f"https://127.0.0.1:{port}"
    try:
        wait_for(f"{uri}/health", server, seconds=120, cafile=cert)
        args = [
            "run",
            str(write_grid("experiment: tls\ngrid:\n  device: [cpu]\n  epochs: [1]\n")),
            "--data-dir",
            str(data_dir),
            "--tracking-uri",
            uri,
        ]
        out = invoke(*args)
        assert out.exit_code == 2, out.output
        assert out.output.startswith(f"error: tracking server {uri}: TLS failed ([SSL: CERTIFICATE_VERIFY_FAILED]")
        assert out.output.strip().endswith(
            "set MLFLOW_TRACKING_SERVER_CERT_PATH to the CA bundle that signed its "
            "certificate, or MLFLOW_TRACKING_INSECURE_TLS=true"
        )
        monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
        store.check_reachable(uri)  # no error
        monkeypatch.delenv("MLFLOW_TRACKING_INSECURE_TLS")
        monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert))
        out = invoke(*args)
        assert out.exit_code == 0, out.output
        runs = runs_of(uri, "tls")
        assert [r.info.status for r in children(runs)] == ["FINISHED"] and len(runs) == 2  # the sweep and its point
    finally:
        stop_service(server)


def test_ray_address_without_the_ray_executor_is_an_error(write_grid, data_dir, tmp_path):
    out = invoke("run", str(write_grid(TWO)), "--data-dir", str(data_dir), "--ray-address", "auto")
    assert out.exit_code == 2
    assert out.output.strip() == "error: --ray-address auto needs --executor ray; add it, or drop --ray-address"
    assert not (tmp_path / "mlflow.db").exists()


def test_one_point_is_one_grid_point(write_grid):
    out = invoke("validate", str(write_grid("grid:\n  device: [cpu]\n")))
    words = " ".join(out.output.split())  # a long tmp path can wrap the title
    assert "1 grid point" in words and "1 grid points" not in words


def test_servers_start_few_processes_and_no_deprecation_noise(monkeypatch, tmp_path, _store_template):
    """`pipeline server` and `pipeline ui` run MLflow's server: check what they start."""
    import subprocess

    calls = []

    def fake_popen(argv, env):
        calls.append((argv, env))
        raise SystemExit(0)

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    port = str(free_port())  # checked before the server starts: not one another test holds
    invoke(
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 's.db'}",
        "--allowed-hosts",
        "head,head:5000",
        "--port",
        port,
    )
    shutil.copy(_store_template, tmp_path / "u.db")  # `ui` opens only an MLflow store
    invoke("ui", "--tracking-uri", f"sqlite:///{tmp_path / 'u.db'}", "--port", port)
    (server_argv, server_env), (ui_argv, ui_env) = calls
    assert server_argv[:3] == [sys.executable, "-m", "mlflow"] and server_argv[3] == "server"
    assert server_argv[server_argv.index("--workers") + 1] == str(min(4, os.cpu_count() or 1))
    assert server_argv[server_argv.index("--allowed-hosts") + 1] == "head,head:5000"  # else 0.0.0.0 answers 403
    assert ui_argv[3] == "ui" and ui_argv[ui_argv.index("--workers") + 1] == "1"
    for env in (server_env, ui_env):
        assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
        assert "ignore::DeprecationWarning" in env["PYTHONWARNINGS"]
