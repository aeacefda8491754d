"""Tracking stores: which URI, whether it answers, opening a client that retries, and where local files go.

Two things here change process-wide state, each for a block only and put back after it:
`process_settings` (MLflow's HTTP retries and loggers, for a command, an API call or a Ray task)
and `fluent_target` (MLflow's fluent API aimed at one store, for the one call that has no client
form: logging a model, sampling system metrics, registering, loading a model).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sqlite3
import sys
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock

from pipeline.base.files import probe
from pipeline.base.interrupts import critical
from pipeline.base.names import TAG_CREATE_TOKEN, TAG_ERROR
from pipeline.base.uris import RUNS_PAGE, redact
from pipeline.errors import UserError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # MLflow's own default since 3.7
ANSWER_TIMEOUT_S = 3.0

# MLflow's own HTTP retries (7, backoff 2, 120 s timeout) take minutes to give up: 2 quick ones are
# kept under ours, because MLflow's fluent calls (logging a model) have no other retry and a database
# restart behind a server outlasts ours alone. They resend any request after a lost answer, creates
# too; our own retries (Retrying) repeat a create only after looking up its dedupe key.
_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
# MLflow prints "View run ... / View experiment ..." to stdout after every run against a server;
# the sweep prints one link at the end instead.
_QUIET = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
# System metrics (--system-metrics) every 2 s: MLflow's default is 10 s, and most runs here are shorter.
SYSTEM_METRICS_INTERVAL_S = 2.0
_SAMPLING = {"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": str(SYSTEM_METRICS_INTERVAL_S)}


class TrackingUnavailable(RuntimeError):
    """The tracking store stopped answering (after retries) in the middle of a sweep, or (`artifacts`)
    the location of a run's artifacts refused a file."""

    artifacts = False

    @classmethod
    def of(cls, uri: str, exc: BaseException) -> TrackingUnavailable:
        if is_no_room(exc):  # the store cannot take another write: the sweep stops as for an outage
            where = sqlite_path(uri)
            return cls(
                f"{redact(uri)} could not write: disk full at "
                f"{where.resolve().parent if where is not None else 'the server'}"
            )
        return cls(f"{redact(uri)} stopped answering ({short_cause(exc)})")

    @classmethod
    def of_artifacts(cls, location: str, exc: BaseException) -> TrackingUnavailable:
        """A file of the run's artifacts (its model, on its way to `location`) was refused, by the
        artifact location's disk or the temporary folder MLflow writes it through first: full, or
        not writable. Names the file's folder where the error does."""
        refused = os_error(exc)
        path = (refused.filename2 or refused.filename) if refused is not None else None
        where = os.path.dirname(os.fsdecode(path)) if path else redact(location)
        why = "disk full" if is_no_room(exc) else os.strerror(os_errno(exc) or errno.EIO)
        refusal = cls(f"the run's artifacts (going to {redact(location)}) could not be written to {where}: {why}")
        refusal.artifacts = True
        return refusal


def short_cause(exc: BaseException) -> str:
    """The gist of a network or database error, by its type and code, not urllib3's whole retry story."""
    import requests

    code = sqlite_code(exc)
    if code is not None and code in _SQLITE_CAUSES:
        return _SQLITE_CAUSES[code]
    number = os_errno(exc)
    if number in NO_ROOM_ERRNOS:
        return "disk full"
    if number == errno.ECONNREFUSED or _in_chain(exc, ConnectionRefusedError):
        return "connection refused"
    if number == errno.ECONNRESET or _in_chain(exc, ConnectionResetError):
        return "connection reset"
    if _in_chain(exc, requests.exceptions.Timeout, TimeoutError):
        return "timed out"
    if _in_chain(exc, requests.exceptions.RetryError):
        return "a server error status after MLflow's own retries"
    if _in_chain(exc, requests.exceptions.ConnectionError, ConnectionError):
        return "no connection"
    status = http_status(exc)
    if status is not None and status != 500:
        return f"HTTP {status}"
    return first_line(exc)[:120]


