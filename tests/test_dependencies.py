"""What the package imports is what pyproject.toml declares, and the pinned releases live in one file.

Every third-party module `pipeline/` imports comes from a distribution pyproject.toml declares: in
`dependencies` when any code path of a plain install can import it, or in an extra when only an
optional feature does. An extra's module may be imported only inside a function (the feature that
needs it), never at a module's top, so `import pipeline.x` works without the extra.

constraints.txt pins torch, torchvision and MLflow (the newest tested releases); the Makefile,
deploy/Dockerfile and conda.yaml read it, and the docs' pins must agree with it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
PINNED = ("torch", "torchvision", "mlflow")
# A pin of one of the three; `make compat PINS="mlflow==3.14.0"` (another release in a floor's place) is no pin.
PIN = re.compile(r'(?<!PINS=")\b(torch|torchvision|mlflow)==([0-9][^\s`,"]*)')


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def third_party_imports(package: Path) -> dict[str, dict[str, bool]]:
    """Top-level third-party module -> {file: imported at the module's top}, for every import in
    `package` (function bodies and TYPE_CHECKING blocks too)."""
    found: dict[str, dict[str, bool]] = {}

    def record(module: str, path: Path, top: bool) -> None:
        name = module.split(".")[0]
        if name in sys.stdlib_module_names or name in ("__future__", "pipeline"):
            return
        files = found.setdefault(name, {})
        files[path.name] = files.get(path.name, False) or top

    def visit(node: ast.AST, path: Path, top: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            top = False
        if isinstance(node, ast.Import):
            for alias in node.names:
                record(alias.name, path, top)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            record(node.module, path, top)
        for child in ast.iter_child_nodes(node):
            visit(child, path, top)

    for path in sorted(package.rglob("*.py")):
        visit(ast.parse(path.read_text()), path, top=True)
    return found


def test_every_import_of_the_package_is_declared():
    core = _names(PYPROJECT["dependencies"])
    extras = {extra: _names(requirements) for extra, requirements in PYPROJECT["optional-dependencies"].items()}
    providers = packages_distributions()
    undeclared, unknown, extra_at_top = [], [], []
    for module, files in sorted(third_party_imports(REPO / "pipeline").items()):
        distributions = {canonicalize_name(d) for d in providers.get(module, [])}
        if not distributions:
            unknown.append(f"{module} ({', '.join(files)})")
        elif distributions & core:
            continue
        elif any(distributions & names for names in extras.values()):
            extra_at_top += [f"{module} at the top of {file}" for file, top in files.items() if top]
        else:
            undeclared.append(f"{module} (from {' or '.join(sorted(distributions))}; {', '.join(files)})")
    assert unknown == [], "no installed distribution provides these imports"
    assert undeclared == [], "imported by pipeline/ but not declared in pyproject.toml"
    assert extra_at_top == [], "an extra's module must be imported inside the function that needs it"


def test_every_import_of_the_tests_and_benchmarks_is_declared():
    """What `make test` runs imports only what the package or one of its extras declares: a test
    that imports a library pip happened to bring along breaks when that library's user drops it.
    The tests' and benchmarks' own modules (conftest, idx_files, calibration, ...) are local."""
    declared = _names(PYPROJECT["dependencies"]).union(*map(_names, PYPROJECT["optional-dependencies"].values()))
    providers = packages_distributions()
    folders = [REPO / "tests", REPO / "benchmarks"]
    local = {path.stem for folder in folders for path in folder.rglob("*.py")}
    local |= {path.name for folder in folders for path in folder.iterdir() if path.is_dir()}
    undeclared = []
    for folder in folders:
        for module, files in sorted(third_party_imports(folder).items()):
            distributions = {canonicalize_name(d) for d in providers.get(module, [])}
            if module not in local and not distributions & declared:
                undeclared.append(f"{module} ({folder.name}: {', '.join(files)})")
    assert undeclared == [], "imported by the tests or benchmarks but declared nowhere in pyproject.toml"


def test_the_scan_sees_imports_in_functions_and_at_the_top(tmp_path):
    """The scan the declaration test relies on: a deferred import is found, and told from a top one."""
    (tmp_path / "a.py").write_text("import os\nimport numpy as np\n\ndef f():\n    from yaml import safe_load\n")
    (tmp_path / "b.py").write_text("from pipeline import names\nimport numpy.linalg\n")
    assert third_party_imports(tmp_path) == {"numpy": {"a.py": True, "b.py": True}, "yaml": {"a.py": False}}


# --- the pins ------------------------------------------------------------------------------------------


def pins() -> dict[str, str]:
    """constraints.txt: name -> exact version."""
    found = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", line
            found[requirement.name] = specifier.version
    return found


def test_constraints_pin_exactly_the_heavy_three():
    assert sorted(pins()) == sorted(PINNED)


@pytest.mark.parametrize("path", ["Makefile", "deploy/Dockerfile"])
def test_installers_read_the_constraints_file(path):
    text = (REPO / path).read_text()
    assert "-r constraints.txt" in text and "-c constraints.txt" in text
    assert not PIN.search(text), f"{path} pins a release of its own"


def test_conda_env_reads_the_constraints_file_and_mirrors_the_rest():
    """conda.yaml's pip list: `-r constraints.txt` (pip resolves it beside conda.yaml, and MLflow's
    conversion for --env-manager virtualenv/uv passes the line on), then every other dependency of
    pyproject.toml as declared."""
    conda = yaml.safe_load((REPO / "conda.yaml").read_text())
    (pip,) = [d["pip"] for d in conda["dependencies"] if isinstance(d, dict)]
    assert pip[0] == "-r constraints.txt"
    others = [r for r in PYPROJECT["dependencies"] if canonicalize_name(Requirement(r).name) not in PINNED]
    assert pip[1:] == others


def test_the_docs_name_the_pinned_releases():
    """Every `name==version` of the three in the README and the docs, and the newest column of the
    compatibility table, is constraints.txt's."""
    expected = pins()
    wrong = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for name, version in PIN.findall(path.read_text()):
            if version != expected[name]:
                wrong.append(f"{path.relative_to(REPO)}: {name}=={version}")
    assert wrong == []
    table = (REPO / "docs" / "compatibility.md").read_text()
    newest = {
        row.split("|")[1].strip(): row.split("|")[3].strip()
        for row in table.splitlines()
        if row.startswith("| torch, torchvision") or row.startswith("| MLflow")
    }
    assert newest == {
        "torch, torchvision": f"{expected['torch']}, {expected['torchvision']}",
        "MLflow": expected["mlflow"],
    }
