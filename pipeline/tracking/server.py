"""`pipeline server` and `pipeline ui`: check what can be checked (the port among it), say where it
serves, then run MLflow's own server process and wait for it, reporting one that stops before it
listens (MLflow's server exits 0 after a failed start).

With `--auth`, the server is MLflow's basic-auth app: every request but /health needs a user's
password. Its users live in an auth database (by default the tracking database itself, or a
`basic_auth.db` beside a sqlite store). The first start creates the admin user with the password
from $MLFLOW_AUTH_ADMIN_PASSWORD or --admin-password-file, never from an argument `ps` would show:
MLflow's app reads it from its own environment (readable by this user alone) and creates the admin
once; later starts keep the admin as it is.
"""

from __future__ import annotations

import configparser
import contextlib
import errno
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.tracking.store import UI_ENV, absolute_store_uri, check_backend, sqlite_path

# Starlette's deprecation notice is a UserWarning, so it is named by its text.
_SERVER_WARNINGS = "ignore::DeprecationWarning,ignore:starlette.middleware.wsgi is deprecated"
ADMIN_USERNAME, ADMIN_PASSWORD = "MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"  # MLflow's own
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
AUTH_CACHE_S = 60


def check_port(host: str, port: int) -> None:
    """UserError unless a server can listen on `host`:`port` now: bound here the way uvicorn binds
    it (SO_REUSEADDR, so a port that a stopped server left in TIME_WAIT is free), then released.
    Otherwise MLflow's server would print its traceback in the background and exit 0."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            raise UserError(
                f"--host {host}: no such host name here ({exc.strerror}); use 127.0.0.1, 0.0.0.0 "
                "or an address of this machine"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(
                    f"--port {port}: already in use on {host} (another server?); stop it, or pick "
                    f"another port, e.g. --port {_free_port(host)}"
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(
                    f"--host {host}: not an address of this machine; use 127.0.0.1, 0.0.0.0 or one of its own addresses"
                ) from None
            if exc.errno == errno.EACCES:
                raise UserError(
                    f"--port {port}: permission denied (ports below 1024 need root); pick another "
                    "port, e.g. --port 5000"
                ) from None
            raise UserError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def run_mlflow(args: list[str], host: str, port: int, env: dict[str, str] | None = None) -> int:
    """Run `mlflow ARGS` (a server on `host`:`port`) and wait for it; its exit code. One that stops
    before it listens is reported in one line (exit 1): MLflow's own server exits 0 after printing
    why it could not start. Its GenAI job runners are off (the pipeline uses none; they start
    several processes) and its libraries' deprecation warnings are not the user's to read.

    The server is this process's child, in its process group: Ctrl-C at the terminal reaches it
    directly, and SIGTERM or SIGHUP sent to this process (a service manager, `docker stop`) is
    passed on to it, as `mlflow server` passes them on to its own workers."""
    sys.stdout.flush()
    env = {
        **os.environ,
        **{k: os.environ.get(k, v) for k, v in UI_ENV.items()},  # the user's setting wins
        "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", _SERVER_WARNINGS),
        **(env or {}),
    }
    process = subprocess.Popen([sys.executable, "-m", "mlflow", *args], env=env)

    stopped: list[int] = []  # the signals that asked it to stop (it may stop before our poll saw it listen)

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        if signum == signal.SIGINT and _terminal_sent_it():
            return  # the terminal's Ctrl-C went to the whole process group, the server included
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, forward) for signum in handled}
    listening = False
    try:
        while True:
            try:
                code = process.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                listening = listening or _listening(host, port)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not listening and not stopped:
        print(
            f"error: the MLflow server stopped before it listened on {host}:{port} (exit code {code}); "
            "its messages above say why",
            file=sys.stderr,
        )
        return 1
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128 + N


def _terminal_sent_it() -> bool:
    """Whether this process is in the terminal's foreground group, which a Ctrl-C reaches whole."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False


