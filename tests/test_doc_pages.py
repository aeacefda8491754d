"""The pages users look for hold what the code does: every environment variable the pipeline reads
is on docs/environment.md, the Python API reference covers pipeline.api, and every `error:` line
docs/troubleshooting.md quotes is one the real CLI prints (each is produced here)."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REAL_DATA, REPO, free_port, invoke, isolated

DOCS = REPO / "docs"
QUICKSTART = REPO / "experiments" / "quickstart.yaml"

# --- docs/environment.md -----------------------------------------------------------------------------

# A PIPELINE_* name anywhere in the source counts (a constant that holds one is read through it);
# other names count where the source reads them by their literal name.
_PIPELINE_NAME = re.compile(r"\bPIPELINE_[A-Z][A-Z0-9_]*\b")
_LITERAL_READS = re.compile(
    r"""(?:os\.environ\.get\(|os\.environ\[|os\.getenv\(|envvar=)\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|["']([A-Z][A-Z0-9_]*)["']\s+(?:not\s+)?in\s+os\.environ"""
)


def variables_read(source: str) -> set[str]:
    """The environment variables a module's source reads."""
    names = set(_PIPELINE_NAME.findall(source))
    names |= {a or b for a, b in _LITERAL_READS.findall(source)}
    return names


def test_the_scan_finds_a_variable_however_it_is_read():
    source = (
        'SHARE = "PIPELINE_NEW_SHARE"\n'
        'a = os.environ.get("PIPELINE_DIRECT")\n'
        'b = os.getenv("SOME_TOOL_HOME")\n'
        "c = os.environ['OTHER_ONE']\n"
        'if "COLUMNS" not in os.environ: pass\n'
        '@click.option("--store", envvar="STORE_URI")\n'
        "d = os.environ.get(SHARE)\n"
    )
    assert variables_read(source) == {
        "PIPELINE_NEW_SHARE",
        "PIPELINE_DIRECT",
        "SOME_TOOL_HOME",
        "OTHER_ONE",
        "COLUMNS",
        "STORE_URI",
    }


def test_every_variable_the_pipeline_reads_is_on_the_environment_page():
    read = set()
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        read |= variables_read(path.read_text(encoding="utf-8"))
    # The scan still sees what the pipeline is known to read (a scan that finds nothing passes anything).
    assert {"PIPELINE_DATA_DIR", "PIPELINE_CONTENDED_SHARE", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"} <= read
    page = (DOCS / "environment.md").read_text(encoding="utf-8")
    assert sorted(name for name in read if f"`{name}`" not in page) == []


# --- docs/reference/api.md ---------------------------------------------------------------------------


def _public_names() -> list[str]:
    from pipeline import api

    return [
        name
        for name, value in vars(api).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == api.__name__
    ]


def test_the_api_reference_lists_every_public_name_of_pipeline_api():
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    assert "::: pipeline.api" in page
    listed = set(re.findall(r"^\s+- (\w+)$", page, re.MULTILINE))
    assert {"run", "compare", "SweepRun"} <= set(_public_names())
    assert sorted(set(_public_names()) - listed) == []


@pytest.mark.parametrize("name", ["run", "compare"])
def test_every_argument_of_the_api_is_in_its_docstring(name):
    """The reference renders each function's "Args:" section: an argument added without a line
    there would be on the page without a word about it."""
    from pipeline import api

    function = getattr(api, name)
    args = inspect.getdoc(function).split("Args:", 1)[-1].split("Raises:", 1)[0]
    described = set(re.findall(r"^    (\w+):", args, re.MULTILINE))
    assert "Args:" in inspect.getdoc(function)
    assert sorted(set(inspect.signature(function).parameters) - described) == []


def test_every_field_of_sweeprun_has_a_docstring():
    """Fields are documented by the string under each (what mkdocstrings renders), not by comments."""
    tree = ast.parse((REPO / "pipeline" / "api.py").read_text(encoding="utf-8"))
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "SweepRun"]
    undocumented = []
    for field, after in zip(cls.body, [*cls.body[1:], None]):
        if isinstance(field, ast.AnnAssign):
            documented = (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            )
            if not documented:
                undocumented.append(field.target.id)
    assert undocumented == []


# --- docs/troubleshooting.md -------------------------------------------------------------------------

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
BAD_GRID = "grid:\n  batch_siz: [100, 1000]\n"


def quoted_errors(text: str) -> list[str]:
    """The `error: ` lines in a page's fenced blocks."""
    return [
        line.strip()
        for block in FENCE.findall(text)
        for line in block.splitlines()
        if line.strip().startswith("error: ")
    ]


def _bad_grid_key(folder: Path, patch: pytest.MonkeyPatch) -> str:
    (folder / "my.yaml").write_text(BAD_GRID)
    return invoke("validate", "my.yaml").output


def _no_grid_file(folder: Path, patch: pytest.MonkeyPatch) -> str:
    return invoke("run", "my-grid.yaml").output


def _no_data(folder: Path, patch: pytest.MonkeyPatch) -> str:
    return invoke("run", str(QUICKSTART), "--data-dir", "data").output


def _server_down(folder: Path, patch: pytest.MonkeyPatch) -> str:
    port = free_port()  # nothing listens there; the page says 5000, the port users start a server on
    output = invoke("run", str(QUICKSTART), "--tracking-uri", f"http://127.0.0.1:{port}").output
    return output.replace(f"127.0.0.1:{port}", "127.0.0.1:5000")


def _store_is_a_folder(folder: Path, patch: pytest.MonkeyPatch) -> str:
    return invoke("run", str(QUICKSTART), "--tracking-uri", "sqlite:////tmp").output


def _store_in_memory(folder: Path, patch: pytest.MonkeyPatch) -> str:
    """Shown on the page as run where the docs run it (/home/you/pipeline)."""
    output = invoke("run", str(QUICKSTART), "--tracking-uri", "sqlite://").output
    return output.replace(str(folder.resolve()), "/home/you/pipeline")


def _control_character_in_a_name(folder: Path, patch: pytest.MonkeyPatch) -> str:
    return invoke("run", str(QUICKSTART), "--experiment", "night\tly").output


def _not_a_uri(folder: Path, patch: pytest.MonkeyPatch) -> str:
    return invoke("run", str(QUICKSTART), "--tracking-uri", "http://[::1:5000").output


def _data_file_a_device(folder: Path, patch: pytest.MonkeyPatch) -> str:
    (folder / "data").mkdir()
    (folder / "data" / "train-images-idx3-ubyte").symlink_to("/dev/zero")
    return invoke("run", str(QUICKSTART), "--data-dir", "data").output


def _read_only_artifact_folder(folder: Path, patch: pytest.MonkeyPatch) -> str | None:
    """A new experiment run from a read-only mount (its artifacts would go to ./mlruns there), the
    store elsewhere, on the real data (the quickstart's sizes); shown on the page at /mnt/ro. None
    where no mount can be made here, or the real data is missing."""
    mount_point = folder / "ro"
    mount_point.mkdir()
    if not REAL_DATA.is_dir() or not _mounted_read_only(mount_point):
        return None
    patch.setenv("PIPELINE_DATA_DIR", str(REAL_DATA))
    try:
        patch.chdir(mount_point)
        output = invoke("run", str(QUICKSTART), "--tracking-uri", f"sqlite:///{folder / 'mlflow.db'}").output
    finally:
        patch.chdir(folder)
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)
    return output.replace(str(mount_point), "/mnt/ro")


def _mounted_read_only(mount_point: Path) -> bool:
    """A 1 MB read-only tmpfs mounted at `mount_point` (root ignores file modes); False where this
    machine refuses."""
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount_point)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _read_only_store(folder: Path, patch: pytest.MonkeyPatch) -> str | None:
    """A store on a read-only mount (root ignores file modes), shown on the page at /mnt/ro; None
    where no mount can be made here."""
    mount_point = folder / "ro"
    mount_point.mkdir()
    if not _mounted_read_only(mount_point):
        return None
    try:
        output = invoke("run", str(QUICKSTART), "--tracking-uri", f"sqlite:///{mount_point / 'mlflow.db'}").output
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)
    return output.replace(str(mount_point), "/mnt/ro")


