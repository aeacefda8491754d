"""The shape DESIGN.md promises, checked on the source: imports flow one way (no cycle, counting the
imports made for type checking alone; executors never reach the runner; config and grid never reach
torch or mlflow)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
MODULES = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}


def _imports(tree: ast.AST, type_checking: bool = True) -> set[str]:
    """Every module imported anywhere in the file (function bodies too); with `type_checking` False,
    not those imported under TYPE_CHECKING (what the file loads when it runs)."""
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
            if node.module == "pipeline":
                found.update(f"pipeline.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


GRAPH = {
    name: {m.split(".")[1] for m in _imports(ast.parse(path.read_text())) if m.startswith("pipeline.")} - {name}
    for name, path in MODULES.items()
}


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

    cycles = [c for c in (cycle_from(name) for name in GRAPH) if c]
    assert not cycles, cycles


def test_imports_flow_one_way():
    assert "runner" not in GRAPH["executors"] and "cli" not in GRAPH["runner"]
    assert GRAPH["point"].isdisjoint({"runner", "executors", "cli", "report"})
    assert "mlflow" not in " ".join(_imports(ast.parse(MODULES["train"].read_text()), type_checking=False))
    # The grid file's checks run in milliseconds and the IDX reader is numpy alone: none of them
    # may pull torch or MLflow in.
    for name in ("config", "grid", "idx"):
        imports = _imports(ast.parse(MODULES[name].read_text()), type_checking=False)
        assert not any(m.split(".")[0] in ("torch", "mlflow") for m in imports), name
    assert GRAPH["idx"] <= {"errors"}


# --- the layers, as import-linter checks them (pyproject.toml's [tool.importlinter]) -----------------

REPO = PACKAGE.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # the test extra's import-linter, in this venv
CONTRACTS = (
    "Layers, top to bottom (docs/development.md)",
    "Analysis renders nothing",
    "Tracking never imports presentation",
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
    """Presentation reads analysis, analysis renders nothing, tracking never imports presentation:
    every contract kept, on this checkout's package."""
    out = _lint_imports(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in out.stdout, out.stdout


@pytest.mark.parametrize(
    "module, code, broken",
    [
        # The comparison (analysis) wording its own verdict, inside a function.
        (
            "compare",
            "def _said(comparison):\n    from pipeline.sentences import headline\n\n    return headline(comparison)\n",
            [CONTRACTS[0], CONTRACTS[1]],
        ),
        # The run logger reaching for the UI's view again.
        (
            "tracking",
            "def _page(url, parent_run_id):\n    from pipeline import view\n\n"
            "    return view.page(url, parent_run_id)\n",
            [CONTRACTS[0], CONTRACTS[2]],
        ),
    ],
)
def test_lint_imports_fails_on_an_import_against_the_layers(tmp_path, module, code, broken):
    """One import against the layers in a copy of the package, and lint-imports names the contracts it
    breaks, the import, and fails."""
    shutil.copytree(PACKAGE, tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    source = tmp_path / "pipeline" / f"{module}.py"
    source.write_text(source.read_text() + "\n\n" + code)
    out = _lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert [name for name in CONTRACTS if f"{name} BROKEN" in out.stdout] == broken, out.stdout
    assert f"pipeline.{module} is not allowed to import" in out.stdout, out.stdout


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
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    missing = []
    for module in modules:
        if module not in rows:
            own = f"test_{module.removesuffix('.py')}.py"
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