def _listening(host: str, port: int) -> bool:
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def serve(
    host: str,
    port: int,
    backend_store_uri: str,
    artifacts_destination: str,
    workers: int,
    allowed_hosts: str | None,
    auth: bool = False,
    admin_password_file: str | None = None,
    default_permission: str = "READ",
    auth_database_uri: str | None = None,
) -> int:
    """`pipeline server`: check the port and the database (and with `auth` set up its users), say
    where it serves, then run `mlflow server` until it stops; its exit code."""
    if not auth and (admin_password_file or auth_database_uri):
        raise UserError("--admin-password-file and --auth-database-uri go with --auth; add --auth")
    check_port(host, port)
    store = absolute_store_uri(backend_store_uri)
    check_backend(store)
    env, app = {}, []
    if auth:
        env = _set_up_auth(store, admin_password_file, default_permission, auth_database_uri)
        app = ["--app-name", "basic-auth"]
    if host not in _LOOPBACK:
        reach = "every network this machine is on" if host in ("0.0.0.0", "::") else f"anyone who reaches {host}"
        if auth:
            print(
                f"warning: --host {host} lets {reach} send passwords to this server in clear text (basic "
                "auth over http); put a TLS proxy in front of it or keep it on a private network",
                file=sys.stderr,
            )
        else:
            print(
                f"warning: --host {host} lets {reach} read and write every run and model in the store "
                "(no authentication: see --auth); keep it on a private network",
                file=sys.stderr,
            )
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    print(f"MLflow tracking server for {redact(store)}, artifacts in {artifacts_destination}")
    if auth:
        print("login required: sweeps and Ray workers use MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    print(f"point sweeps at it with: --tracking-uri http://{shown}:{port}  (Ctrl-C stops it)")
    extra = ["--allowed-hosts", allowed_hosts] if allowed_hosts else []
    # The store's URI (it may hold the database's password) goes through the environment: the
    # command line is what `ps` shows every user of the machine.
    try:
        return run_mlflow(
            [
                "server",
                "--host",
                host,
                "--port",
                str(port),
                "--artifacts-destination",
                artifacts_destination,
                "--workers",
                str(workers),
                *app,
                *extra,
            ],
            host,
            port,
            {**env, "MLFLOW_BACKEND_STORE_URI": store},
        )
    finally:  # the auth configuration's private folder goes with the server
        if "MLFLOW_AUTH_CONFIG_PATH" in env:
            shutil.rmtree(Path(env["MLFLOW_AUTH_CONFIG_PATH"]).parent, ignore_errors=True)


def _set_up_auth(store: str, password_file: str | None, default_permission: str, database_uri: str | None) -> dict:
    """Write MLflow's auth configuration (no admin password in it; the auth database's URI, with its
    password where it has one, in a private folder removed when the server ends), create the admin
    user if the auth database has none, and return the environment the server needs: its path."""
    password = os.environ.get(ADMIN_PASSWORD) or None
    if password_file:
        try:
            password = Path(password_file).expanduser().read_text().strip() or None
        except OSError as exc:
            raise UserError(
                f"--admin-password-file {password_file}: cannot read it ({exc.strerror}); "
                "give a file that holds the admin password"
            ) from None
        if password is None:
            raise UserError(f"--admin-password-file {password_file}: the file is empty; write the admin password in it")
    if database_uri is None:
        path = sqlite_path(store)
        database_uri = f"sqlite:///{path.with_name('basic_auth.db')}" if path is not None else store
    database_uri = absolute_store_uri(database_uri)
    if database_uri != store:
        check_backend(database_uri, label="--auth-database-uri")
    config = configparser.ConfigParser()
    config["mlflow"] = {
        "default_permission": default_permission,
        "database_uri": database_uri,
        "admin_username": "admin",
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        # Checking a password costs a deliberately slow hash (~0.2 s of CPU here); a sweep
        # makes hundreds of requests. Each worker remembers a good login this long, so a
        # changed or deleted password can still work there for up to that time.
        "auth_cache_ttl_seconds": str(AUTH_CACHE_S),
    }
    _check_admin(password, database_uri)  # before the file exists: a refusal leaves nothing behind
    # A private folder: the database URI may hold the database's password. Removed when the server
    # ends (serve).
    ini = Path(tempfile.mkdtemp(prefix="pipeline-auth-")) / "basic_auth.ini"
    with open(os.open(ini, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        config.write(handle)
    # The app signs its forms' CSRF tokens with this; its workers must share it. One per start
    # unless set (several servers behind one address need the same one).
    secret = os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32)
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": secret}
    if password is not None:  # MLflow's app creates the admin with it at start (once: later starts keep it)
        env[ADMIN_PASSWORD] = password
    return env


def _check_admin(password: str | None, database_uri: str) -> None:
    """What can be told before MLflow's basic-auth app starts, so that it is one line and exit 2
    rather than the server's traceback: its extra is installed, the admin password is long enough,
    and a new sqlite auth database comes with one (MLflow creates the admin from it at start)."""
    if importlib.util.find_spec("flask_wtf") is None:
        raise UserError(
            "--auth needs MLflow's auth extra (flask_wtf); install the server extra: "
            "pip install -e '.[server]' (make setup does)"
        )
    if password is not None and len(password) < 12:
        raise UserError(f"--auth: the admin password has {len(password)} characters; MLflow needs 12 or more")
    path = sqlite_path(database_uri)
    if password is None and path is not None and not path.exists():
        raise UserError(
            f"--auth: the admin user 'admin' does not exist yet and no password was given for it; "
            f"set {ADMIN_PASSWORD} or pass --admin-password-file FILE (12 characters or more)"
        )
