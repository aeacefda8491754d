"""pipeline.tracking.predict's checks before a model is loaded."""

from __future__ import annotations

import importlib.util

import pytest

from pipeline.errors import UserError
from pipeline.tracking.predict import REMOTE_CLIENTS, check_remote_client


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


@pytest.mark.parametrize("scheme", sorted(s for s, (module, _) in REMOTE_CLIENTS.items() if module != "pyarrow"))
def test_a_remote_model_without_its_library_names_the_package(scheme):
    module, package = REMOTE_CLIENTS[scheme]
    if _installed(module):
        pytest.skip(f"{module} is installed here")
    with pytest.raises(UserError) as caught:
        check_remote_client(f"{scheme}://bucket/models/fashion")
    assert str(caught.value).startswith(f"--model {scheme}://bucket/models/fashion: reading {scheme}:// needs ")
    assert package.split(" ")[0] in str(caught.value)


def test_hdfs_needs_a_hadoop_client_beside_pyarrow(monkeypatch):
    """pyarrow alone loads no HDFS: without libhdfs (HADOOP_HOME or ARROW_LIBHDFS_DIR) it is refused
    in one line instead of a page of JVM loader messages; with one, the load is left to MLflow."""
    if not _installed("pyarrow"):
        pytest.skip("pyarrow is not installed here")
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    monkeypatch.delenv("ARROW_LIBHDFS_DIR", raising=False)
    with pytest.raises(UserError, match=r"hdfs:// needs pyarrow .* with a Hadoop client"):
        check_remote_client("hdfs://namenode:8020/models/fashion")
    monkeypatch.setenv("HADOOP_HOME", "/opt/hadoop")
    check_remote_client("hdfs://namenode:8020/models/fashion")


@pytest.mark.parametrize(
    "uri",
    [
        "models:/fashion@champion",
        "runs:/0123/model",
        "/home/alice/model",
        "file:///home/alice/model",
        "http://host/model",
    ],
)
def test_models_read_without_a_storage_library_pass(uri):
    check_remote_client(uri)


def test_the_password_of_a_remote_model_uri_is_never_shown(monkeypatch):
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    monkeypatch.delenv("ARROW_LIBHDFS_DIR", raising=False)
    with pytest.raises(UserError) as caught:
        check_remote_client("hdfs://alice:Pa55word@namenode:8020/models/fashion")
    assert "Pa55word" not in str(caught.value) and "alice:***@namenode" in str(caught.value)