# sqlite's primary result codes (https://sqlite.org/rescode.html): sqlite3.Error.sqlite_errorcode is
# the extended code, whose low byte is the primary one.
_SQLITE_CAUSES = {
    sqlite3.SQLITE_BUSY: "database is locked",
    sqlite3.SQLITE_LOCKED: "database is locked",
    sqlite3.SQLITE_FULL: "disk full",
    sqlite3.SQLITE_READONLY: "read-only",
    sqlite3.SQLITE_CANTOPEN: "cannot open the file",
    sqlite3.SQLITE_IOERR: "disk I/O error",
    sqlite3.SQLITE_NOTADB: "not a database",
    sqlite3.SQLITE_PERM: "permission denied",
}
# A full disk, a quota, or a file size limit (RLIMIT_FSIZE): no room to write either way.
NO_ROOM_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# A file write refused by the folder under it: full, or not writable (local artifact locations).
ARTIFACT_ERRNOS = NO_ROOM_ERRNOS | {errno.EACCES, errno.EPERM, errno.EROFS}
# Errors MLflow's codes mark as the user's to fix (a name, a value, a login, a permission), each
# with what to do about it: printed as one line, never retried.
USER_CAUSED = {
    "INVALID_PARAMETER_VALUE": "check the value it names",
    "RESOURCE_ALREADY_EXISTS": "choose another name, or use the existing one",
    "RESOURCE_DOES_NOT_EXIST": "check the name or id (pipeline compare lists the sweeps of a store)",
    "PERMISSION_DENIED": "ask the store's admin for permission",
    "UNAUTHENTICATED": "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user of that server",
    "CUSTOMER_UNAUTHORIZED": "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user of that server",
    "INVALID_STATE": "check the run or model it names (it may be deleted or not finished)",
    "ENDPOINT_NOT_FOUND": "check that --tracking-uri names an MLflow tracking server",
}
# HTTP answers that say "later": too many requests, a proxy or server not ready.
_RETRIED_STATUSES = {429, 502, 503, 504}


def _chain(exc: BaseException | None):
    """`exc`, then what it was raised from or while handling, down to the root cause."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _in_chain(exc: BaseException, *types: type) -> bool:
    return any(isinstance(link, types) for link in _chain(exc))


def sqlite_code(exc: BaseException) -> int | None:
    """sqlite's primary result code of the sqlite3 error under `exc` (SQLAlchemy and MLflow chain it
    as the cause), or None."""
    for link in _chain(exc):
        if isinstance(link, sqlite3.Error) and getattr(link, "sqlite_errorcode", None) is not None:
            return link.sqlite_errorcode & 0xFF
    return None


def os_error(exc: BaseException) -> OSError | None:
    """The first OSError with an errno in `exc`'s chain, or None."""
    return next((link for link in _chain(exc) if isinstance(link, OSError) and link.errno is not None), None)


def os_errno(exc: BaseException) -> int | None:
    refused = os_error(exc)
    return refused.errno if refused is not None else None


def error_code(exc: BaseException) -> str | None:
    """MLflow's error code of the first MlflowException in the chain, or None."""
    from mlflow.exceptions import MlflowException

    for link in _chain(exc):
        if isinstance(link, MlflowException):
            return link.error_code
    return None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status MLflow's error code stands for (a server's answer, or the code a store gave).
    MLflow reports a request that failed without an answer as a bare MlflowException (INTERNAL_ERROR,
    so 500) with requests' error chained: callers look at that chain first."""
    from mlflow.exceptions import MlflowException

    for link in _chain(exc):
        if isinstance(link, MlflowException):
            return link.get_http_status_code()
    return None


def is_no_room(exc: BaseException) -> bool:
    """A full disk (or quota, or file size limit) under the store: SQLITE_FULL, ENOSPC, EDQUOT, EFBIG."""
    return sqlite_code(exc) == sqlite3.SQLITE_FULL or os_errno(exc) in NO_ROOM_ERRNOS


def user_error(exc: BaseException, subject: str) -> UserError | None:
    """The one-line UserError for an MLflow error its code marks as the user's to fix, or None."""
    code = error_code(exc)
    if code not in USER_CAUSED or sqlite_code(exc) is not None:
        return None
    return UserError(f"{subject}: {first_line(exc)[:300]} ({code}); {USER_CAUSED[code]}")


def store_failure(exc: BaseException, uri: str) -> UserError:
    """An MLflow error from the tracking store at `uri` as one line: user_error's where its code
    says the user can fix it, else the store's first line, the password masked."""
    subject = f"tracking store {redact(uri)}"
    return user_error(exc, subject) or UserError(f"{subject}: {first_line(exc)}")


# MLflow's loggers that print what users need not read, and the level each is raised to.
_QUIET_LOGGERS = {
    # A new sqlite store prints a page of alembic migration INFO lines; users need none of them.
    "alembic": logging.WARNING,
    "mlflow.tracking._tracking_service.client": logging.WARNING,
    "mlflow.system_metrics": logging.WARNING,
    # ... nor a page per retry while a database store is unreachable: the error says it in one line.
    # (MLflow logs each failed database call at ERROR with its traceback before raising it to us.)
    "mlflow.store.db.utils": logging.CRITICAL,
    # Ray announces on every start that token authentication is on when a token exists: not news.
    "ray._private.authentication.authentication_token_setup": logging.ERROR,
}


