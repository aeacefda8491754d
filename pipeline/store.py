"""Tracking stores: which URI, whether it answers, opening a client that retries, and where local files go.

Nothing here changes process-wide state except `configure_process`, which only the CLI entry (and
a Ray worker, the entry of its own process) calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
import urllib.parse
from pathlib import Path

from pipeline.errors import UserError
from pipeline.interrupts import critical

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # MLflow's own default since 3.7
ANSWER_TIMEOUT_S = 3.0

# MLflow's own HTTP retries (7, backoff 2, 120 s timeout) take minutes to give up; we retry ourselves.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
# MLflow prints "View run ... / View experiment ..." to stdout after every run against a server;
# the sweep prints one link at the end instead.
_QUIET = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


class TrackingUnavailable(RuntimeError):
    """The tracking store stopped answering (after retries) in the middle of a sweep."""

    @classmethod
    def of(cls, uri: str, exc: BaseException) -> "TrackingUnavailable":
        return cls(f"{redact(uri)} stopped answering ({short_cause(exc)})")


def short_cause(exc: BaseException) -> str:
    """The gist of a network or database error, not urllib3's whole retry story."""
    text = f"{exc.__class__.__name__}: {exc}"
    for phrase in ("Connection refused", "Connection reset", "Read timed out", "timed out", "database is locked",
                   "Name or service not known", "No route to host"):
        if phrase.lower() in text.lower():
            return phrase.lower()
    status = re.search(r"\b(429|500|502|503|504)\b", text)
    return f"HTTP {status.group(1)}" if status else first_line(exc)[:120]


def configure_process() -> None:
    """Process-wide settings for a `pipeline` process: short HTTP retries (ours come on top) and
    quiet MLflow loggers. Called once by the CLI entry; values the user set in the environment win."""
    for key, value in {**_HTTP_DEFAULTS, **_QUIET}.items():
        os.environ.setdefault(key, value)
    # A new sqlite store prints a page of alembic migration INFO lines; users need none of them.
    for name in ("alembic", "mlflow.tracking._tracking_service.client", "mlflow.system_metrics"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # ... nor a page per retry while a database store is unreachable: the error says it in one line.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.ERROR)
    logging.getLogger("mlflow.pytorch").addFilter(_DropPickleWarning())
    # Ray announces on every start that token authentication is on when a token exists: not news.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


class _DropPickleWarning(logging.Filter):
    # Pickle is chosen deliberately (see tracking.Tracker.log_model); the warning would repeat per run.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Saving pytorch model by Pickle")


def resolve_tracking_uri(cli_value: str | None) -> str:
    """--tracking-uri, then $MLFLOW_TRACKING_URI, then sqlite:///mlflow.db in the working directory."""
    return cli_value or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///") and uri[len("sqlite:///"):] not in ("", ":memory:"):
        return Path(uri[len("sqlite:///"):])
    return None


def absolute_store_uri(uri: str) -> str:
    """A relative sqlite URI made absolute, so it names the same store from any directory."""
    path = sqlite_path(uri)
    return f"sqlite:///{path.resolve()}" if path is not None else uri


def local_state_dir(uri: str) -> Path:
    """Where local results and checkpoints live: beside a sqlite store, else the working directory."""
    path = sqlite_path(uri)
    return path.resolve().parent if path is not None else Path.cwd()


# user:PASSWORD@ after any scheme (http, postgresql+psycopg, mysql, mssql+pyodbc, ...); the password may
# hold an unescaped "@" (urllib reads the last "@" before the path as the end of it, and so does this). One
# slash is enough: a URI given where a path was expected comes back normalised (http:/user:PW@host/x).
_URI_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*:/+[^\s:/?#@]*:)[^\s/?#]*(?=@)")
# ...and secrets passed as query parameters (?password=..., &sslpassword=..., ;token=...).
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?:[A-Za-z_]*password|passwd|pwd|pass|[A-Za-z_]*token|secret|"
                           r"client_secret|api_?key|access_?key|secret_?key|sig|signature)=)[^\s&;#'\"]*",
                           re.IGNORECASE)


def redact(text: str) -> str:
    """`text` (a URI, or a message or command holding URIs) with every password and secret query value
    replaced by ***, for anything printed, logged or tagged. The user name and host stay: they say
    which store is meant."""
    text = _URI_PASSWORD.sub(r"\g<head>***", text)
    return _QUERY_SECRET.sub(r"\g<head>***", text)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


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
            raise UserError(f"tracking server {redact(uri)}: TLS failed ({_why(exc)}); set MLFLOW_TRACKING_SERVER_CERT_PATH "
                            "to the CA bundle that signed its certificate, or MLFLOW_TRACKING_INSECURE_TLS=true") from None
        except requests.exceptions.ReadTimeout:
            raise UserError(f"tracking server {redact(uri)} accepted the connection but did not answer "
                            f"within {timeout_s:g} s; check that it is healthy, or {fix}") from None
        except requests.exceptions.ConnectTimeout:
            raise UserError(f"tracking server {redact(uri)} did not answer within {timeout_s:g} s; {fix}") from None
        except requests.exceptions.RequestException as exc:
            raise UserError(f"tracking server {redact(uri)} is unreachable ({_why(exc)}); {fix}") from None
        check_login(uri, timeout_s)
    elif parsed.scheme.split("+")[0] in ("postgresql", "mysql", "mssql"):
        check_backend(uri, label="tracking store")
    elif parsed.scheme == "sqlite":
        check_sqlite_file(uri)
    elif parsed.scheme in ("", "file") and not os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
        _refuse_file_store(uri, Path(parsed.path if parsed.scheme == "file" else uri).expanduser())


def check_sqlite_file(uri: str, option: str = "--tracking-uri", label: str = "tracking store") -> None:
    """UserError when a sqlite URI names a folder, a file in a folder that does not exist, or a file
    that is no database: sqlite would answer "unable to open" to every retry, or fail after a lock
    file is made beside it."""
    path = sqlite_path(uri)
    if path is None:
        return
    if path.is_dir():
        raise UserError(f"{label} {uri}: {path} is a folder; name a database file in it, "
                        f"e.g. {option} sqlite:///{path.resolve() / 'mlflow.db'}")
    if not path.parent.exists():
        raise UserError(f"{label} {uri}: folder {path.parent} does not exist; create it or pass another {option}")
    if not _empty_or_sqlite(path):
        raise UserError(f"{label} {uri}: {path} is not an SQLite database; pass the store's .db file, "
                        "or a new file name to create one")


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
    raise UserError(f"tracking store {uri}: MLflow 3 retired file stores (a path or file: URI); use a database "
                    f"file, e.g. --tracking-uri sqlite:///{meant.resolve()}, or a tracking server (http://HOST:PORT)")


# How MLflow's client authenticates to a server; Ray workers get the driver's values (executors).
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                        "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH",
                        "MLFLOW_TRACKING_CLIENT_CERT_PATH")


