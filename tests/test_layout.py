"""The shape DESIGN.md promises, checked on the source: imports flow one way (no cycle, counting the
imports made for type checking alone; executors never reach the runner; config and grid never reach
torch or mlflow)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"


def _dotted(path: Path) -> str:
    """A module's name below `pipeline`: "errors", "analysis.compare"; a package's, "analysis"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_dotted(p): p for p in PACKAGE.rglob("*.py") if _dotted(p)}


def _imports(tree: ast.AST, type_checking: bool = True) -> set[str]:
    """Every module imported anywhere in the file (function bodies too); with `type_checking` False,
    not those imported under TYPE_CHECKING (what the file loads when it runs). `from package import
    module` counts as an import of the module."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module.split(".")[0] == "pipeline":
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _own(imports: set[str]) -> set[str]:
    """The package's own modules among `imports`, by their names below `pipeline`."""
    return {m.removeprefix("pipeline.") for m in imports if m.startswith("pipeline.")} & set(MODULES)


GRAPH = {name: _own(_imports(ast.parse(path.read_text()))) - {name} for name, path in MODULES.items()}


def test_no_import_cycle():
    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for target in GRAPH.get(node, ()):
                if target == start:
                    return path + [start]
                if target not in path:
                    stack.append((target, path + [target]))
        return None

    assert "analysis.compare" in GRAPH["present.view"], "the graph lost the package's own imports"
    cycles = [c for c in (cycle_from(name) for name in GRAPH) if c]
    assert not cycles, cycles


def test_imports_flow_one_way():
    assert "sweep.runner" not in GRAPH["execution.executors"] and "cli" not in GRAPH["sweep.runner"]
    assert GRAPH["execution.point"].isdisjoint({"sweep.runner", "execution.executors", "cli", "present.report"})
    train = MODULES["training.train"]
    assert "mlflow" not in " ".join(_imports(ast.parse(train.read_text()), type_checking=False))
    # The grid file's checks run in milliseconds and the IDX reader is numpy alone: none of them
    # may pull torch or MLflow in.
    for name in ("settings.config", "settings.grid", "training.idx"):
        imports = _imports(ast.parse(MODULES[name].read_text()), type_checking=False)
        assert not any(m.split(".")[0] in ("torch", "mlflow") for m in imports), name
    assert GRAPH["training.idx"] <= {"errors"}


def test_the_folders_are_the_layers():
    """Every module of the package sits in a layer's sub-package, except the entry points and the two
    modules whose paths are promised outside the repository (docs/development.md, "Layers")."""
    with open(REPO / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["name"] == CONTRACTS[0])
    named = {part.strip() for layer in layers for part in layer.split("|")}
    top = {name for name in MODULES if "." not in name}
    assert top == named, "a top-level module or package that the layers contract does not name"
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert top - packages == {"__main__", "cli", "api", "errors", "model"}


# --- the layers, as import-linter checks them (pyproject.toml's [tool.importlinter]) -----------------

REPO = PACKAGE.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # the test extra's import-linter, in this venv
CONTRACTS = (
    "Layers, top to bottom (docs/development.md)",
    "Analysis renders nothing",
    "Tracking never imports presentation",
    "Inside tracking, the store is the one way to MLflow's tracking store",
    "Presentation renders: it never reaches the store",
    "Analysis never reaches MLflow",
)


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package under `root` with the contracts of `root`'s pyproject.toml: that
    copy of the package, first on the path, whatever is installed."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: `pip install -e '.[test]'` installs import-linter")
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layers_hold():
    """Presentation reads analysis and never the store, analysis renders nothing and never reaches
    MLflow, tracking never imports presentation: every contract kept, on this checkout's package."""
    out = _lint_imports(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in out.stdout, out.stdout


@pytest.mark.parametrize(
    "module, code, broken",
    [
        # The comparison (analysis) wording its own verdict, inside a function.
        (
            "analysis.compare",
            "def _said(comparison):\n    from pipeline.present.sentences import headline\n\n"
            "    return headline(comparison)\n",
            [CONTRACTS[0], CONTRACTS[1]],
        ),
        # The run logger reaching for the UI's view again.
        (
            "tracking.tracker",
            "def _page(url, parent_run_id):\n    from pipeline.present import view\n\n"
            "    return view.page(url, parent_run_id)\n",
            [CONTRACTS[0], CONTRACTS[2]],
        ),
        # The store reading sweeps back itself, above its own layer.
        (
            "tracking.store",
            "def _sweep(client, run_id):\n    from pipeline.tracking import records\n\n"
            "    return records.read_sweep(client, run_id)\n",
            [CONTRACTS[3]],
        ),
        # The saved view reading the store itself again (sweep/publish.py reads for it).
        (
            "present.view",
            "def _latest(client, name):\n    from pipeline.tracking.records import latest_sweep\n\n"
            "    return latest_sweep(client, name).info.run_id\n",
            [CONTRACTS[4]],
        ),
        # A presentation module asking MLflow itself.
        (
            "present.html_report",
            "def _grid(client, run_id):\n    from mlflow.artifacts import download_artifacts\n\n"
            "    return download_artifacts(run_id=run_id, artifact_path='grid')\n",
            [CONTRACTS[4]],
        ),
        # The gate reading its baseline sweep from MLflow again (records.baseline_sweep does).
        (
            "analysis.gate",
            "def _baseline(run_id):\n    from mlflow import MlflowClient\n\n"
            "    return MlflowClient().get_run(run_id)\n",
            [CONTRACTS[4], CONTRACTS[5]],  # presentation reads the gate: it would reach MLflow through it
        ),
        # The plain records growing an MLflow type: analysis and presentation would reach MLflow
        # through them, though neither imports it itself.
        (
            "base.runs",
            "def _from(run):\n    from mlflow.entities import Run\n\n    return isinstance(run, Run)\n",
            [CONTRACTS[4], CONTRACTS[5]],
        ),
        # An outcome that logs itself: the Reporter would reach the store through it.
        (
            "execution.outcomes",
            "def _log(outcome, client):\n    from pipeline.tracking.tracker import Tracker\n\n"
            "    return Tracker(client)\n",
            [CONTRACTS[4]],
        ),
    ],
)
def test_lint_imports_fails_on_an_import_against_the_layers(tmp_path, module, code, broken):
    """One import against the layers in a copy of the package, and lint-imports names the contracts it
    breaks, the import, and fails."""
    shutil.copytree(PACKAGE, tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    source = tmp_path / "pipeline" / MODULES[module].relative_to(PACKAGE)
    source.write_text(source.read_text() + "\n\n" + code)
    out = _lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert [name for name in CONTRACTS if f"{name} BROKEN" in out.stdout] == broken, out.stdout
    assert f"pipeline.{module} -> " in out.stdout, out.stdout  # the offending import, by its module


# Logs, timing dumps and profiles: what a local run leaves behind, never the repository's content.
LITTER_SUFFIXES = (".log", ".time", ".out", ".prof", ".pstats")


def _git(*args: str) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["git", *args], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if done.returncode == 128:  # not a git checkout (an unpacked sdist): nothing is tracked
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return done


def test_no_tracked_file_is_a_log_or_a_timing_dump():
    tracked = _git("ls-files").stdout.splitlines()
    assert tracked, "git ls-files listed nothing"
    assert [path for path in tracked if path.endswith(LITTER_SUFFIXES)] == []


def test_gitignore_keeps_logs_and_timing_dumps_out():
    """A new log anywhere in the tree is ignored, so `git add -A` cannot commit one."""
    candidates = [f"busy{suffix}" for suffix in LITTER_SUFFIXES] + ["docs/gpu/run.log", "benchmarks/scale.time"]
    ignored = _git("check-ignore", "--no-index", *candidates).stdout.splitlines()
    assert sorted(ignored) == sorted(candidates)


# --- where each module is tested (docs/development.md's "Tests by module") ---------------------------

DEVELOPMENT = REPO / "docs" / "development.md"
TESTS = REPO / "tests"


def _test_map() -> dict[str, list[str]]:
    """The "Tests by module" table: each row's module file, and the test files it names."""
    section = DEVELOPMENT.read_text().split("\n## Tests by module\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            rows[cells[0].strip("`")] = [name.strip().strip("`") for name in cells[1].split(",")]
    return rows


def test_every_module_has_a_row_in_the_test_map_and_every_row_names_test_files_that_exist():
    rows = _test_map()
    assert len(rows) > 10, "docs/development.md's 'Tests by module' table was not found"
    modules = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.parent == PACKAGE or path.name != "__init__.py"  # a layer's __init__ is its docstring
    )
    missing = []
    for module in modules:
        if module not in rows:
            own = f"test_{Path(module).stem}.py"
            named = f"`{own}`" if (TESTS / own).exists() else "`test_WHERE_ITS_TESTS_ARE.py`"
            missing.append(f"| `{module}` | {named} |")
    assert not missing, (
        "pipeline/ has modules with no row in docs/development.md's 'Tests by module' table; "
        "add, in alphabetical order:\n" + "\n".join(missing)
    )
    stale = sorted(set(rows) - set(modules))
    assert not stale, f"rows for modules that pipeline/ no longer has; remove them: {stale}"
    absent = {module: [name for name in names if not (TESTS / name).is_file()] for module, names in rows.items()}
    absent = {module: names for module, names in absent.items() if names}
    assert not absent, f"rows naming test files that tests/ does not hold: {absent}"


def test_no_test_of_make_test_took_longer_than_the_limit():
    """tests/durations.json (`make durations`): every recorded test of the fast tier took at most
    FAST_TEST_LIMIT_S; a longer one is made shorter or marked slow. Every file in the record still
    exists (a stale record orders files that are gone)."""
    from conftest import DURATIONS, FAST_TEST_LIMIT_S, recorded_durations

    durations = recorded_durations()
    assert {"fast", "slow"} <= set(durations), f"{DURATIONS}: run `make durations` and commit it"
    over = {test: spent for test, spent in durations["fast"].items() if spent > FAST_TEST_LIMIT_S}
    assert not over, f"over {FAST_TEST_LIMIT_S} s in `make test`: make them shorter or mark them slow: {over}"
    files = {test.split("::")[0] for tier in durations.values() for test in tier}
    assert all((DURATIONS.parents[1] / file).exists() for file in files), files