def _too_little_address_space(folder: Path, patch: pytest.MonkeyPatch) -> str:
    """In a process of its own under `ulimit -v` 1.5 GiB, as the page shows it: loading torch failed
    with ~100 lines of traceback; now one line, exit 1, nothing written."""
    from faults import pipeline

    limited = pipeline(["run", str(QUICKSTART), "--dry-run"], folder, address_space=1536 * 2**20)
    assert limited.exit_code == 1 and len(limited.lines) == 1, limited.output
    assert list(folder.iterdir()) == []
    return limited.output


def _bad_contended_share(folder: Path, patch: pytest.MonkeyPatch) -> str:
    patch.setenv("PIPELINE_CONTENDED_SHARE", "2")
    return invoke("run", str(QUICKSTART), "--tracking-uri", f"sqlite:///{folder / 'mlflow.db'}").output


def _misspelt_option(folder: Path, patch: pytest.MonkeyPatch) -> str:
    from click.testing import CliRunner

    from pipeline.cli import main

    return CliRunner().invoke(main, ["run", str(QUICKSTART), "--experimen", "nightly"], prog_name="pipeline").output


CASES = {
    "misspelt option": _misspelt_option,
    "bad grid key": _bad_grid_key,
    "no grid file": _no_grid_file,
    "no data": _no_data,
    "server down": _server_down,
    "store is a folder": _store_is_a_folder,
    "store in memory": _store_in_memory,
    "not a URI": _not_a_uri,
    "control character in a name": _control_character_in_a_name,
    "read-only store": _read_only_store,
    "read-only artifact folder": _read_only_artifact_folder,
    "data file a device": _data_file_a_device,
    "bad contended share": _bad_contended_share,
    "too little address space": _too_little_address_space,
}
# Where a case cannot be made on this machine, the page's lines holding its mark go unchecked.
CANNOT_BE_MADE_MARKS = {
    "read-only store": "tracking store sqlite:////mnt/ro/mlflow.db",
    "read-only artifact folder": "artifact folder /mnt/ro/mlruns",
}
# Lines made by a slow test instead (a cluster of its own), which checks that the page quotes them.
MADE_BY_SLOW_TESTS = ("Ray could not join it",)