@contextlib.contextmanager
def process_settings(login: Mapping[str, str] | None = None):
    """The settings a sweep runs under, for the block, then put back as they were: short HTTP
    retries (ours come on top), no URL printed after each run, system metrics every
    SYSTEM_METRICS_INTERVAL_S, and quiet MLflow loggers. Values the user set in the environment win.
    `login` (a Ray task's: the driver's credentials for the tracking server) wins over the
    environment. The one configuration path of every entry: the CLI holds it for the command
    (cli.main), `pipeline.api` for the call, a Ray task for the task, so that an outage reads the
    same whichever started the sweep. (MLflow reads these settings only from the environment and its
    loggers: there is no per-client setting.)"""
    defaults = {**_HTTP_DEFAULTS, **_QUIET, **_SAMPLING}
    added = [key for key in defaults if key not in os.environ]
    replaced = {key: os.environ.get(key) for key in login or {}}
    os.environ.update({key: defaults[key] for key in added})
    os.environ.update(login or {})
    levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    for name, level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(max(level, logging.getLogger(name).level))
    pickle_warning = _DropPickleWarning()
    logging.getLogger("mlflow.pytorch").addFilter(pickle_warning)
    try:
        yield
    finally:
        logging.getLogger("mlflow.pytorch").removeFilter(pickle_warning)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for key in added:
            os.environ.pop(key, None)
        for key, value in replaced.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _DropPickleWarning(logging.Filter):
    # Pickle is chosen deliberately (see tracker.Tracker.log_model); the warning would repeat per run.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Saving pytorch model by Pickle")


def resolve_tracking_uri(cli_value: str | None) -> str:
    """--tracking-uri, then $MLFLOW_TRACKING_URI, then sqlite:///mlflow.db in the working directory.
    UserError when it does not parse as a URI (a bracket left open, a port that is no number)."""
    uri = cli_value or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    try:
        urllib.parse.urlparse(uri).port  # noqa: B018 - parsing the port is the check: it raises ValueError
    except ValueError as exc:
        source = "--tracking-uri" if cli_value else "MLFLOW_TRACKING_URI"
        raise UserError(
            f"{source} {redact(uri)}: not a URI ({exc}); e.g. http://HOST:5000, or sqlite:///mlflow.db for a file"
        ) from None
    return uri


def sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///") and uri[len("sqlite:///") :] not in ("", ":memory:"):
        return Path(uri[len("sqlite:///") :])
    return None


def absolute_store_uri(uri: str) -> str:
    """A relative sqlite URI made absolute, so it names the same store from any directory."""
    path = sqlite_path(uri)
    return f"sqlite:///{path.resolve()}" if path is not None else uri


def local_state_dir(uri: str) -> Path:
    """Where local results and checkpoints live: beside a sqlite store, else the working directory."""
    path = sqlite_path(uri)
    return path.resolve().parent if path is not None else Path.cwd()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


# MLflow's names for a Databricks workspace (bare, or as a scheme with a profile): no store of the
# pipeline's tests, and without this a bare "databricks" would read as a retired file store.
DATABRICKS = ("databricks", "databricks-uc", "uc")


