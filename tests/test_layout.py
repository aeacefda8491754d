"""The shape DESIGN.md promises, checked on the source: imports flow one way (no cycle, executors
never reach the runner, config and grid never reach torch or mlflow) and nothing grows too big."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
MODULES = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}


def _runtime_imports(tree: ast.AST) -> set[str]:
    """Every module imported anywhere in the file (function bodies too), except under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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


GRAPH = {name: {m.split(".")[1] for m in _runtime_imports(ast.parse(path.read_text())) if m.startswith("pipeline.")}
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
    assert "mlflow" not in " ".join(_runtime_imports(ast.parse(MODULES["train"].read_text())))
    # idx decodes on a thread while torch loads, and the chart painter is a process of its own:
    # neither may pull torch or MLflow in.
    for name in ("config", "grid", "idx", "charts"):
        imports = _runtime_imports(ast.parse(MODULES[name].read_text()))
        assert not any(m.split(".")[0] in ("torch", "mlflow") for m in imports), name
    assert GRAPH["idx"] <= {"errors"} and GRAPH["charts"] <= {"grid"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_sizes(name):
    """Modules up to 400 lines, classes up to 150, functions up to 90 (the training loop may stay whole)."""
    source = MODULES[name].read_text()
    assert len(source.splitlines()) <= 400, f"{name}.py has {len(source.splitlines())} lines"
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if isinstance(node, ast.ClassDef):
            assert length <= 150, f"class {node.name} in {name}.py has {length} lines"
        elif node.name != "_fit":
            assert length <= 90, f"{node.name} in {name}.py has {length} lines"
