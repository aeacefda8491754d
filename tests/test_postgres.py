"""The shared tracking server, for real: a throwaway PostgreSQL (Debian's `postgresql`: initdb in a
temp dir, on 127.0.0.1 and a free port, as the `postgres` user when the tests run as root) behind
`pipeline server --auth`. Logins, sweeps through it, and eight sweeps at once with PostgreSQL
restarted under them. (The server itself restarted under a sweep is tests/test_outage.py, on the same
database.)"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pytest

from conftest import (
    ADMIN_PASSWORD,
    PG_PASSWORD,
    children,
    free_port,
    invoke,
    make_idx,
    read_until,
    runs_of,
    service_output,
    start_pipeline,
)

psycopg = pytest.importorskip("psycopg", reason="the server extra is not installed (pip install -e '.[server]')")


def _status(url: str, data: dict | None = None) -> int:
    body = json.dumps(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _files_under(folder) -> str:
    return "".join(p.read_bytes().decode(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_a_sweep_with_credentials_lands_in_postgresql(pg, postgres, write_grid, data_dir, tmp_path):
    grid = write_grid("experiment: on-postgres\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", pg["uri"])
    assert out.exit_code == 0, out.output
    runs = runs_of(pg["uri"], "on-postgres")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    # In the database itself, not only through the server's answers:
    with psycopg.connect(postgres["uri"]) as connection:
        rows = connection.execute(
            "SELECT r.status, count(*) FROM runs r JOIN experiments e ON "
            "r.experiment_id = e.experiment_id WHERE e.name = 'on-postgres' "
            "GROUP BY r.status"
        ).fetchall()
    assert rows == [("FINISHED", 3)]
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    mlflow.set_tracking_uri(pg["uri"])  # reset after each test (conftest)
    model = mlflow.pytorch.load_model(f"runs:/{child.info.run_id}/model")  # through the server alone
    assert sum(p.numel() for p in model.parameters()) > 0
    # No password anywhere: output, params, tags, artifacts, local files, the server's log.
    artifacts = tmp_path / "artifacts"
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, dst_path=str(artifacts / "parent"))
    model_id = child.outputs.model_outputs[0].model_id
    mlflow.artifacts.download_artifacts(f"models:/{model_id}", dst_path=str(artifacts / "model"))
    assert (artifacts / "model" / "MLmodel").exists() and any((artifacts / "parent").rglob("*.png"))
    recorded = [
        out.output,
        service_output(pg["process"]),
        _files_under(tmp_path),
        *(json.dumps([r.data.params, r.data.tags]) for r in runs),
    ]
    for secret in (ADMIN_PASSWORD, PG_PASSWORD):
        assert not [text[:200] for text in recorded if secret in text], secret


def test_nobody_gets_in_without_a_login(pg_server, write_grid, data_dir, monkeypatch, tmp_path):
    api = f"{pg_server['uri']}/api/2.0/mlflow"
    assert _status(f"{api}/experiments/search?max_results=5") == 401  # reading
    assert _status(f"{api}/experiments/create", {"name": "intruder"}) == 401  # writing
    assert _status(f"{pg_server['uri']}/health") == 200  # the health check stays open

    grid = write_grid("experiment: locked-out\ngrid:\n  batch_size: [128]\n  device: [cpu]\n")
    args = ("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", pg_server["uri"])
    out = invoke(*args)
    assert out.exit_code == 2 and out.output.count("\n") == 1, out.output
    assert "requires a login (HTTP 401)" in out.output and "MLFLOW_TRACKING_USERNAME" in out.output
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-admin-password")
    out = invoke(*args)
    assert out.exit_code == 2 and out.output.count("\n") == 1, out.output
    assert "refused the password of user 'admin'" in out.output and "not-the-admin-password" not in out.output
    assert list(tmp_path.iterdir()) == [grid]  # no local store, no results file
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    assert runs_of(pg_server["uri"], "locked-out") == [] and runs_of(pg_server["uri"], "intruder") == []


def test_the_admin_password_never_reaches_a_command_line(monkeypatch, tmp_path):
    """`pipeline server --auth` (in this process, its last step caught): the admin password goes to
    MLflow's app through its environment; the command it would become holds neither that password
    nor the store's URI, and a non-loopback --host is warned about (clear-text passwords with auth,
    open doors without). The real server creating the admin from it: pg_server's tests."""
    import pipeline.tracking.server

    became = []

    def run_mlflow(args, host, port, env):
        """What the server would run, and its auth configuration as written while it runs."""
        config = env.get("MLFLOW_AUTH_CONFIG_PATH")
        became.append((args, env, Path(config).read_text() if config else ""))
        return 0

    monkeypatch.setattr(pipeline.tracking.server, "run_mlflow", run_mlflow)
    monkeypatch.delenv("MLFLOW_AUTH_CONFIG_PATH", raising=False)  # restored after the test
    store = f"sqlite:///{tmp_path / 'store.db'}"
    out = invoke("server", "--auth", "--backend-store-uri", store, "--host", "0.0.0.0")
    assert out.exit_code == 2 and "the admin user 'admin' does not exist yet" in out.output, out.output
    assert not (tmp_path / "basic_auth.db").exists()  # nothing made before the refusal
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", "short")
    assert "MLflow needs 12 or more" in invoke("server", "--auth", "--backend-store-uri", store).output
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", ADMIN_PASSWORD)
    out = invoke("server", "--auth", "--backend-store-uri", store, "--host", "0.0.0.0", "--port", "5055")
    assert out.exit_code == 0, out.output
    assert "in clear text" in out.output and "login required" in out.output
    ((args, env, config),) = became
    assert "--app-name" in args and "basic-auth" in args and store not in " ".join(args)
    assert env["MLFLOW_BACKEND_STORE_URI"] == store and env["MLFLOW_FLASK_SERVER_SECRET_KEY"]
    assert ADMIN_PASSWORD not in json.dumps(args) and env["MLFLOW_AUTH_ADMIN_PASSWORD"] == ADMIN_PASSWORD
    # the users' database sits beside the store
    assert f"sqlite:///{tmp_path / 'basic_auth.db'}" in config and ADMIN_PASSWORD not in config
    assert not Path(env["MLFLOW_AUTH_CONFIG_PATH"]).parent.exists()  # gone with the server
    out = invoke("server", "--backend-store-uri", store, "--host", "0.0.0.0")
    assert "no authentication: see --auth" in out.output
    out = invoke("server", "--admin-password-file", str(tmp_path / "nowhere"))
    assert out.exit_code == 2 and "add --auth" in out.output


