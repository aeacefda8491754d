"""store: errors classified by type and code (never by message text), creates retried only with a
dedupe key, read commands that open a store without writing a byte of it, and URIs shown with
their passwords masked.

Real errors where they are cheap to make (a real sqlite lock, a refused connection, MLflow's own
refusal of a long name); real sqlite stores in tmp dirs."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import mlflow
import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import ErrorCode

from conftest import free_port
from pipeline.base.names import TAG_CREATE_TOKEN, TAG_RUN_KEY
from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.tracking import store


def locked_error(tmp_path: Path) -> sqlite3.OperationalError:
    """sqlite's own "database is locked" (SQLITE_BUSY): a writer meets another's exclusive lock."""
    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("create table t (x)")
    holder.execute("begin exclusive")
    try:
        sqlite3.connect(path, timeout=0).execute("insert into t values (1)")
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        holder.close()
    raise AssertionError("no lock error")


def as_mlflow_does(cause: BaseException, message: str = "Connection failed", code: str = "TEMPORARILY_UNAVAILABLE"):
    """The cause chained under an MlflowException, as MLflow's sqlalchemy store and REST client raise it."""
    try:
        raise MlflowException(message, error_code=ErrorCode.Value(code)) from cause
    except MlflowException as exc:
        return exc


def test_a_locked_sqlite_file_is_transient_and_named(tmp_path):
    error = as_mlflow_does(locked_error(tmp_path))
    assert store.sqlite_code(error) == sqlite3.SQLITE_BUSY
    assert store.is_transient(error) and store.short_cause(error) == "database is locked"


def test_a_full_disk_is_not_retried_and_says_so(tmp_path):
    """SQLITE_FULL comes as TEMPORARILY_UNAVAILABLE from MLflow (every OperationalError does): the
    sqlite code decides, and a full disk is retried by nobody."""
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode, full.sqlite_errorname = sqlite3.SQLITE_FULL, "SQLITE_FULL"
    error = as_mlflow_does(full)
    assert not store.is_transient(error) and store.is_no_room(error) and store.short_cause(error) == "disk full"
    unavailable = store.TrackingUnavailable.of(f"sqlite:///{tmp_path / 'mlflow.db'}", error)
    assert f"disk full at {tmp_path}" in str(unavailable)