def check_reachable(uri: str, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """Fail fast (UserError) when a store cannot be used; MLflow's own retries take minutes. A server
    must answer within `timeout_s`, not merely accept the connection (a hung one never answers)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("http", "https"):
        import requests

        fix = "start it (e.g. `pipeline server --port 5000`) or pass another --tracking-uri"
        try:  # any answer will do: a server without /health, or one that wants credentials
            requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s, **_tls()).close()
        except requests.exceptions.SSLError as exc:
            raise UserError(
                f"tracking server {redact(uri)}: TLS failed ({_why(exc)}); set MLFLOW_TRACKING_SERVER_CERT_PATH "
                "to the CA bundle that signed its certificate, or MLFLOW_TRACKING_INSECURE_TLS=true"
            ) from None
        except requests.exceptions.ReadTimeout:
            raise UserError(
                f"tracking server {redact(uri)} accepted the connection but did not answer "
                f"within {timeout_s:g} s; check that it is healthy, or {fix}"
            ) from None
        except requests.exceptions.ConnectTimeout:
            raise UserError(f"tracking server {redact(uri)} did not answer within {timeout_s:g} s; {fix}") from None
        except requests.exceptions.RequestException as exc:
            raise UserError(f"tracking server {redact(uri)} is unreachable ({_why(exc)}); {fix}") from None
        check_login(uri, timeout_s)
    elif parsed.scheme.split("+")[0] in ("postgresql", "mysql", "mssql"):
        check_backend(uri, label="tracking store")
    elif parsed.scheme == "sqlite":
        check_sqlite_file(uri)
    elif uri in DATABRICKS or parsed.scheme in DATABRICKS:
        raise UserError(
            f"tracking store {uri}: a Databricks workspace is not a store this tool is tested on; use a "
            "database file (--tracking-uri sqlite:///mlflow.db), a database (postgresql://...) or an "
            "MLflow tracking server (http://HOST:PORT)"
        )
    elif parsed.scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        _refuse_file_store(uri, Path(parsed.path if parsed.scheme == "file" else uri).expanduser())


def check_sqlite_file(uri: str, option: str = "--tracking-uri", label: str = "tracking store") -> None:
    """UserError when a sqlite URI names a folder, a file in a folder that does not exist, or a file
    that is no database: sqlite would answer "unable to open" to every retry, or fail after a lock
    file is made beside it."""
    if _in_memory(uri):
        raise UserError(
            f"{label} {uri}: an in-memory database ends with the process, and every run in it; pass a "
            f"database file, e.g. {option} sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"
        )
    if not uri.startswith("sqlite://") or urllib.parse.urlparse(uri).netloc:
        raise UserError(
            f"{label} {uri}: a sqlite URI has three slashes before a relative path and four before an "
            f"absolute one, e.g. {option} sqlite:///mlflow.db or sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"
        )
    path = sqlite_path(uri)
    if path is None:
        return
    if path.is_dir():
        raise UserError(
            f"{label} {uri}: {path} is a folder; name a database file in it, "
            f"e.g. {option} sqlite:///{path.resolve() / 'mlflow.db'}"
        )
    if not path.parent.exists():
        raise UserError(f"{label} {uri}: folder {path.parent} does not exist; create it or pass another {option}")
    if not path.parent.is_dir():
        raise UserError(f"{label} {uri}: {path.parent} is a file, not a folder; pass another {option}")
    if not _empty_or_sqlite(path):
        raise UserError(
            f"{label} {uri}: {path} is not an SQLite database; pass the store's .db file, "
            "or a new file name to create one"
        )


def _in_memory(uri: str) -> bool:
    """Whether a sqlite URI names a database in memory: no path (`sqlite://`), `:memory:` (also as
    sqlite's URI filename `file::memory:`), or `mode=memory` in its query."""
    parsed = urllib.parse.urlparse(uri)
    database = parsed.path  # "" for sqlite://, "/" for sqlite:///, "/:memory:"; "//" is the root folder
    return (
        database in ("", "/")
        or database.rpartition("/")[2].startswith((":memory:", "file::memory:"))  # made absolute or not
        or "memory" in urllib.parse.parse_qs(parsed.query).get("mode", [])
    )


def _empty_or_sqlite(path: Path) -> bool:
    """Whether MLflow can use the file at `path`: absent or empty (it creates the tables), or an SQLite
    database (its header). Anything else, say a grid file, would fail later, after a lock file is made."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(16)
    except FileNotFoundError:
        return True
    except OSError:
        return True  # unreadable: the client's own error says why
    return not header or header == b"SQLite format 3\0"


def _refuse_file_store(uri: str, path: Path) -> None:
    """A plain path (or file:) is MLflow's retired file store: say which sqlite URI was most likely meant
    instead of MLflow's page of text, before anything (an ./mlruns folder) is made."""
    meant = path if path.suffix in (".db", ".sqlite", ".sqlite3") or path.is_file() else path / "mlflow.db"
    raise UserError(
        f"tracking store {uri}: MLflow 3 retired file stores (a path or file: URI); use a database "
        f"file, e.g. --tracking-uri sqlite:///{meant.resolve()}, or a tracking server (http://HOST:PORT)"
    )


# How MLflow's client authenticates to a server; Ray workers get the driver's values (executors).
CREDENTIAL_VARIABLES = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
)


def check_login(uri: str, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """A server that wants a login (`pipeline server --auth`) refuses the credentials in the
    environment, or there are none: one line (UserError) before anything is created."""
    import requests

    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = None if user and password else os.environ.get("MLFLOW_TRACKING_TOKEN")
    try:
        status = requests.get(
            f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search",
            params={"max_results": 1},
            auth=(user, password) if user and password else None,
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            **_tls(),
        ).status_code
    except requests.exceptions.RequestException:
        return  # it answered /health a moment ago: the client's retries take it from here
    if status == 401 and user and password:
        raise UserError(
            f"tracking server {redact(uri)} refused the password of user {user!r} (HTTP 401); "
            f"check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )
    if status == 401:
        raise UserError(
            f"tracking server {redact(uri)} requires a login (HTTP 401); set MLFLOW_TRACKING_USERNAME "
            "and MLFLOW_TRACKING_PASSWORD to a user of that server"
        )
    if status == 403:
        raise UserError(
            f"tracking server {redact(uri)}: user {user!r} may not read it (HTTP 403); ask its admin for permission"
        )
    # Anything else is the client's to meet (a proxy without this API, a 5xx it retries).


def _tls() -> dict:
    """requests' TLS arguments as MLflow's client sets them from the environment: a server MLflow can
    reach, the probes reach too (a private CA, a self-signed certificate, a client certificate)."""
    insecure = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"
    return {
        "verify": False if insecure else os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True,
        "cert": os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH") or None,
    }


def _why(exc: Exception) -> str:
    """The cause at the bottom of requests' nested message: '[Errno 111] Connection refused'."""
    found = re.search(r"\[(?:Errno -?\d+|SSL: \w+)\][^'\")(]+", str(exc))
    return found.group(0).strip() if found else exc.__class__.__name__


def open_client(uri: str, must_exist: bool = False):
    """An MlflowClient on `uri` that retries transient failures, after a fast reachability check.

    With `must_exist` (a read command), a local sqlite store must be there and be an MLflow store at
    the current schema: nothing is created, migrated or locked. Otherwise a new sqlite store is
    created under a file lock: processes creating the tables at once break it.
    """
    import mlflow

    check_reachable(uri)
    path = sqlite_path(uri)
    if must_exist and path is not None:
        check_mlflow_store(uri, path)

    lock: contextlib.AbstractContextManager = contextlib.nullcontext()
    new = created = False
    if path is not None and not must_exist:  # a writer, which may create the store
        created = not path.exists()
        check_writable_store(uri, path)
        # A store that is absent or was written in the last minute may be half made by another program.
        new = not path.exists() or time.time() - path.stat().st_mtime < 60
        if not new:
            refuse_foreign_sqlite(uri, path)
        lock = FileLock(path.with_name(path.name + ".lock"))  # our processes create its tables one at a time
    try:
        for delay in (*_RETRY_DELAYS_S, None):
            try:
                with lock:
                    mlflow.MlflowClient(uri).search_experiments(max_results=1)  # creates/upgrades a new store once
                break
            except Exception as exc:
                # A sqlite file busy with other sweeps' writes is waited out; a server that refuses a
                # login or does not answer is said at once (check_login and check_reachable name it).
                if delay is None or sqlite_code(exc) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
                time.sleep(delay)
    except Exception as exc:  # a bad scheme, a missing driver, a full disk, another program's race: one line
        if created and path is not None and is_no_room(exc):  # ours, half made: not left for the next run
            for leftover in (path, path.with_name(path.name + "-journal")):
                leftover.unlink(missing_ok=True)
        raise _open_error(uri, path, exc, new) from None
    return Retrying(mlflow.MlflowClient(uri))


def _open_error(uri: str, path: Path | None, exc: Exception, new: bool) -> UserError:
    where = path.resolve().parent if path is not None else None
    if where is not None and is_no_room(exc):
        return UserError(
            f"tracking store {uri}: disk full at {where} ({short_cause(exc)}); free some space "
            "there, or pass --tracking-uri sqlite:///OTHER/mlflow.db on a disk with room"
        )
    code = sqlite_code(exc) if path is not None else None
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN) or (
        path is not None and os_errno(exc) in (errno.EACCES, errno.EPERM, errno.EROFS)
    ):
        return UserError(
            f"tracking store {uri}: {path} cannot be written ({short_cause(exc)}); make it and its "
            f"folder {where} writable, or pass --tracking-uri sqlite:///OTHER/mlflow.db"
        )
    hint = ""
    if isinstance(exc, ModuleNotFoundError):
        hint = f"; install the {exc.name} package for this store"
    elif code is None and (mlflow_code := error_code(exc)) in USER_CAUSED and user_error(exc, "") is not None:
        hint = f"; {USER_CAUSED[mlflow_code]}"
    elif new and path is not None and _creation_race(exc):  # the UI, a notebook, creating its tables now
        hint = (
            "; another program is creating this new store at the same moment (our lock means nothing "
            "to it): run again once it is done"
        )
        if _half_made(path):
            hint += f"; if that fails the same way, both left it half made: delete {path}"
    return UserError(
        f"tracking store {redact(uri)} cannot be opened ({exc.__class__.__name__}: {first_line(exc)[:300]}){hint}"
    )


# MLflow's tables that every version of its schema has: a sqlite file without them is not a store.
_MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}


def _tables(path: Path) -> tuple[set[str], str | None] | None:
    """The table names and alembic revision of the sqlite file at `path`, read-only (no journal, no
    lock file, nothing written), or None when it cannot be read as a database."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            names = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
            revision = None
            if "alembic_version" in names:
                row = db.execute("select version_num from alembic_version").fetchone()
                revision = row[0] if row else None
            return names, revision
    except sqlite3.Error:
        return None


def _half_made(path: Path) -> bool:
    """Whether `path` holds a migration's half-done table copy (alembic's `_alembic_tmp_` tables)."""
    found = _tables(path)
    return found is not None and any(name.startswith("_alembic_tmp_") for name in found[0])


def check_mlflow_store(uri: str, path: Path) -> None:
    """For a read command: UserError unless `path` is an MLflow store, read without writing a byte
    (another program's database is never given MLflow's tables)."""
    if not path.exists():
        raise UserError(f"no tracking store at {path} ({uri}); run a grid first, or pass --tracking-uri")
    found = _tables(path)
    if found is None or not found[0] >= _MLFLOW_TABLES:
        raise UserError(
            f"{path} is not an MLflow store (an SQLite database without MLflow's tables); pass the store's .db file"
        )
    # A store at another MLflow schema is not migrated here: MLflow's own check at opening refuses it,
    # naming `mlflow db upgrade` (open_client turns that into one line).


def refuse_foreign_sqlite(uri: str, path: Path) -> None:
    """For a writer: UserError when `path` is another program's sqlite database (tables, none of them
    MLflow's): MLflow would add its own tables to it."""
    found = _tables(path) if path.exists() and path.stat().st_size else None
    if found is not None and found[0] and not found[0] & _MLFLOW_TABLES:
        raise UserError(
            f"{path} is not an MLflow store (an SQLite database without MLflow's tables); "
            "pass the store's .db file, or a new file name to create one"
        )


