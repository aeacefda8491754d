"""The shape DESIGN.md promises, checked on the source: imports flow one way (no cycle, counting the
imports made for type checking alone; executors never reach the runner; config and grid never reach
torch or mlflow)."""

from __future__ import annotations

import ast
import subprocess
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


GRAPH = {name: {m.split(".")[1] for m in _imports(ast.parse(path.read_text())) if m.startswith("pipeline.")}
         - {name} for name, path in MODULES.items()}


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