def test_a_refused_connection_is_transient_by_its_type(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(MlflowException) as info:
        mlflow.MlflowClient(f"http://127.0.0.1:{free_port()}").search_experiments()
    assert store.is_transient(info.value) and store.short_cause(info.value) == "connection refused"


def test_a_too_long_experiment_name_is_the_users_error_not_http_500(tracking_uri):
    """MLflow's "exceeds the maximum length of 500 characters" once read as an HTTP 500 (text match):
    by its code it is INVALID_PARAMETER_VALUE, never retried, and one line naming the fix."""
    with pytest.raises(MlflowException) as info:
        mlflow.MlflowClient(tracking_uri).create_experiment("x" * 1000)
    assert not store.is_transient(info.value)
    assert store.short_cause(info.value) != "HTTP 500"
    error = store.user_error(info.value, "experiment")
    assert error is not None and "INVALID_PARAMETER_VALUE" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize(
    "code, retried",
    [
        ("TEMPORARILY_UNAVAILABLE", True),
        ("REQUEST_LIMIT_EXCEEDED", True),
        ("DEADLINE_EXCEEDED", True),
        ("INTERNAL_ERROR", False),
        ("INVALID_PARAMETER_VALUE", False),
        ("RESOURCE_DOES_NOT_EXIST", False),
    ],
)
def test_server_answers_are_retried_by_their_code_not_their_text(code, retried):
    """Each message holds a decoy: text must not decide."""
    error = MlflowException("Connection timed out 503 500 database is locked", error_code=ErrorCode.Value(code))
    assert error.error_code == code
    assert store.is_transient(error) is retried


def test_our_limit_is_within_mlflows(tracking_uri):
    """MLflow takes an experiment name as long as our limit (its own check allows more; its tables'
    columns, which PostgreSQL enforces, hold our limit), so every name we let through is stored."""
    from mlflow import MlflowClient
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH as mlflows

    from pipeline.base.names import MAX_NAME_LENGTH as ours

    assert ours <= mlflows
    client = MlflowClient(tracking_uri)
    assert client.get_experiment(client.create_experiment("x" * ours)).name == "x" * ours


class WritesThenTimesOut:
    """An MlflowClient whose first create_run writes the run, then loses the answer (a read timeout,
    chained under MLflow's exception as its REST client raises it): the case a blind retry duplicates."""

    def __init__(self, uri: str) -> None:
        self.client, self.calls = mlflow.MlflowClient(uri), 0
        self.tracking_uri = uri

    def create_run(self, *args, **kwargs):
        self.calls += 1
        run = self.client.create_run(*args, **kwargs)
        if self.calls == 1:
            raise as_mlflow_does(requests.exceptions.ReadTimeout("read timed out"), code="INTERNAL_ERROR")
        return run

    def create_experiment(self, *args, **kwargs):
        self.calls += 1
        experiment_id = self.client.create_experiment(*args, **kwargs)
        if self.calls == 1:
            raise as_mlflow_does(requests.exceptions.ReadTimeout("read timed out"), code="INTERNAL_ERROR")
        return experiment_id

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_create_run_retried_after_a_timeout_does_not_duplicate(tracking_uri):
    wrapped = WritesThenTimesOut(tracking_uri)
    experiment_id = mlflow.MlflowClient(tracking_uri).create_experiment("dedupe")
    run = store.Retrying(wrapped).create_run(experiment_id, run_name="p1", tags={TAG_RUN_KEY: "k"})
    runs = mlflow.MlflowClient(tracking_uri).search_runs([experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id] and wrapped.calls == 1
    assert run.data.tags[TAG_RUN_KEY] == "k" and len(run.data.tags[TAG_CREATE_TOKEN]) == 32


def test_a_create_experiment_retried_after_a_timeout_finds_it_by_name(tracking_uri):
    wrapped = WritesThenTimesOut(tracking_uri)
    experiment_id = store.Retrying(wrapped).create_experiment("made-once")
    assert mlflow.MlflowClient(tracking_uri).get_experiment_by_name("made-once").experiment_id == experiment_id
    assert wrapped.calls == 1


def test_another_create_is_tried_once(tracking_uri):
    """A create with no dedupe key (a model version) is never resent: the store is reported down."""

    class Down:
        tracking_uri, calls = "http://tracking", 0

        def create_model_version(self, *args, **kwargs):
            Down.calls += 1
            raise as_mlflow_does(requests.exceptions.ReadTimeout("read timed out"), code="INTERNAL_ERROR")

    with pytest.raises(store.TrackingUnavailable):
        store.Retrying(Down()).create_model_version("m", source="models:/m-1")
    assert Down.calls == 1


def checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_read_of_another_programs_database_writes_nothing(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("create table accounts (id integer primary key)")
    db.close()
    before = checksum(other)
    with pytest.raises(UserError, match="is not an MLflow store"):
        store.open_client(f"sqlite:///{other}", must_exist=True)
    assert checksum(other) == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_a_read_opens_a_store_without_a_lock_file(tracking_uri):
    path = store.sqlite_path(tracking_uri)
    before = checksum(path)
    assert store.open_client(tracking_uri, must_exist=True).search_experiments()
    assert checksum(path) == before and not path.with_name(path.name + ".lock").exists()


def test_a_read_of_a_store_at_another_schema_says_how_to_upgrade(tracking_uri):
    path = store.sqlite_path(tracking_uri)
    with sqlite3.connect(path) as db:
        db.execute("update alembic_version set version_num = '0a8213491aaa'")
    db.close()
    before = checksum(path)
    with pytest.raises(UserError, match="out-of-date database schema.*mlflow db upgrade"):  # MLflow's own check
        store.open_client(tracking_uri, must_exist=True)
    assert checksum(path) == before


def test_a_writer_refuses_an_old_foreign_database(tmp_path):
    import os

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("create table accounts (id integer primary key)")
    db.close()
    os.utime(other, (1_000_000_000, 1_000_000_000))  # not being created at this moment
    before = checksum(other)
    with pytest.raises(UserError, match="is not an MLflow store"):
        store.open_client(f"sqlite:///{other}")
    assert checksum(other) == before


# --- passwords masked ---------------------------------------------------------------------------------

PW = "Pa55-word"


@pytest.mark.parametrize(
    "uri, shown",
    [
        (f"http://alice:{PW}@127.0.0.1:5000", "http://alice:***@127.0.0.1:5000"),
        (f"https://alice:{PW}@mlflow.example.com/", "https://alice:***@mlflow.example.com/"),
        (f"postgresql://alice:{PW}@db:5432/mlflow", "postgresql://alice:***@db:5432/mlflow"),
        (f"postgresql+psycopg://alice:{PW}@db/mlflow", "postgresql+psycopg://alice:***@db/mlflow"),
        (f"mysql+pymysql://root:{PW}@db/mlflow?charset=utf8", "mysql+pymysql://root:***@db/mlflow?charset=utf8"),
        (
            f"mssql+pyodbc://sa:{PW}@db/mlflow?driver=ODBC+Driver+18",
            "mssql+pyodbc://sa:***@db/mlflow?driver=ODBC+Driver+18",
        ),
        (f"http://alice:{PW}@x@host:5000/", "http://alice:***@host:5000/"),  # an unescaped @ in the password
        ("postgresql://alice:Pa55%40word@db/mlflow", "postgresql://alice:***@db/mlflow"),  # an escaped one
        (
            f"postgresql://alice@db/mlflow?password={PW}&sslmode=require",
            "postgresql://alice@db/mlflow?password=***&sslmode=require",
        ),
        (
            f"postgresql://alice@db/mlflow?sslmode=require&sslpassword={PW}",
            "postgresql://alice@db/mlflow?sslmode=require&sslpassword=***",
        ),
        (f"https://host/path?token={PW}", "https://host/path?token=***"),
        (f"http:/alice:{PW}@host/x", "http:/alice:***@host/x"),  # a URI normalised as a path
    ],
)
def test_redact_masks_every_password(uri, shown):
    assert redact(uri) == shown
    assert PW not in redact(uri)


@pytest.mark.parametrize(
    "text",
    [
        "sqlite:////home/alice/mlflow.db",
        "http://127.0.0.1:5000",
        "postgresql://alice@db/mlflow",
        "models:/fashion@champion",
        "runs:/0123/model",
        "C:/Users/alice/mlflow.db",
        "a plain message: no URI",
    ],
)
def test_redact_leaves_what_holds_no_secret(text):
    assert redact(text) == text


def test_redact_masks_uris_inside_a_message_or_command():
    """An error or the printed UI command holds URIs among other words: each is masked, the rest kept."""
    text = (
        f"mlflow ui --backend-store-uri postgresql://alice:{PW}@db/mlflow --port 5000; "
        f"open http://bob:{PW}@host:5000/#/experiments"
    )
    assert redact(text) == (
        "mlflow ui --backend-store-uri postgresql://alice:***@db/mlflow --port 5000; "
        "open http://bob:***@host:5000/#/experiments"
    )


# --- process-wide settings: one path for the CLI, the API and Ray tasks, put back afterwards ---------


def test_process_settings_hold_for_the_block_and_are_put_back(monkeypatch):
    import logging
    import os

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")  # the user's value wins
    alembic = logging.getLogger("alembic")
    before = alembic.level
    with store.process_settings():
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
        assert os.environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] == "2.0"  # MLflow reads it per run
        assert alembic.level >= logging.WARNING
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL" not in os.environ
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
    assert alembic.level == before


def test_the_api_and_the_cli_leave_mlflows_process_state_as_they_found_it(tmp_path, data_dir, tracking_uri):
    """A notebook that calls pipeline.api.run, or a test that invokes the CLI in-process, finds
    MLflow's fluent target, the experiment variable and the retry settings as before the call."""
    import os

    from click.testing import CliRunner

    from pipeline import api
    from pipeline.cli import main

    grid = {
        "experiment": "state",
        "data": {"train_size": 200, "test_size": 100},
        "grid": {"batch_size": [100], "device": ["cpu"]},
    }
    before = (
        mlflow.is_tracking_uri_set(),
        os.environ.get("MLFLOW_EXPERIMENT_ID"),
        os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES"),
    )
    sweep = api.run(grid, tracking_uri=tracking_uri, data_dir=str(data_dir))
    assert sweep.exit_code == 0
    out = CliRunner().invoke(
        main,
        [
            "predict",
            "--model",
            f"runs:/{sweep.outcomes[0].run_id}/model",
            "--data-dir",
            str(data_dir),
            "--limit",
            "10",
            "--tracking-uri",
            tracking_uri,
        ],
    )
    assert out.exit_code == 0, out.output
    after = (
        mlflow.is_tracking_uri_set(),
        os.environ.get("MLFLOW_EXPERIMENT_ID"),
        os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES"),
    )
    assert after == before
