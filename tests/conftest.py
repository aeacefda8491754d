"""Shared fixtures: small generated IDX files read through the real loader, real sqlite stores."""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

# Under xdist, one core's share of torch threads per worker (and for the pipelines, servers and
# `mlflow run`s it starts), set before anything imports torch or numpy. Two workers each running
# torch's default pool of 2 OpenMP threads put 4 spinning threads on 2 cores: the suite took 7:36
# that way and 5:54 this way (user CPU 10:04 and 7:13, same tree). A serial run keeps the default.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _CORES // _WORKERS)))

import pytest  # noqa: E402

from idx_files import make_idx  # noqa: E402 (numpy, after OMP_NUM_THREADS above)

REPO = Path(__file__).resolve().parents[1]
# The session's cache folder (PIPELINE_CACHE_DIR in isolated()): one per pytest worker process.
PEAK_CACHE = Path(tempfile.mkdtemp(prefix="pipeline-cache-"))
atexit.register(shutil.rmtree, PEAK_CACHE, True)
REAL_DATA = Path("/usr/share/datasets/fashion-mnist")


# With `make test` (two workers, `--dist loadfile --no-loadscope-reorder`) each worker takes whole
# files in collection order; a long file picked up last leaves the other worker idle at the end.
# Files go longest first by their recorded seconds (DURATIONS, written by `make durations`), so that
# the short ones even out the end; a file not recorded yet goes first (it may be long).
DURATIONS = REPO / "tests" / "durations.json"
RECORD = "PIPELINE_RECORD_DURATIONS"  # set (by `make durations`): record every test's seconds into DURATIONS
FAST_TEST_LIMIT_S = 20  # a test of `make test` that takes longer belongs in `make test-slow`


def recorded_durations() -> dict[str, dict[str, float]]:
    """DURATIONS as {tier: {test id: seconds}}; {} where it is missing."""
    try:
        return json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {}


def pytest_collection_modifyitems(config, items):
    seconds: dict[str, float] = {}
    for tier in recorded_durations().values():
        for test, spent in tier.items():
            file = test.split("::")[0].rpartition("/")[2]
            seconds[file] = seconds.get(file, 0.0) + spent
    items.sort(key=lambda item: -seconds.get(item.path.name, math.inf))


_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Under `make durations`, each test's seconds (setup, call and teardown), in the process that
    collects them all (xdist's controller, or the only one)."""
    if os.environ.get(RECORD) and not os.environ.get("PYTEST_XDIST_WORKER"):
        _SPENT[report.nodeid] = _SPENT.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """Under `make durations`, the tier's seconds into DURATIONS ("fast" or "slow", from -m)."""
    if not os.environ.get(RECORD) or os.environ.get("PYTEST_XDIST_WORKER") or not _SPENT:
        return
    tier = "slow" if session.config.getoption("markexpr") == "slow" else "fast"
    durations = recorded_durations()
    durations[tier] = {test: round(spent, 2) for test, spent in sorted(_SPENT.items())}
    DURATIONS.write_text(json.dumps(durations, indent=1, sort_keys=True) + "\n")


# The caller's MLflow and data settings, and what sets the width of the CLI's tables (tests that
# read a table at a width set it themselves).
ISOLATED_VARS = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_EXPERIMENT_NAME",
    "PIPELINE_DATA_DIR",
    "COLUMNS",
    "FORCE_COLOR",
    "TTY_COMPATIBLE",
)


@contextlib.contextmanager
def isolated(folder: Path):
    """None of the caller's MLflow or data settings, and `folder` as the working directory: each
    test's own (autouse, below), or a module-scoped fixture's, which is set up before any test's.
    Afterwards MLflow's fluent API aims nowhere, wherever the block aimed it. (Without mlflow, as on
    the GPU machine for tests/test_gpu.py, there is no fluent API to reset.)"""
    try:
        import mlflow
    except ImportError:
        mlflow = None
    with pytest.MonkeyPatch.context() as patch:
        for name in ISOLATED_VARS:
            patch.delenv(name, raising=False)
        # Two pytest workers share 2 cores, so every run here would be tagged contended (truly) and
        # left out of the speedups that most tests check; tests of contention set their own share.
        patch.setenv("PIPELINE_CONTENDED_SHARE", "1")
        # Devices' peaks (peak.py) are measured once per pytest worker, not once per test, and never
        # into the caller's own cache: one folder for the session, set for every test.
        patch.setenv("PIPELINE_CACHE_DIR", str(PEAK_CACHE))
        patch.chdir(folder)
        yield
    if mlflow is not None:
        mlflow.set_tracking_uri(None)


