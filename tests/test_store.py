"""pipeline.store's pure helpers (the stores themselves are exercised through the commands)."""

from __future__ import annotations

import pytest

from pipeline.store import redact

PW = "Pa55-word"


@pytest.mark.parametrize("uri, shown", [
    (f"http://alice:{PW}@127.0.0.1:5000", "http://alice:***@127.0.0.1:5000"),
    (f"https://alice:{PW}@mlflow.example.com/", "https://alice:***@mlflow.example.com/"),
    (f"postgresql://alice:{PW}@db:5432/mlflow", "postgresql://alice:***@db:5432/mlflow"),
    (f"postgresql+psycopg://alice:{PW}@db/mlflow", "postgresql+psycopg://alice:***@db/mlflow"),
    (f"mysql+pymysql://root:{PW}@db/mlflow?charset=utf8", "mysql+pymysql://root:***@db/mlflow?charset=utf8"),
    (f"mssql+pyodbc://sa:{PW}@db/mlflow?driver=ODBC+Driver+18", "mssql+pyodbc://sa:***@db/mlflow?driver=ODBC+Driver+18"),
    (f"http://alice:{PW}@x@host:5000/", "http://alice:***@host:5000/"),  # an unescaped @ in the password
    ("postgresql://alice:Pa55%40word@db/mlflow", "postgresql://alice:***@db/mlflow"),  # an escaped one
    (f"postgresql://alice@db/mlflow?password={PW}&sslmode=require",
     "postgresql://alice@db/mlflow?password=***&sslmode=require"),
    (f"postgresql://alice@db/mlflow?sslmode=require&sslpassword={PW}",
     "postgresql://alice@db/mlflow?sslmode=require&sslpassword=***"),
    (f"https://host/path?token={PW}", "https://host/path?token=***"),
    (f"http:/alice:{PW}@host/x", "http:/alice:***@host/x"),  # a URI normalised as a path
])
def test_redact_masks_every_password(uri, shown):
    assert redact(uri) == shown
    assert PW not in redact(uri)


@pytest.mark.parametrize("text", [
    "sqlite:////home/alice/mlflow.db", "http://127.0.0.1:5000", "postgresql://alice@db/mlflow",
    "models:/fashion@champion", "runs:/0123/model", "C:/Users/alice/mlflow.db", "a plain message: no URI",
])
def test_redact_leaves_what_holds_no_secret(text):
    assert redact(text) == text


def test_redact_masks_uris_inside_a_message_or_command():
    """An error or the printed UI command holds URIs among other words: each is masked, the rest kept."""
    text = (f"mlflow ui --backend-store-uri postgresql://alice:{PW}@db/mlflow --port 5000; "
            f"open http://bob:{PW}@host:5000/#/experiments")
    assert redact(text) == ("mlflow ui --backend-store-uri postgresql://alice:***@db/mlflow --port 5000; "
                            "open http://bob:***@host:5000/#/experiments")
