"""The docs site: it builds with --strict, and its reference pages hold every command, option and grid key.

The command-line and grid-key pages are generated from the code (mkdocs-click, docs/hooks.py), so
these tests fail when the generation stops covering something, not when a hand-written page lags."""

from __future__ import annotations

import html
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]


def _page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text(encoding="utf-8"))


def test_the_grid_key_reference_lists_every_key_with_its_help(site):
    from pipeline.config import KEYS

    page = _page(site, "reference/grid-keys")
    assert [name for name, key in KEYS.items() if name not in page or key.help not in page] == []


# --- command blocks and links in the README and the docs ------------------------------------------

import contextlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402

ILLUSTRATIVE = "<!-- illustrative -->"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# A word naming a file of the repository (a grid, a script, a recipe) must exist.
REPO_FOLDERS = ("experiments/", "benchmarks/", "deploy/", "docs/", "tests/", "pipeline/")


def command_blocks(text: str) -> list[tuple[int, bool, str]]:
    """(line, illustrative, body) of every ```bash and ```console block; illustrative when the
    nearest non-blank line above the fence is the <!-- illustrative --> comment."""
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) not in ("bash", "console"):
            continue
        above = [line for line in text[:match.start()].splitlines() if line.strip()]
        marked = bool(above) and above[-1].strip() == ILLUSTRATIVE
        blocks.append((text[:match.start()].count("\n") + 1, marked, match.group(2)))
    return blocks


def command_lines(body: str) -> list[str]:
    """The commands a block holds: `$ ` prompts in a console block (output lines dropped), every
    non-comment line elsewhere; continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = [line.strip() for line in joined.splitlines()]
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line and not line.startswith("#")]


def words_of(line: str) -> list[str]:
    """A line's words up to a shell redirection, pipe or comment."""
    words = []
    for word in shlex.split(line, comments=True):
        if word in (">", ">>", "|", "&&", ";", "<"):
            break
        words.append(word)
    return words


def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", makefile, re.MULTILINE))


def markers() -> set[str]:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {line.split(":")[0] for line in config["tool"]["pytest"]["ini_options"]["markers"]}


def check_files(words: list[str]) -> list[str]:
    return [f"{word}: no such file" for word in words
            if word.startswith(REPO_FOLDERS) and not (REPO / word.rstrip("/")).exists()]


def check_pipeline(words: list[str]) -> list[str]:
    """Parse the command with the real Click command, without running it: an unknown command or
    option, a bad choice or a missing argument is a problem."""
    from pipeline.cli import main

    args = words[1:]
    try:
        with contextlib.redirect_stdout(io.StringIO()), main.make_context("pipeline", list(args), resilient_parsing=False) as context:
            name, sub, rest = main.resolve_command(context, context.protected_args + context.args)
            if sub is not None:
                sub.make_context(name, rest, parent=context, resilient_parsing=False)
    except click.exceptions.Exit:  # --help, --version
        pass
    except click.ClickException as exc:
        return [exc.format_message()]
    return check_files(args)


def check_python(words: list[str]) -> list[str]:
    """`python -m pytest ...`: its paths exist and its -m markers are declared; `python -m pipeline`
    is the CLI; `python SCRIPT ...` names a script that exists. Anything else needs the mark."""
    args = words[1:]
    if args[:2] == ["-m", "pipeline"]:
        return check_pipeline(["pipeline", *args[2:]])
    if args[:2] == ["-m", "pytest"]:
        problems = check_files(args[2:])
        for flag, value in zip(args, args[1:]):
            if flag == "-m" and value != "pytest":
                unknown = set(re.findall(r"\w+", value)) - {"not", "and", "or"} - markers()
                problems += [f"pytest -m {value!r}: no marker {name!r}" for name in sorted(unknown)]
        return problems
    if args and args[0].endswith(".py") and not args[0].startswith("-"):
        return check_files(args) or ([] if (REPO / args[0]).exists() else [f"{args[0]}: no such script"])
    return ["a python command that is not checked: mark the block <!-- illustrative -->"]


def check_line(line: str) -> list[str]:
    """Problems with one command a reader would copy; [] when it is fine."""
    words = words_of(line)
    if not words:
        return []
    program = words[0]
    if program == "pipeline":
        return check_pipeline(words)
    if program == "make":
        targets = [word for word in words[1:] if "=" not in word and not word.startswith("-")]
        return [f"make {target}: no such target" for target in targets if target not in make_targets()]
    if program == "source":
        venv = re.search(r"^VENV\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.MULTILINE).group(1)
        made = words[1] == f"{venv}/bin/activate"  # made by `make setup`
        return [] if made or (REPO / words[1]).exists() else [f"source {words[1]}: no such file"]
    if Path(program).name in ("python", "python3", "python3.11"):
        return check_python(words)
    if program == "bash" and len(words) > 1:
        return check_files(words[1:]) or ([] if (REPO / words[1]).exists() else [f"{words[1]}: no such script"])
    return [f"{program}: not checked here; mark the block {ILLUSTRATIVE}"]


def problems_in(text: str, where: str) -> list[str]:
    found = []
    for line_number, illustrative, body in command_blocks(text):
        if illustrative:
            continue
        for line in command_lines(body):
            found += [f"{where}:{line_number}: {line}: {problem}" for problem in check_line(line)]
    return found


def test_every_command_a_reader_would_copy_is_checked_or_marked_illustrative():
    problems = []
    for page in PAGES:
        problems += problems_in(page.read_text(encoding="utf-8"), str(page.relative_to(REPO)))
    assert problems == []
    assert sum(len(command_blocks(page.read_text(encoding="utf-8"))) for page in PAGES) >= 10


@pytest.mark.parametrize("line, problem", [
    ("pipeline run experiments/devices.yaml --dry-runn", "--dry-runn"),
    ("pipeline compare --formt csv", "--formt"),
    ("pipeline compare --format xml", "xml"),
    ("pipeline rnu experiments/devices.yaml", "rnu"),
    ("pipeline run experiments/no-such.yaml", "no such file"),
    ("make tset", "no such target"),
    ("python -m pytest -m 'not slwo'", "slwo"),
    ("mlflow ui", "illustrative"),
])
def test_a_misspelt_command_is_a_problem(line, problem):
    found = problems_in(f"```bash\n{line}\n```\n", "page.md")
    assert len(found) == 1 and problem in found[0], found


def test_illustrative_blocks_and_output_lines_are_not_checked():
    page = (f"{ILLUSTRATIVE}\n```bash\nmlflow ui --no-such-option\n```\n\n"
            "```console\n$ pipeline validate experiments/quickstart.yaml\nerror: anything at all\n```\n")
    assert problems_in(page, "page.md") == []


def test_the_readme_is_short_and_holds_no_open_work():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    headings = [line.lstrip("#").strip().lower() for line in readme.splitlines() if line.startswith("#")]
    assert not [h for h in headings if h.startswith(("not yet", "todo", "open work", "roadmap"))]


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http(s), mailto: the site's own anchors are checked by mkdocs --strict
            path = target.split("#")[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []
