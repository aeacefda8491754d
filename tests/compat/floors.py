"""Print pip constraints that pin each dependency in pyproject.toml to its declared floor.

`make compat` installs the package under these constraints, so the floor venv holds the oldest
release of everything pyproject.toml declares (`name>=X` becomes `name==X`). A dependency declared
without a `>=` floor is left to pip. Each floor must name a real release: pip refuses otherwise.
A NAME==VERSION argument replaces that dependency's floor (`make compat PINS="mlflow==3.14.0"`
tries another release).

Usage: python3 tests/compat/floors.py PYPROJECT [NAME==VERSION ...]
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# name[extras] then the specifiers, up to an environment marker
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")
FLOOR = re.compile(r">=\s*([0-9][^,\s]*)")


def floors(dependencies: list[str]) -> list[str]:
    pins = []
    for requirement in dependencies:
        match = REQUIREMENT.match(requirement)
        if not match:
            raise SystemExit(f"tests/compat/floors.py: cannot read the requirement {requirement!r}")
        name, specifiers = match.groups()
        floor = FLOOR.search(specifiers)
        if floor:
            pins.append(f"{name}=={floor.group(1)}")
    return pins


def key(pin: str) -> str:
    return re.split(r"[=<>!~ ]", pin, maxsplit=1)[0].lower().replace("_", "-")


def main() -> None:
    path, *overrides = sys.argv[1:] or ["pyproject.toml"]
    project = tomllib.loads(Path(path).read_text(encoding="utf-8"))["project"]
    pins = {key(pin): pin for pin in floors(project["dependencies"])}
    pins.update({key(pin): pin for pin in overrides})
    print("\n".join(pins.values()))


if __name__ == "__main__":
    main()