def check_writable_store(uri: str, path: Path) -> None:
    """For a writer: UserError at once when the store at `path` cannot be written, or created: its
    folder (where sqlite puts its journal) or the file itself is read-only, or the disk is full.
    sqlite would fail every write later, or answer "unable to open" to every attempt at creating it
    (which looked like another program's half-made store)."""
    folder = path.resolve().parent
    if not folder.is_dir():
        return  # check_sqlite_file names a missing folder
    fix = "or pass --tracking-uri sqlite:///OTHER/mlflow.db"
    try:
        probe(folder)
        if path.is_file():
            with open(path, "r+b"):  # opened for writing, not written
                pass
    except OSError as exc:
        if exc.errno in NO_ROOM_ERRNOS:
            raise UserError(
                f"tracking store {uri}: disk full at {folder}; free some space there, {fix} on a disk with room"
            ) from None
        what = f"the store {path}" if exc.filename == str(path) else f"the folder {folder}"
        raise UserError(
            f"tracking store {uri}: {what} cannot be written ({os.strerror(exc.errno or 0)}); make it writable, {fix}"
        ) from None


def _creation_race(exc: BaseException) -> bool:
    """Whether an error opening a store that was new when we started is another program running its
    migrations at the same time. Two migrations interleaved fail in many ways (sqlite
    errors on tables that already exist or are locked, constraint failures, alembic missing its
    version row, MLflow's out-of-date schema check half-way); a missing driver, a code MLflow marks
    as the user's, a full disk, or a file that cannot be opened, written or read as a database is
    not one of them."""
    if isinstance(exc, ImportError) or is_no_room(exc) or is_transient(exc):  # busy: retried, then said as such
        return False
    if sqlite_code(exc) in (
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_IOERR,
    ):
        return False
    if os_errno(exc) in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR):
        return False
    return sqlite_code(exc) is not None or error_code(exc) not in USER_CAUSED


