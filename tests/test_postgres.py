"""The multi-machine store, for real: a throwaway PostgreSQL (Debian's `postgresql`: initdb in a temp
dir, on 127.0.0.1 and a free port, as the `postgres` user when the tests run as root) behind
`pipeline server`, and sweeps logging through it."""

from __future__ import annotations

import mlflow
import pytest

from conftest import PG_PASSWORD as PASSWORD, free_port, invoke, runs_of, service_output

psycopg = pytest.importorskip("psycopg", reason="the server extra is not installed (pip install -e '.[server]')")


def test_a_sweep_through_pipeline_server_lands_in_postgresql(pg_server, postgres, write_grid, data_dir):
    grid = write_grid("experiment: on-postgres\ngrid:\n  batch_size: [128, 256]\n  device: [cpu]\n")
    out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", pg_server["uri"])
    assert out.exit_code == 0, out.output
    runs = runs_of(pg_server["uri"], "on-postgres")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    # In the database itself, not only through the server's answers:
    with psycopg.connect(postgres["uri"]) as connection:
        rows = connection.execute("SELECT r.status, count(*) FROM runs r JOIN experiments e ON "
                                  "r.experiment_id = e.experiment_id WHERE e.name = 'on-postgres' "
                                  "GROUP BY r.status").fetchall()
    assert rows == [("FINISHED", 3)]
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    mlflow.set_tracking_uri(pg_server["uri"])  # reset after each test (conftest)
    model = mlflow.pytorch.load_model(f"runs:/{child.info.run_id}/model")  # through the server alone
    assert sum(p.numel() for p in model.parameters()) > 0
    assert PASSWORD not in service_output(pg_server["process"])


def test_wrong_credentials_are_one_line_and_exit_2_with_the_password_masked(postgres):
    uri = postgres["uri"].replace(PASSWORD, "not-the-password")
    out = invoke("server", "--backend-store-uri", uri, "--port", str(free_port()))
    assert out.exit_code == 2, out.output
    assert "cannot connect" in out.output and "password authentication failed" in out.output
    assert "not-the-password" not in out.output and "mlflow:***@127.0.0.1" in out.output