@pytest.fixture(scope="session", autouse=True)
def _peak_measured():
    """This worker's CPU peak, measured once into the session's cache folder as `pipeline devices
    --peak` would: a run reads it for its mfu and never measures one (tests of an empty cache set
    their own folder)."""
    import torch

    from pipeline.training import peak

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPELINE_CACHE_DIR", str(PEAK_CACHE))
        patch.setenv("PIPELINE_CONTENDED_SHARE", "1")  # the other worker is busy: cached all the same
        peak.find(torch.device("cpu"))


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, _peak_measured):
    with isolated(tmp_path):
        yield


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return make_idx(tmp_path_factory.mktemp("fashion"))


@pytest.fixture(scope="session")
def _store_template(tmp_path_factory) -> Path:
    """A migrated, empty sqlite store; copying it saves ~1 s of schema creation per test."""
    import mlflow

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def new_store(folder: Path, template: Path) -> str:
    """A sqlite store in `folder`, copied from the migrated template; its URI."""
    path = folder / "store" / "mlflow.db"
    path.parent.mkdir()
    shutil.copy(template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def tracking_uri(tmp_path, _store_template) -> str:
    return new_store(tmp_path, _store_template)


@pytest.fixture
def write_grid(tmp_path):
    def write(text: str, name: str = "grid.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The docs site, built once for every test that reads it, as `make test` builds it: --strict,
    so a warning (a broken link, an unknown anchor) fails the fixture."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    return folder


requires_real_data = pytest.mark.skipif(
    not REAL_DATA.is_dir(), reason="Debian's dataset-fashion-mnist is not installed (make setup installs it)"
)


def start_service(args: list[str], **kwargs):
    """Start a server (mlflow server/ui, models serve) in its own process group, so that
    stop_service ends its workers too: MLflow's servers leave uvicorn and huey children behind.
    tests/service_guard.py takes the group down if this test process dies without stopping it.
    Its output goes to a file (`service_output` reads it): a pipe nobody drains fills up after a few
    hundred access-log lines and then blocks every request."""
    import subprocess
    import sys
    import tempfile

    log = tempfile.NamedTemporaryFile("w+", prefix="service-", suffix=".log", delete=False)  # noqa: SIM115
    guarded = [sys.executable, str(REPO / "tests" / "service_guard.py"), *args]  # dies with this process
    process = subprocess.Popen(
        guarded, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs
    )
    process.log_path = log.name
    log.close()
    return process


def service_output(process) -> str:
    with open(process.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def stop_service(process) -> None:
    import os
    import signal
    import subprocess

    for signum, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            os.killpg(process.pid, signal.SIGKILL)  # workers that outlive their parent
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue
        break
    if getattr(process, "log_path", None):
        os.unlink(process.log_path)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process, seconds: float = 60, cafile: Path | None = None) -> None:
    """Until `url` answers (an https one signed by `cafile`, when given), or fail with the server's output."""
    import ssl
    import time
    import urllib.request

    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited: {service_output(process)}")
        try:
            urllib.request.urlopen(url, timeout=2, context=context)
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {seconds} s")


@pytest.fixture(scope="session")
def tracking_server(tmp_path_factory, _store_template):
    """One real tracking server for the session, started with `pipeline server` (sqlite backend in a
    temp dir, artifacts served by it); tests use their own experiment names."""
    folder = tmp_path_factory.mktemp("server")
    shutil.copy(_store_template, folder / "server.db")  # migrated already: the server starts in seconds
    port = free_port()
    server = start_server(f"sqlite:///{folder / 'server.db'}", folder, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_service(server)


# --- one small real sweep, shared -------------------------------------------------------------------

SHARED_GRID = "experiment: shared\ngrid:\n  batch_size: [64, 128]\n  device: [cpu]\n  epochs: [2]\n"


@dataclass(frozen=True)
class Sweep:
    """A sweep trained by the real CLI: the folder it ran in (its grid file, and MLflow's artifacts
    under mlruns/), its sqlite store (store/mlflow.db, with the pipeline's results file beside it),
    and what `pipeline run` printed."""

    folder: Path
    uri: str
    grid: Path
    data_dir: Path
    output: str

    @property
    def run_args(self) -> list[str]:
        """The `pipeline run` arguments that trained it: run them again and every point is DONE."""
        return ["run", str(self.grid), "--data-dir", str(self.data_dir), "--tracking-uri", self.uri]

    @property
    def store(self) -> Path:
        """The store's folder: the sqlite file and the pipeline's files beside it."""
        return Path(self.uri.removeprefix("sqlite:///")).parent


def train_sweep(folder: Path, grid_text: str, data_dir: Path, template: Path, name: str = "grid.yaml") -> Sweep:
    """`pipeline run` on `grid_text` in `folder` (its working directory), into a new store there."""
    (folder / name).write_text(grid_text)
    with isolated(folder):
        uri = new_store(folder, template)
        out = invoke("run", str(folder / name), "--data-dir", str(data_dir), "--tracking-uri", uri)
    assert out.exit_code == 0, out.output
    return Sweep(folder, uri, folder / name, data_dir, out.output)


def copy_sweep(sweep: Sweep, folder: Path) -> Sweep:
    """The same sweep in a store of its own in `folder` (the store's folder copied), for a test that
    writes to the store (tags, registrations, another run): what it writes there reaches no other
    test. The artifacts are not copied: MLflow keeps the absolute path each run logged them to, so
    the copy's runs read the original's files, and a run the copy adds logs its own under its new
    run id, a folder no other store names. A test that rewrites the artifacts of the sweep's own
    runs (`compare --publish`) trains a sweep of its own."""
    shutil.copytree(sweep.store, folder / "store")
    return replace(sweep, uri=f"sqlite:///{folder / 'store' / 'mlflow.db'}")


def checksums(folder: Path, leave_out: Path | None = None) -> dict[str, str]:
    """Every file under `folder` (but `leave_out`), by its path there: its sha256."""
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p != leave_out
    }


@pytest.fixture(scope="session")
def shared_sweep(tmp_path_factory, _store_template) -> Sweep:
    """SHARED_GRID trained once per test run, for the tests that only read a sweep: two cpu points
    (batch sizes 64 and 128) of two epochs each, on small data of its own. The first pytest worker to
    ask trains it; the others wait on a file lock, then read the sweep it recorded. A test that
    writes to it takes `sweep_copy`. A change to this store, or to a file its runs logged, fails the
    session at teardown."""
    import json

    from filelock import FileLock

    # Under xdist (PYTEST_XDIST_WORKER set) every worker's temporary folders lie in one folder per test
    # run, pytest's numbered folder; without it (`-p no:xdist`) there is one process and its own.
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    recorded = root / "shared-sweep.json"
    with FileLock(root / "shared-sweep.lock"):
        if not recorded.exists():
            folder = Path(tempfile.mkdtemp(prefix="shared-sweep-", dir=root))  # a failed try's folder stays apart
            sweep = train_sweep(folder, SHARED_GRID, make_idx(folder / "fashion"), _store_template)
            fields = {"folder": folder, "uri": sweep.uri, "grid": sweep.grid, "data_dir": sweep.data_dir}
            recorded.write_text(json.dumps({**{k: str(v) for k, v in fields.items()}, "output": sweep.output}))
        saved = json.loads(recorded.read_text())
    sweep = Sweep(Path(saved["folder"]), saved["uri"], Path(saved["grid"]), Path(saved["data_dir"]), saved["output"])
    store, logged = checksums(sweep.store), checksums(sweep.folder / "mlruns")
    yield sweep
    assert checksums(sweep.store) == store, "a test wrote to shared_sweep's store: give it sweep_copy"
    now = checksums(sweep.folder / "mlruns")
    changed = sorted(path for path, digest in logged.items() if now.get(path) != digest)
    assert not changed, f"a test rewrote artifacts of shared_sweep's runs: {changed}"


@pytest.fixture
def sweep_copy(shared_sweep, tmp_path) -> Sweep:
    """shared_sweep in a store of this test's own (copy_sweep), to write to."""
    return copy_sweep(shared_sweep, tmp_path)


# --- driving the CLI -------------------------------------------------------------------------------


def invoke(*args: str, columns: int | None = None):
    """The real CLI in this process; `columns` sets the width of its tables, as a terminal's would."""
    from click.testing import CliRunner

    from pipeline.cli import main

    env = {"COLUMNS": str(columns)} if columns else None
    return CliRunner(env=env).invoke(main, list(args), catch_exceptions=False)


def store_down_for(monkeypatch, batch_size: str) -> None:
    """The tracking store stops answering when the point of `batch_size` logs its epochs (a real
    outage's TrackingUnavailable, raised where the tracker would meet it); the others log as usual."""
    from pipeline.tracking.store import TrackingUnavailable
    from pipeline.tracking.tracker import Tracker

    real = Tracker.log_epochs

    def down_for_that_point(self, run_id, epochs, *args, **kwargs):
        if epochs and self.client.get_run(run_id).data.params["batch_size"] == batch_size:
            raise TrackingUnavailable("http://tracking: Connection refused")
        return real(self, run_id, epochs, *args, **kwargs)

    monkeypatch.setattr(Tracker, "log_epochs", down_for_that_point)


def runs_of(uri: str, experiment: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def children(runs) -> list:
    """The grid points' runs (those with a parent) among `runs`."""
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def children_of(client, parent_id: str) -> list:
    """The runs whose parent is `parent_id`."""
    experiment_id = client.get_run(parent_id).info.experiment_id
    return client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")


def history(client, run_id: str, metric: str) -> list[float]:
    """A run's values of `metric`, step by step (per-epoch metrics: epoch 1 first)."""
    return [m.value for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)]


def start_pipeline(args: list[str], **kwargs):
    """`python -m pipeline ARGS` as a user's shell would run it, output unbuffered."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **kwargs.pop("env", {})}
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        **kwargs,
    )


def read_until(process, marker: str, seconds: float = 120) -> str:
    """The process's output up to the first line holding `marker` (which is then printed)."""
    import time

    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    process.kill()
    raise AssertionError(f"never saw {marker!r}:\n{''.join(seen)}")


# --- a throwaway PostgreSQL behind `pipeline server` (the multi-machine store) ----------------------

PG_PASSWORD = "pg-s3cret-for-tests"


def _pg_binary(name: str) -> str | None:
    import glob

    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


ADMIN_PASSWORD = "admin-s3cret-for-tests"  # `pipeline server --auth`'s admin in pg_server


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL of its own: user `mlflow` with a password, database `mlflow`; its URI, and
    restart() (a fast shutdown, which drops every connection, then a start on the same port). (Its
    folder is under /tmp itself: the `postgres` user cannot enter pytest's root-only temp dirs.)"""
    import os
    import signal
    import subprocess
    import tempfile
    import time

    psycopg = pytest.importorskip("psycopg", reason="the server extra is not installed (pip install -e '.[server]')")
    initdb, server = _pg_binary("initdb"), _pg_binary("postgres")
    if not (initdb and server):
        pytest.skip("PostgreSQL is not installed: apt-get install postgresql (make test installs it as root)")
    folder = Path(tempfile.mkdtemp(prefix="pipeline-test-postgres-"))
    data, password_file = folder / "data", folder / "password"
    password_file.write_text(PG_PASSWORD + "\n")
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(folder, "postgres")
        shutil.chown(password_file, "postgres")
    subprocess.run(
        [
            *as_user,
            initdb,
            "-D",
            str(data),
            "-U",
            "mlflow",
            "--pwfile",
            str(password_file),
            "--auth",
            "scram-sha-256",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    admin = f"postgresql://mlflow:{PG_PASSWORD}@127.0.0.1:{port}/postgres"
    state = {"uri": f"postgresql://mlflow:{PG_PASSWORD}@127.0.0.1:{port}/mlflow", "port": port}

    def start():
        state["process"] = start_service(
            [*as_user, server, "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(folder)]
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(admin).close()
                return
            except psycopg.OperationalError:
                if state["process"].poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"PostgreSQL did not start: {service_output(state['process'])}") from None
                time.sleep(0.3)

    def restart():
        postmaster = int((data / "postmaster.pid").read_text().split()[0])  # not the service guard's pid
        os.kill(postmaster, signal.SIGINT)  # PostgreSQL's fast shutdown
        state["process"].wait(timeout=60)
        stop_service(state["process"])
        start()

    start()
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute("CREATE DATABASE mlflow")
    state["restart"] = restart
    try:
        yield state
    finally:
        stop_service(state["process"])
        shutil.rmtree(folder, ignore_errors=True)


def start_server(backend: str, folder: Path, port: int, auth: bool = False):
    """`pipeline server` on `backend`, artifacts proxied into `folder`; with `auth`, `--auth` with the
    admin's password read from a file, and its temporary files in `folder`/tmp (the auth
    configuration's private folder must be gone once it stops). Waits until it answers."""
    import os
    import sys

    login, env = [], None
    if auth:
        (folder / "admin-password").write_text(ADMIN_PASSWORD + "\n")
        login = ["--auth", "--admin-password-file", str(folder / "admin-password")]
        (folder / "tmp").mkdir()
        env = {**os.environ, "TMPDIR": str(folder / "tmp")}
    process = start_service(
        [
            sys.executable,
            "-m",
            "pipeline",
            "server",
            *login,
            "--port",
            str(port),
            "--backend-store-uri",
            backend,
            "--artifacts-destination",
            str(folder / "artifacts"),
            "--workers",
            "1",
        ],
        cwd=folder,
        env=env,
    )
    wait_for(f"http://127.0.0.1:{port}/health", process, seconds=120)  # the first start creates MLflow's tables
    return process


@pytest.fixture(scope="session")
def pg_server(postgres, tmp_path_factory):
    """`pipeline server --auth` on that database, artifacts proxied by it; tests log in through `pg`."""
    port = free_port()
    folder = tmp_path_factory.mktemp("pg-server")
    process = start_server(postgres["uri"], folder, port, auth=True)
    try:
        yield {"uri": f"http://127.0.0.1:{port}", "process": process}
    finally:
        stop_service(process)
    # Its auth configuration holds the database's password: stopped, the server removed it.
    assert not list((folder / "tmp").iterdir())


@pytest.fixture
def pg(pg_server, monkeypatch):
    """pg_server, with this test (its CLI calls, clients and subprocesses) logged in as the admin."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    return pg_server
