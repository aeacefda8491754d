"""MkDocs hook: the reference pages are generated from the code, so the docs cannot drift from it.

A page says `<!-- grid-keys -->` where the grid-key reference table goes and `<!-- grid-key-values -->`
where the short table of keys, values and defaults goes (both from the one table of keys,
pipeline.settings.config.KEYS: what a key accepts is its check's own words, the words its errors use),
`<!-- later-grid-keys -->` where a sentence names the keys added after runs were recorded, and
`<!-- cli-reference -->` where the command-line reference goes (from the Click commands of
pipeline.cli).

The command-line reference is built from Click's public help API, the calls `pipeline COMMAND
--help` itself makes: each option's left column (its names and metavar) and its `[default: ...]`
come from Click, so the page and --help say the same. (mkdocs-click, used before, printed Click's
"no default" sentinel as a default, dropped metavars and cut summaries at the docstring's first line
break.)
"""

from __future__ import annotations

import html
import inspect
import sys
from collections.abc import Callable
from typing import Any

import click

GRID_KEYS = "<!-- grid-keys -->"
GRID_KEY_VALUES = "<!-- grid-key-values -->"
LATER_KEYS = "<!-- later-grid-keys -->"
CLI_REFERENCE = "<!-- cli-reference -->"
PROG_NAME = "pipeline"


def grid_keys_table() -> str:
    """Every grid key: what it accepts, its default and what it does (the reference page)."""
    from pipeline.settings.config import KEYS

    rows = ["| key | values | default | what it does |", "|---|---|---|---|"]
    rows += [f"{row} {cell(key.help)} |" for row, key in zip(_key_rows(), KEYS.values())]
    return "\n".join(rows) + "\n"


def grid_key_values_table() -> str:
    """Every grid key: what it accepts and its default (the grids page, beside a link to the reference)."""
    rows = ["| key | values | default |", "|---|---|---|", *_key_rows()]
    return "\n".join(rows) + "\n"


def later_keys() -> str:
    """The keys added after runs were recorded (config.Key.later), in a sentence: `a`, `b`, `c`."""
    from pipeline.settings.config import KEYS

    return ", ".join(f"`{name}`" for name, key in KEYS.items() if key.later)


def _key_rows() -> list[str]:
    """Each grid key's row start, `| name | values | default |`, in the table's order."""
    from pipeline.settings.config import DEFAULTS, KEYS
    from pipeline.settings.grid import format_value

    return [
        f"| `{name}` | {cell(key.check.allowed)} | `{format_value(DEFAULTS[name])}` |" for name, key in KEYS.items()
    ]


def cli_reference() -> str:
    """The `pipeline` group and each of its commands: help text, usage, options, subcommands."""
    from pipeline.cli import main

    # A context is what --help formats with (it carries -h and show_default); building one runs no
    # command and parses no arguments.
    root = click.Context(main, info_name=PROG_NAME, **main.context_settings)
    return "\n".join(command_section(root, level=2))


def command_section(ctx: click.Context, level: int) -> list[str]:
    """One command's section, then (for a group) each visible subcommand's, one level deeper. The
    heading is the full command path, and so is its anchor (`#pipeline-run`)."""
    command = ctx.command
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    heading = f"{'#' * level} {ctx.command_path} {{ #{anchor(ctx.command_path)} }}"  # attr_list sets the id
    lines = [
        heading,
        "",
        *help_markdown(command.help),
        "**Usage:**",
        "",
        "```text",
        usage,
        "```",
        "",
        *options_table(ctx),
        *help_markdown(command.epilog),
    ]
    subcommands = visible_subcommands(ctx)
    if subcommands:
        lines += ["**Commands:**", "", "| Command | What it does |", "|---|---|"]
        lines += [
            f"| [{name}](#{anchor(f'{ctx.command_path} {name}')}) | {cell(summary(sub))} |" for name, sub in subcommands
        ]
        lines.append("")
        for name, sub in subcommands:
            lines += command_section(click.Context(sub, info_name=name, parent=ctx, **sub.context_settings), level + 1)
    return lines


def visible_subcommands(ctx: click.Context) -> list[tuple[str, click.Command]]:
    """A group's commands in the order `pipeline --help` lists them, hidden ones left out as there."""
    group = ctx.command
    if not isinstance(group, click.Group):
        return []
    found = [(name, group.get_command(ctx, name)) for name in group.list_commands(ctx)]
    return [(name, sub) for name, sub in found if sub is not None and not sub.hidden]


def summary(command: click.Command) -> str:
    """The command's whole summary: its short_help, else its docstring's first sentence. Click cuts
    it to the terminal's width in `pipeline --help`; a page has room for all of it."""
    return command.get_short_help_str(limit=sys.maxsize)


def anchor(command_path: str) -> str:
    """A command's anchor on the page, `pipeline-run`: the one mkdocs-click gave it, so old links hold."""
    return command_path.replace(" ", "-")


def help_markdown(text: str | None) -> list[str]:
    """A Click help text as Markdown: each paragraph on one line, as --help rewraps it; a paragraph
    that starts with Click's no-rewrap marker (\\b) is kept line for line in a text block. What
    follows a form feed (\\f) is not help, as in --help."""
    if not text:
        return []
    lines: list[str] = []
    for paragraph in inspect.cleandoc(text).partition("\f")[0].split("\n\n"):
        if paragraph.startswith("\b"):
            lines += ["```text", paragraph.removeprefix("\b").strip("\n"), "```", ""]
        elif paragraph.strip():
            lines += [" ".join(paragraph.split()), ""]
    return lines


def options_table(ctx: click.Context) -> list[str]:
    """The options --help lists (not the hidden ones), one row each: the left column of --help (names
    and metavar), the help with Click's other notes (range, env var), and the default --help shows
    (none when it shows none)."""
    rows = []
    for param in ctx.command.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is None:
            continue
        extra = param.get_help_extra(ctx)
        notes = [f"env var: {', '.join(extra['envvars'])}"] if "envvars" in extra else []
        notes += [extra["range"]] if "range" in extra else []
        description = " ".join([param.help or "", *(f"[{note}]" for note in notes)]).strip()
        rows.append(f"| {whole(record[0])} | {cell(description)} | {default_cell(param, extra)} |")
    if not rows:
        return []
    return ["**Options:**", "", "| Option | What it does | Default |", "|---|---|---|", *rows, ""]


def default_cell(option: click.Option, extra: dict[str, Any]) -> str:
    """The default as --help shows it: a value in code that never breaks, a rule written in words
    (show_default="...") as words, *required* for a required option, and nothing when --help shows
    no default."""
    if "required" in extra:
        return "*required*"
    if "default" not in extra:
        return ""
    return cell(extra["default"]) if isinstance(option.show_default, str) else whole(extra["default"])


def whole(text: str) -> str:
    """Inline code inside a table cell that never breaks mid-word (docs/stylesheets/extra.css): an
    option's names and metavar, a default. HTML, so a pipe in it (a Choice's [a|b]) is escaped."""
    escaped = html.escape(text).replace("|", "&#124;")
    return f'<code class="cli-whole">{escaped}</code>'


def cell(text: str) -> str:
    """Text inside a table cell: a pipe would end the cell, so it is escaped."""
    return text.replace("|", "\\|")


GENERATED: dict[str, Callable[[], str]] = {
    GRID_KEYS: grid_keys_table,
    GRID_KEY_VALUES: grid_key_values_table,
    LATER_KEYS: later_keys,
    CLI_REFERENCE: cli_reference,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    for mark, generate in GENERATED.items():
        if mark in markdown:
            markdown = markdown.replace(mark, generate())
    return markdown
