"""pipeline/base/files.py: unique temporaries beside their target, atomic renames, folders probed for writing."""

from __future__ import annotations

import os
import stat

import pytest

from pipeline.base.files import atomic_write, check_writable, replacing
from pipeline.errors import UserError


def test_a_write_leaves_the_target_and_nothing_beside_it(tmp_path):
    (tmp_path / "results.tmp").write_text("the user's own")  # the old fixed temporary name
    target = tmp_path / "results.jsonl"
    atomic_write(target, "one\n")
    atomic_write(target, b"two\n")
    assert target.read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "results.tmp"]
    assert (tmp_path / "results.tmp").read_text() == "the user's own"


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "model.pt"
    target.write_bytes(b"last good")
    with pytest.raises(RuntimeError), replacing(target) as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"last good"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_a_folder_that_is_a_file_or_below_one_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match=r"--out .*notes\.txt: not a folder; pass a folder"):
        check_writable(tmp_path / "notes.txt", "--out", "pass a folder")
    with pytest.raises(UserError, match=r"notes\.txt/charts: not a folder \(.*notes\.txt is a file\)"):
        check_writable(tmp_path / "notes.txt" / "charts", "--out", "pass a folder")


def test_a_folder_is_probed_not_only_asked(tmp_path):
    """Root passes os.access almost everywhere; the probe file is what tells (/proc takes no files)."""
    with pytest.raises(UserError, match="cannot write in /proc"):
        check_writable(os.path.join("/proc", "charts"), "--out", "pass a folder")
    check_writable(tmp_path / "new" / "deeper", "--out", "pass a folder")  # made later, below a writable one
    assert list(tmp_path.iterdir()) == []  # the probe is gone, and nothing was created


def test_a_written_file_has_a_plain_files_mode_or_keeps_the_one_it_replaces(tmp_path):
    """A new file is 0666 less the umask, as `open()` would make it (the report a user shares must not
    be 0600); a replaced file keeps its own mode."""
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "report.html"
        atomic_write(fresh, "x")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        private = tmp_path / "private.csv"
        private.write_text("old")
        private.chmod(0o600)
        atomic_write(private, "new")
        assert private.read_text() == "new" and stat.S_IMODE(private.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["private.csv", "report.html"]  # no temporary left