def check_login(uri: str, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """A server that wants a login (`pipeline server --auth`) refuses the credentials in the
    environment, or there are none: one line (UserError) before anything is created."""
    import requests

    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = None if user and password else os.environ.get("MLFLOW_TRACKING_TOKEN")
    try:
        status = requests.get(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search", params={"max_results": 1},
                              auth=(user, password) if user and password else None, timeout=timeout_s,
                              headers={"Authorization": f"Bearer {token}"} if token else {}, **_tls()).status_code
    except requests.exceptions.RequestException:
        return  # it answered /health a moment ago: the client's retries take it from here
    if status == 401 and user and password:
        raise UserError(f"tracking server {redact(uri)} refused the password of user {user!r} (HTTP 401); "
                        f"check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    if status == 401:
        raise UserError(f"tracking server {redact(uri)} requires a login (HTTP 401); set MLFLOW_TRACKING_USERNAME "
                        "and MLFLOW_TRACKING_PASSWORD to a user of that server")
    if status == 403:
        raise UserError(f"tracking server {redact(uri)}: user {user!r} may not read it (HTTP 403); "
                        "ask its admin for permission")
    # Anything else is the client's to meet (a proxy without this API, a 5xx it retries).


def _tls() -> dict:
    """requests' TLS arguments as MLflow's client sets them from the environment: a server MLflow can
    reach, the probes reach too (a private CA, a self-signed certificate, a client certificate)."""
    insecure = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"
    return {"verify": False if insecure else os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True,
            "cert": os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH") or None}


def _why(exc: Exception) -> str:
    """The cause at the bottom of requests' nested message: '[Errno 111] Connection refused'."""
    found = re.search(r"\[(?:Errno -?\d+|SSL: \w+)\][^'\")(]+", str(exc))
    return found.group(0).strip() if found else exc.__class__.__name__


def open_client(uri: str, must_exist: bool = False):
    """An MlflowClient on `uri` that retries transient failures, after a fast reachability check.

    With `must_exist`, a local sqlite store that is not there is an error rather than created. A new
    sqlite store is created under a file lock: processes creating the tables at once break it.
    """
    import mlflow

    check_reachable(uri)
    path = sqlite_path(uri)
    if must_exist and path is not None and not path.exists():
        raise UserError(f"no tracking store at {path} ({uri}); run a grid first, or pass --tracking-uri")
    def lock():  # a fresh context manager for each attempt
        return _file_lock(path.with_name(path.name + ".lock")) if path is not None else contextlib.nullcontext()

    # A store that is absent or was written in the last minute may be half made by another program.
    new = path is not None and (not path.exists() or time.time() - path.stat().st_mtime < 60)
    try:
        for delay in (*(_CREATION_RETRY_DELAYS_S if new else ()), None):
            try:
                with lock():
                    mlflow.MlflowClient(uri).search_experiments(max_results=1)  # creates/upgrades a new store once
                break
            except Exception as exc:
                # Another program (the UI, a notebook) creating the same new store at this moment: our
                # lock does not stop it, and the loser of the race sees its tables half made. Wait for
                # it to finish, then open what it made.
                if delay is None or not _creation_race(exc):
                    raise
                time.sleep(delay)
    except Exception as exc:  # a bad scheme, a missing driver, a file store: say so in one line
        hint = ""
        if isinstance(exc, ModuleNotFoundError):
            hint = f"; install the {exc.name} package for this store"
        elif "MLFLOW_ALLOW_FILE_STORE" in str(exc):
            hint = "; MLflow 3 retired file stores: use sqlite:///mlflow.db or a tracking server"
        elif new and _creation_race(exc):  # both migrations failed half-way: alembic's copy is left behind
            hint = (f"; another program created this new store at the same moment and left it half made: "
                    f"delete {path} and run again")
        raise UserError(f"tracking store {redact(uri)} cannot be opened ({exc.__class__.__name__}: "
                        f"{first_line(exc)[:300]}){hint}") from None
    return Retrying(mlflow.MlflowClient(uri))


# Up to ~45 s: another program's migration of a new store takes seconds, tens of them on a busy machine.
_CREATION_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0)


def _creation_race(exc: BaseException) -> bool:
    """Whether an error opening a store that was new when we started is worth waiting out: another
    program ran its migrations at the same time. Two migrations interleaved fail in many ways ("table
    ... already exists", "duplicate column name", alembic missing its version row, "out-of-date
    database schema" half-way); a missing driver or a retired file store is not one of them."""
    text = str(exc)
    return not isinstance(exc, ImportError) and "MLFLOW_ALLOW_FILE_STORE" not in text \
        and "file is not a database" not in text


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: a busy sqlite file, a dropped connection, a 5xx or 429 from a server, and a
    401 once the sweep has started: its login was checked before anything was created
    (check_login), and MLflow's auth app answers 401 to every request whose login it cannot look
    up while its user database is down (a restart), once the login has left its cache.

    Read from the message: MLflow's HTTP client reports a failed request as a bare MlflowException
    holding the text of requests' error, with no cause chained and no error code to go by."""
    text = f"{exc.__class__.__name__}: {exc}".lower()
    return any(s in text for s in ("database is locked", "connection", "timed out", "timeout", "max retries",
                                   "temporarily", "503", "502", "504", "429", "500 ", "error code 401"))


class Retrying:
    """Wraps an MlflowClient: each call retries transient failures with
    backoff, then raises TrackingUnavailable. Everything else passes through unchanged. `once` is the
    bare client: one attempt, for a second Ctrl-C or a store already known to be down."""

    def __init__(self, client) -> None:
        self.once = client

    def __getattr__(self, name: str):
        attribute = getattr(self.once, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            for delay in (*_RETRY_DELAYS_S, None):
                try:
                    with critical():  # a Ctrl-C waits for the call: never a half-done write
                        return attribute(*args, **kwargs)
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    if delay is None:
                        raise TrackingUnavailable.of(self.once.tracking_uri, exc) from exc
                    time.sleep(delay)

        return call


@contextlib.contextmanager
def fluent_target(uri: str, experiment_id: str):
    """MLflow's fluent APIs aimed at this store and experiment for the duration of one call, then
    restored: logging a model and sampling system metrics (tracking.py) go through them, and
    registering a model version resolves its `models:/m-...` source through them."""
    import mlflow

    previous_uri = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    previous_experiment = os.environ.get("MLFLOW_EXPERIMENT_ID")
    mlflow.set_tracking_uri(uri)
    os.environ["MLFLOW_EXPERIMENT_ID"] = experiment_id
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous_uri)
        if previous_experiment is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = previous_experiment


# The runs page in MLflow's Model training mode (a new browser would otherwise open the GenAI mode).
RUNS_PAGE = "#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def ui_hint(uri: str, experiment_id: str) -> tuple[str, str]:
    """The command that opens the MLflow UI on this store, and the experiment's training-runs page."""
    uri = absolute_store_uri(uri)
    page = RUNS_PAGE.format(experiment_id=experiment_id)
    if uri.startswith(("http://", "https://")):
        return "", f"{uri.rstrip('/')}/{page}"
    no_jobs = " ".join(f"{k}={v}" for k, v in UI_ENV.items())
    return (f"{no_jobs} {_mlflow_executable()} ui --backend-store-uri {uri} --port 5000 {' '.join(UI_OPTIONS)}",
            f"http://127.0.0.1:5000/{page}")


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
        install = ("the server extra: pip install -e '.[server]' (make setup does)" if uri.startswith("postgresql")
                   else f"its driver ({getattr(exc, 'name', None) or exc})")
        raise UserError(f"{label} {redact(uri)}: no driver for it ({exc}); install {install}") from None
    except Exception as exc:
        cause = first_line(exc).replace(urllib.parse.urlparse(uri).password or "\0", "***")
        raise UserError(f"{label} {redact(uri)}: cannot connect ({exc.__class__.__name__}: "
                        f"{cause[:200]}); {fix}") from None
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

            from pipeline.names import TAG_ERROR

            MlflowClient().set_tag(run_id, TAG_ERROR, message)
