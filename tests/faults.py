"""The fault-injection harness (tests/test_faults.py): run a command as a user's shell would, then
check what a fault must never do.

Every case asserts, through `Command.check`:
- its exit code;
- at most 3 lines of output (stdout and stderr together);
- no traceback;
- no password (each case passes the secrets it put in its input);
- no run left RUNNING in the stores it names;
- user files unchanged: the checksum of every file under the folders it names, and the names of
  every file and folder there (a new lock file, an ./mlruns or a `.tmp` counts), except the paths
  the command owns (its store, its results file).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# Long enough for a command on a loaded 2-core machine; a hang is what it catches.
HANG_S = 120
MAX_LINES = 3


def tree(*folders: Path, owned: Iterable[Path] = ()) -> dict[str, str]:
    """Every file's sha256 and every folder's name under `folders`, except `owned` paths (and what
    lies under them): a checksum of everything the user has there."""
    skip = [Path(p).resolve() for p in owned]
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            resolved = path.resolve() if not path.is_symlink() else path
            if any(resolved == s or s in resolved.parents for s in skip):
                continue
            if path.is_symlink():
                found[str(path)] = "link -> " + os.readlink(path)
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                found[str(path)] = "folder"
            else:
                found[str(path)] = "special"
    return found


def running_runs(uri: str) -> list[str]:
    """Names and ids of the runs still RUNNING in the store at `uri` (every experiment, deleted ones too)."""
    import mlflow
    from mlflow.entities import ViewType

    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    runs = client.search_runs(experiments, "attributes.status = 'RUNNING'", run_view_type=ViewType.ALL)
    return [f"{r.info.run_name} ({r.info.run_id})" for r in runs]


@dataclass
class Result:
    args: list[str]
    exit_code: int
    output: str  # stdout and stderr together, in order

    @property
    def lines(self) -> list[str]:
        return [line for line in self.output.strip().splitlines() if line.strip()]


def pipeline(
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = HANG_S,
    stdin: int | None = subprocess.DEVNULL,
    address_space: int | None = None,
) -> Result:
    """`python -m pipeline ARGS` in its own process (its own signal handlers, logging and stderr),
    with the caller's MLflow settings removed; a hang fails the test instead of the suite.
    `address_space`: its limit in bytes, as `ulimit -v` sets it (util-linux's prlimit)."""
    limit = ["prlimit", f"--as={address_space}", "--"] if address_space else []

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    clean.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "100", **(env or {})})
    try:
        done = subprocess.run(
            [*limit, sys.executable, "-m", "pipeline", *args],
            cwd=cwd,
            env=clean,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"pipeline {' '.join(args)} hung ({timeout:g} s):\n{exc.output}") from None
    return Result(list(args), done.returncode, done.stdout)


@dataclass
class Command:
    """One case: what to run, and what it may touch."""

    args: list[str]
    exit_code: int
    says: tuple[str, ...] = ()  # fragments the output must hold
    secrets: tuple[str, ...] = ()  # must appear nowhere in the output
    stores: tuple[str, ...] = ()  # sqlite URIs in which no run may be left RUNNING
    watched: tuple[Path, ...] = ()  # folders whose files must not change
    owned: tuple[Path, ...] = ()  # paths under `watched` the command may change
    env: dict[str, str] = field(default_factory=dict)
    max_lines: int = MAX_LINES
    address_space: int | None = None  # bytes, as `ulimit -v` limits it

    def check(self, cwd: Path) -> Result:
        before = tree(*self.watched, owned=self.owned)
        result = pipeline(self.args, cwd, self.env, address_space=self.address_space)
        assert_clean(
            result, self.exit_code, says=self.says, secrets=self.secrets, stores=self.stores, max_lines=self.max_lines
        )
        after = tree(*self.watched, owned=self.owned)
        assert after == before, f"{self.args} changed files it does not own: {changed(before, after)}"
        return result


def assert_clean(
    result: Result,
    exit_code: int,
    says: Iterable[str] = (),
    secrets: Iterable[str] = (),
    stores: Iterable[str] = (),
    max_lines: int = MAX_LINES,
) -> None:
    shown = f"pipeline {' '.join(result.args)}: exit {result.exit_code}\n{result.output}"
    assert result.exit_code == exit_code, shown
    assert "Traceback" not in result.output, shown
    assert len(result.lines) <= max_lines, f"{len(result.lines)} lines; {shown}"
    for fragment in says:
        assert fragment in result.output, f"missing {fragment!r}; {shown}"
    for secret in secrets:
        assert secret not in result.output, f"printed the secret {secret!r}; {shown}"
    for uri in stores:
        assert not running_runs(uri), f"runs left RUNNING in {uri}: {running_runs(uri)}; {shown}"


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted({path for path in before.keys() | after.keys() if before.get(path) != after.get(path)})
