"""The example grids shipped inside the package, and `pipeline init`, which copies them into a folder.

The grids live in pipeline/examples, as package data, so that a `pip install` has them as much as a
clone does; the repository's `experiments/` is a symlink to that folder, not a second copy. Beside
them is their JSON Schema (pipeline.settings.schema), which each grid names in its first line, so an editor
checks the copies too.

Copying is all or nothing: every destination is checked first, then every file is staged beside
its destination, then each is moved into place (a rename, which does not fail half-way). A refusal
or a failed write leaves the folder as it was, and a folder this call created is removed again.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pipeline.errors import UserError

EXAMPLES = "examples"  # the package folder that holds them
SHIPPED_SUFFIXES = (".yaml", ".json")
FIRST_GRID = "quickstart.yaml"  # what a new user validates and runs first
DEFAULT_FOLDER = Path("experiments")  # where the repository keeps them, and where init writes them


def shipped() -> dict[str, bytes]:
    """Every shipped example file, name → content, in name order, read through importlib.resources
    (so from a wheel, a zip or a source tree alike)."""
    folder = resources.files("pipeline").joinpath(EXAMPLES)
    return {
        item.name: item.read_bytes()
        for item in sorted(folder.iterdir(), key=lambda item: item.name)
        if item.is_file() and item.name.endswith(SHIPPED_SUFFIXES)
    }


@dataclass(frozen=True)
class Copied:
    """What `write_examples` did: the files it created, those it overwrote (with `force`), and those
    already there with the same content."""

    folder: Path
    written: tuple[Path, ...]
    overwritten: tuple[Path, ...]
    unchanged: tuple[Path, ...]


def write_examples(folder: Path, force: bool = False) -> Copied:
    """Copy every shipped example into `folder` (created when missing). A file already there with the
    same content is left alone; one that differs is overwritten only with `force`. Raises UserError,
    having written nothing, when `folder` is not a folder, cannot be written, or holds a different
    file (without `force`) or a folder where an example goes."""
    files = shipped()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder}: is a file, not a folder; name a folder, e.g. pipeline init {DEFAULT_FOLDER}")
    todo: dict[Path, bytes] = {}
    unchanged: list[Path] = []
    differ: list[Path] = []
    for name, content in files.items():
        target = folder / name
        if target.is_dir():
            raise UserError(
                f"{target}: is a folder where the example {name} goes; move it away, or choose "
                "another folder (pipeline init DIR)"
            )
        if not target.exists():
            todo[target] = content
        elif _read(target) == content:
            unchanged.append(target)
        else:
            differ.append(target)
            todo[target] = content
    if differ and not force:
        names = ", ".join(str(path) for path in differ)
        raise UserError(
            f"{names}: already there and different from the shipped example; pass --force to "
            "overwrite, or choose another folder (pipeline init DIR)"
        )
    _write_all(folder, todo)
    return Copied(folder, tuple(path for path in todo if path not in differ), tuple(differ), tuple(unchanged))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(
            f"{path}: cannot read it ({exc.strerror or exc.__class__.__name__}); check its "
            "permissions, or choose another folder (pipeline init DIR)"
        ) from None


def _write_all(folder: Path, contents: dict[Path, bytes]) -> None:
    """Write every file or none: stage each beside its destination, then rename them into place."""
    created = [path for path in (folder, *folder.parents) if not path.exists()]
    staged: dict[Path, Path] = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for target, content in contents.items():
            staged[target] = _stage(target, content)
    except BaseException as exc:  # a failed write, or Ctrl-C: no staged file or new folder stays behind
        for stage in staged.values():
            stage.unlink(missing_ok=True)
        for path in created:  # deepest first; only folders this call made, and only while empty
            try:
                path.rmdir()
            except OSError:
                break
        if not isinstance(exc, OSError):
            raise
        raise UserError(
            f"{folder}: cannot write there ({exc.strerror or exc.__class__.__name__}); nothing was "
            "written; choose a folder you can write to (pipeline init DIR)"
        ) from None
    for target, stage in staged.items():
        os.replace(stage, target)


def _stage(target: Path, content: bytes) -> Path:
    """`content` in a new hidden file beside `target`, created with the user's umask like any file
    they save (a temporary file's would be private)."""
    stage = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(stage, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
    except BaseException:
        stage.unlink(missing_ok=True)
        raise
    return stage