@pytest.mark.slow
def test_eight_sweeps_at_once_through_a_postgresql_restart(pg, postgres, write_grid, tmp_path):
    """Eight `pipeline run` processes started together from one folder, 4 points each, into one
    experiment they race to create; PostgreSQL is restarted under them (a fast shutdown, which drops
    every connection of the server's pool). The sweeps ride through on retries, or keep what they
    could not log in the results file for `pipeline relog`: in the end every point lands once, all
    FINISHED, none RUNNING."""
    data = make_idx(tmp_path / "data", n_train=96, n_test=32)
    sweeps = []
    start = time.monotonic()
    for k in range(8):
        grid = write_grid(
            f"experiment: crowd\ngrid:\n  batch_size: [16, 32]\n  lr: [0.01, 0.02]\n  seed: [{k}]\n  device: [cpu]\n",
            f"sweep{k}.yaml",
        )
        sweeps.append(start_pipeline(["run", str(grid), "--data-dir", str(data), "--tracking-uri", pg["uri"]]))
    early = read_until(sweeps[0], "run 2/4", seconds=300)  # the sweeps are logging runs
    postgres["restart"]()
    outputs = [sweep.communicate(timeout=420)[0] for sweep in sweeps]
    outputs[0] = early + outputs[0]
    seconds = time.monotonic() - start
    codes = [s.returncode for s in sweeps]
    assert set(codes) <= {0, 1}, outputs
    if 1 in codes:  # a sweep that outlasted its retries says so, and relog finishes its work
        silent = [o for o, c in zip(outputs, codes) if c == 1 and "pipeline relog" not in o]
        assert not silent, silent
        out = invoke("relog")
        assert out.exit_code == 0, out.output
    runs = runs_of(pg["uri"], "crowd")
    points = children(runs)
    assert len(runs) == 8 + 32 and {r.info.status for r in points} == {"FINISHED"}, outputs
    assert "RUNNING" not in {r.info.status for r in runs}
    assert len({r.data.tags["pipeline.run_key"] for r in points}) == 32  # no point twice
    assert len({r.data.tags["mlflow.parentRunId"] for r in points}) == 8
    print(
        f"8 sweeps x 4 points at once, PostgreSQL restarted: {seconds:.0f} s, exit codes {codes}, "
        f"{len(points)} runs, 0 lost"
    )


def test_wrong_database_credentials_are_one_line_and_exit_2_with_the_password_masked(postgres):
    uri = postgres["uri"].replace(PG_PASSWORD, "not-the-password")
    out = invoke("server", "--backend-store-uri", uri, "--port", str(free_port()))
    assert out.exit_code == 2, out.output
    assert "cannot connect" in out.output and "password authentication failed" in out.output
    assert "not-the-password" not in out.output and "mlflow:***@127.0.0.1" in out.output


def test_the_results_file_holds_no_database_password_and_relog_takes_it_from_pgpassword(
    postgres, write_grid, tmp_path, monkeypatch
):
    """A sweep straight into PostgreSQL with the password in its URI: the results file beside it
    holds the URI with the password masked (the screen, tags and params already did). relog of a
    line that waits reaches the store without it, through PGPASSWORD, as libpq does."""
    data = make_idx(tmp_path / "data", n_train=96, n_test=32)
    grid = write_grid("experiment: masked\ngrid:\n  batch_size: [32]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data), "--tracking-uri", postgres["uri"])
    assert out.exit_code == 0, out.output
    results = Path("pipeline-results.jsonl")  # a database store's results file is in the working folder
    assert PG_PASSWORD not in results.read_text()
    (line,) = [json.loads(text) for text in results.read_text().splitlines()]
    assert line["tracking_uri"] == postgres["uri"].replace(PG_PASSWORD, "***")

    line["logged"] = False  # as a line the store could not take is kept
    results.write_text(json.dumps(line) + "\n")
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    relogged = invoke("relog")
    assert relogged.exit_code == 0 and "logged 1 run(s)" in relogged.output, relogged.output
    assert PG_PASSWORD not in results.read_text() and json.loads(results.read_text())["logged"]