@pytest.fixture(scope="module")
def produced(tmp_path_factory, data_dir) -> dict[str, str | None]:
    """Each case's `error:` line, from the real CLI, each in a folder of its own (None: a case this
    machine cannot make)."""
    lines: dict[str, str | None] = {}
    for name, case in CASES.items():
        folder = tmp_path_factory.mktemp(name.replace(" ", "-"))
        with isolated(folder), pytest.MonkeyPatch.context() as patch:
            patch.setenv("PIPELINE_DATA_DIR", str(data_dir))  # found, where a case is not about the data
            output = case(folder, patch)
        if output is None:
            lines[name] = None
            continue
        found = [line for line in output.splitlines() if line.startswith("error: ")]
        assert len(found) == 1, (name, output)
        lines[name] = found[0]
    return lines


@pytest.mark.parametrize("case", CASES)
def test_the_troubleshooting_page_quotes_the_error_the_cli_prints(case, produced):
    if produced[case] is None:
        pytest.skip(f"{case}: cannot be made on this machine")
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert produced[case] in quoted_errors(page)


def test_every_error_the_troubleshooting_page_quotes_is_produced(produced):
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    excused = [CANNOT_BE_MADE_MARKS[case] for case, line in produced.items() if line is None]
    excused += MADE_BY_SLOW_TESTS
    quoted = [line for line in quoted_errors(page) if not any(mark in line for mark in excused)]
    assert len(quoted) >= len([line for line in produced.values() if line is not None])
    assert sorted(set(quoted) - set(produced.values())) == []


def test_the_grid_the_page_shows_is_the_one_refused():
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert f"```yaml\n# my.yaml\n{BAD_GRID}```" in page
