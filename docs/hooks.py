"""MkDocs hook: pages say `<!-- grid-keys -->` where the grid-key reference goes, and get the table
generated from the one table of keys (pipeline.config.KEYS), so the docs cannot drift from the code."""

from __future__ import annotations

from typing import Any

MARK = "<!-- grid-keys -->"


def grid_keys_table() -> str:
    from pipeline.config import DEFAULTS, KEYS
    from pipeline.grid import format_value

    rows = ["| key | default | what it does |", "|---|---|---|"]
    for name, key in KEYS.items():
        default = format_value(DEFAULTS[name])
        rows.append(f"| `{name}` | `{default}` | {key.help} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARK, grid_keys_table()) if MARK in markdown else markdown
