"""Writing files without touching what is not ours: temporaries under unique names beside their
target, renamed over it atomically (as git does), removed when the write fails; and folders checked
for writing before any work that would end in writing there.

A fixed temporary name (`X.tmp`) is a file a user may own: it is never used.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.errors import UserError


@contextlib.contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """A new, uniquely named empty file beside `target` for the caller to write (torch.save,
    savefig, ...); renamed over `target` when the block ends, removed when it raises. The file gets
    the mode a plain new file would (0666 less the umask), or the mode of the `target` it replaces."""
    target = Path(target)
    for _ in range(100):
        temporary = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
        try:  # O_EXCL: never an existing file; mode 0o666 is narrowed by the umask, as open() does
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no unique temporary name beside {target}")
    try:
        yield temporary
        if target.exists():  # after the write: a read-only target's mode would refuse it
            os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def folder_lock(folder: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """This process alone in the block, among those that lock `folder`: an exclusive flock on the
    folder itself (no lock file of its own to leave behind), released when the block ends or the
    process dies. Where another process holds it, `waiting` is called once, then the block waits."""
    import fcntl

    handle = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing the last descriptor releases the lock


def atomic_write(target: Path, data: bytes | str) -> None:
    """`target` holds `data` (str as UTF-8) in full, or is left as it was: a reader never sees half."""
    with replacing(target) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def check_writable(folder: Path, what: str, fix: str) -> None:
    """UserError unless files can be created in `folder`, or, when it does not exist yet, in the
    nearest folder above it that does (nothing on the way may be a file). os.access alone is not
    enough: root passes it on a read-only file system, and where modes do not apply; so a uniquely
    named file is created there and removed again. `what` names the folder for the user ("the
    checkpoint folder", "--out"), `fix` says what to do."""
    folder = Path(folder)
    for existing in (folder, *folder.parents):
        if existing.exists():
            break
    if not existing.is_dir():
        where = "" if existing == folder else f" ({existing} is a file)"
        raise UserError(f"{what} {folder}: not a folder{where}; {fix}")
    try:
        probe(existing)
    except OSError as exc:
        raise UserError(
            f"{what} {folder}: cannot write in {existing} ({exc.strerror or exc.__class__.__name__}); {fix}"
        ) from None


def probe(folder: Path) -> None:
    """Create a uniquely named file in `folder` and remove it again: OSError (its errno says why)
    where nothing can be written there. os.access alone is not enough: it answers yes to root on a
    read-only file system, and where modes do not apply."""
    handle, name = tempfile.mkstemp(dir=folder, prefix=".pipeline-probe-", suffix=".tmp")
    os.close(handle)
    os.unlink(name)


def free_bytes(folder: Path) -> tuple[Path, int, int] | None:
    """(the nearest existing folder at or above `folder`, its file system's device, its free bytes),
    or None when that cannot be told."""
    for existing in (Path(folder), *Path(folder).parents):
        if existing.is_dir():
            try:
                return existing, os.stat(existing).st_dev, shutil.disk_usage(existing).free
            except OSError:
                return None
    return None
