"""The docs site: it builds with --strict, and its reference pages hold every command, option and grid key.

The command-line and grid-key pages are generated from the code (mkdocs-click, docs/hooks.py), so
these tests fail when the generation stops covering something, not when a hand-written page lags."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run([str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(folder)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    return folder


def _page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text(encoding="utf-8"))


def test_the_cli_reference_lists_every_command_and_option(site):
    from pipeline.cli import main

    page = _page(site, "reference/cli")
    missing = []
    for name, command in main.commands.items():
        if f"pipeline {name}" not in page:
            missing.append(f"pipeline {name}")
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                missing += [f"pipeline {name} {opt}" for opt in param.opts if opt not in page]
    assert missing == []


def test_the_grid_key_reference_lists_every_key_with_its_help(site):
    from pipeline.config import KEYS

    page = _page(site, "reference/grid-keys")
    assert [name for name, key in KEYS.items() if name not in page or key.help not in page] == []