def is_transient(exc: BaseException) -> bool:
    """Worth retrying, by type and code: a busy or locked sqlite file; a refused, reset or timed-out
    connection; HTTP 429, 502, 503 or 504; a server error status MLflow's own client already retried;
    and a 401 once the sweep has started: its login was checked before anything was created
    (check_login), and MLflow's auth app answers 401 to every request whose login it cannot look
    up while its user database is down (a restart), once the login has left its cache.

    A full disk, a read-only file or a file that cannot be opened is not transient: retrying waits
    for nothing."""
    import requests

    code = sqlite_code(exc)
    if code is not None:  # MLflow reports every sqlite OperationalError as TEMPORARILY_UNAVAILABLE
        return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    if is_no_room(exc):
        return False
    # requests' own error types, chained under MLflow's bare MlflowException; a ConnectTimeout is a
    # ConnectionError too. A status in MLflow's retry list (408, 429, 500, 502, 503, 504) comes back
    # as a RetryError once its retries are spent, without the status (urllib3 keeps only a message):
    # it is retried, and creates are guarded by a dedupe key (Retrying).
    if _in_chain(
        exc,
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.RetryError,
        ConnectionError,
        TimeoutError,
    ):
        return True
    # MLflow's server answers 400 BAD_REQUEST (and its auth app 401) to requests it cannot serve while
    # the database behind it restarts (seen with PostgreSQL): retried like the outage they are; what a
    # user could get wrong is checked before the sweep creates anything.
    if error_code(exc) in ("UNAUTHENTICATED", "CUSTOMER_UNAUTHORIZED", "BAD_REQUEST"):
        return True
    return http_status(exc) in _RETRIED_STATUSES


