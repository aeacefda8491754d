"""Addresses as the package prints them: URIs with their secrets masked (`redact`), and the MLflow
UI's runs page that every printed link starts from (`RUNS_PAGE`). Pure text: the tracking layer
uses them for what it logs and tags, the presentation layer for what it prints and renders.
"""

from __future__ import annotations

import re

# The MLflow UI's runs page of an experiment, in Model training mode, relative to the UI's address.
RUNS_PAGE = "#/experiments/{experiment_id}/runs?workflowType=machine_learning"

# user:PASSWORD@ after any scheme (http, postgresql+psycopg, mysql, mssql+pyodbc, ...); the password may
# hold an unescaped "@" (urllib reads the last "@" before the path as the end of it, and so does this). One
# slash is enough: a URI given where a path was expected comes back normalised (http:/user:PW@host/x).
_URI_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*:/+[^\s:/?#@]*:)[^\s/?#]*(?=@)")
# ...and secrets passed as query parameters (?password=..., &sslpassword=..., ;token=...).
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&;](?:[A-Za-z_]*password|passwd|pwd|pass|[A-Za-z_]*token|secret|"
    r"client_secret|api_?key|access_?key|secret_?key|sig|signature)=)[^\s&;#'\"]*",
    re.IGNORECASE,
)


def without_password(uri: str) -> str:
    """A URI `redact` masked, made usable again without its secret: user:***@ becomes user@ (a
    database's client then takes the password from its own place: PGPASSWORD or ~/.pgpass for
    PostgreSQL) and a masked query parameter is left out."""
    uri = re.sub(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*:/+[^\s:/?#@]*):\*\*\*(?=@)", r"\g<head>", uri)
    uri = re.sub(r"[?&;][^=&;#]+=\*\*\*(?=[&;#]|$)", "", uri)
    return uri if "?" in uri or "&" not in uri else uri.replace("&", "?", 1)


def redact(text: str) -> str:
    """`text` (a URI, or a message or command holding URIs) with every password and secret query value
    replaced by ***, for anything printed, logged or tagged. The user name and host stay: they say
    which store is meant."""
    text = _URI_PASSWORD.sub(r"\g<head>***", text)
    return _QUERY_SECRET.sub(r"\g<head>***", text)