class Retrying:
    """Wraps an MlflowClient: each call retries transient failures with backoff (capped: the delays
    below), then raises TrackingUnavailable. Everything else passes through unchanged. `once` is the
    bare client: one attempt, for a second Ctrl-C or a store already known to be down.

    Retried as they are: reads, and MLflow's writes that leave the same state when repeated
    (log_batch of the same values, set_tag, set_terminated, log_artifacts, log_inputs). A create is
    retried only with a dedupe key looked up before each retry: a run by a unique token tag, an
    experiment by its unique name. Any other create_* is tried once: a lost answer after the server
    wrote would otherwise make a second one."""

    def __init__(self, client) -> None:
        self.once = client

    def __getattr__(self, name: str):
        attribute = getattr(self.once, name)
        if not callable(attribute):
            return attribute
        if name == "create_run":
            return self._create_run
        if name == "create_experiment":
            return self._create_experiment
        attempts = (None,) if name.startswith("create_") else (*_RETRY_DELAYS_S, None)
        return lambda *args, **kwargs: self._call(attempts, lambda: attribute(*args, **kwargs))

    def _call(self, delays, call, created=lambda: None):
        for attempt, delay in enumerate(delays):
            if attempt:
                found = created()  # what the failed attempt may have made before its answer was lost
                if found is not None:
                    return found
            try:
                with critical():  # a Ctrl-C waits for the call: never a half-done write
                    return call()
            except Exception as exc:
                if is_no_room(exc):  # no retry makes room; the caller keeps the results locally
                    raise TrackingUnavailable.of(self.once.tracking_uri, exc) from exc
                if not is_transient(exc):
                    raise
                if delay is None:
                    raise TrackingUnavailable.of(self.once.tracking_uri, exc) from exc
                time.sleep(delay)
        raise AssertionError("unreachable: the last delay is None")

    def _create_run(
        self, experiment_id: str, start_time: int | None = None, tags: dict | None = None, run_name: str | None = None
    ):
        """MlflowClient.create_run, retried after a run with this call's token is looked up."""
        token = uuid.uuid4().hex
        tags = {**(tags or {}), TAG_CREATE_TOKEN: token}
        return self._call(
            (*_RETRY_DELAYS_S, None),
            lambda: self.once.create_run(experiment_id, start_time=start_time, tags=tags, run_name=run_name),
            lambda: self._lookup(lambda: self._run_with_token(experiment_id, token)),
        )

    def _run_with_token(self, experiment_id: str, token: str):
        from mlflow.entities import ViewType

        found = self.once.search_runs(
            [experiment_id], f"tags.`{TAG_CREATE_TOKEN}` = '{token}'", run_view_type=ViewType.ALL, max_results=1
        )
        return found[0] if found else None

    def _create_experiment(self, name: str, artifact_location: str | None = None, tags: dict | None = None):
        """MlflowClient.create_experiment, retried after the experiment is looked up by its (unique) name."""

        def existing():
            found = self.once.get_experiment_by_name(name)
            return found.experiment_id if found is not None else None

        return self._call(
            (*_RETRY_DELAYS_S, None),
            lambda: self.once.create_experiment(name, artifact_location=artifact_location, tags=tags),
            lambda: self._lookup(existing),
        )

    @staticmethod
    def _lookup(find):
        """`find()`, or None while the store still does not answer (the next attempt waits on)."""
        try:
            return find()
        except Exception as exc:
            if is_transient(exc):
                return None
            raise


@contextlib.contextmanager
def fluent_target(uri: str, experiment_id: str | None = None):
    """MLflow's fluent APIs aimed at this store (and experiment, when given) for the duration of
    one call, then restored: logging a model and sampling system metrics (tracker.py) go through
    them, registering a model version resolves its `models:/m-...` source through them, and
    loading a model (predict) resolves `runs:/` and `models:/` URIs through them. These have no
    form that takes a client or a URI."""
    import mlflow

    previous_uri = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    previous_experiment = os.environ.get("MLFLOW_EXPERIMENT_ID")
    mlflow.set_tracking_uri(uri)
    if experiment_id is not None:
        os.environ["MLFLOW_EXPERIMENT_ID"] = experiment_id
    try:
        yield
    finally:
        # None puts back "not set" (MLflow keeps the value as given); no public call unsets it.
        mlflow.set_tracking_uri(previous_uri)
        if previous_experiment is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = previous_experiment


# The runs page in MLflow's Model training mode (a new browser would otherwise open the GenAI mode).
def ui_hint(uri: str, experiment_id: str) -> tuple[str, str]:
    """The command that opens the MLflow UI on this store, and the experiment's training-runs page."""
    uri = absolute_store_uri(uri)
    page = RUNS_PAGE.format(experiment_id=experiment_id)
    if uri.startswith(("http://", "https://")):
        return "", f"{uri.rstrip('/')}/{page}"
    no_jobs = " ".join(f"{k}={v}" for k, v in UI_ENV.items())
    return (
        f"{no_jobs} {_mlflow_executable()} ui --backend-store-uri {uri} --port 5000 {' '.join(UI_OPTIONS)}",
        f"http://127.0.0.1:5000/{page}",
    )


# How `pipeline ui` starts MLflow's UI, and so the command the pipeline prints for it: one worker
# (uvicorn's default is four copies of the app, too many for a laptop or a 2-core box) and MLflow's
# GenAI job runners off (3.x starts job consumer processes with the UI; the pipeline uses none).
# The variable is MLflow's own; `mlflow ui` has no flag for it.
UI_OPTIONS = ("--workers", "1")
UI_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _mlflow_executable() -> str:
    """`mlflow` of this environment, spelled so it runs from the user's shell without activation."""
    candidate = Path(sys.executable).parent / "mlflow"
    if not candidate.exists():
        return "mlflow"
    try:
        return str(candidate.relative_to(Path.cwd()))
    except ValueError:
        return str(candidate)


def check_backend(uri: str, timeout_s: int = 5, label: str = "--backend-store-uri") -> None:
    """Fail fast (UserError, password masked) when a database store cannot be used: its driver is
    missing, it is down or unreachable, or it refuses the credentials. mlflow server would otherwise
    print a traceback, or start and fail every request; MLflow's client retries for ~100 s."""
    if sqlite_path(uri) is not None:
        check_sqlite_file(uri, label, label)  # a local file: created on first use
        return
    if "://" not in uri:
        return
    import sqlalchemy

    fix = "check that the database is up and reachable and the user and password are right"
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=_connect_timeout(uri, timeout_s))
        with engine.connect():
            pass
    except ImportError as exc:
        install = (
            "the server extra: pip install -e '.[server]' (make setup does)"
            if uri.startswith("postgresql")
            else f"its driver ({getattr(exc, 'name', None) or exc})"
        )
        raise UserError(f"{label} {redact(uri)}: no driver for it ({exc}); install {install}") from None
    except Exception as exc:
        cause = first_line(exc).replace(urllib.parse.urlparse(uri).password or "\0", "***")
        raise UserError(
            f"{label} {redact(uri)}: cannot connect ({exc.__class__.__name__}: {cause[:200]}); {fix}"
        ) from None
    engine.dispose()


def _connect_timeout(uri: str, timeout_s: int) -> dict:
    scheme = urllib.parse.urlparse(uri).scheme.split("+")[0]
    return {"connect_timeout": timeout_s} if scheme in ("postgresql", "mysql") else {}


def tell_project_run(message: str) -> None:
    """Under `mlflow run` the project run exists before the input is read, and mlflow marks it
    FAILED when we exit: record why on it (best effort; the message is printed either way)."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if run_id:
        with contextlib.suppress(Exception):
            from mlflow import MlflowClient

            # `mlflow run` hands its store to us as $MLFLOW_TRACKING_URI, as to any entry point.
            MlflowClient(resolve_tracking_uri(None)).set_tag(run_id, TAG_ERROR, message)
