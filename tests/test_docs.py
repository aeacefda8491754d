"""The docs site: it builds with --strict, and its reference pages hold every command, option and grid key.

The command-line and grid-key pages are generated from the code (docs/hooks.py), so
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


def _page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text(encoding="utf-8"))


def test_the_grid_key_reference_lists_every_key_with_its_help(site):
    from pipeline.settings.config import KEYS

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
        above = [line for line in text[: match.start()].splitlines() if line.strip()]
        marked = bool(above) and above[-1].strip() == ILLUSTRATIVE
        blocks.append((text[: match.start()].count("\n") + 1, marked, match.group(2)))
    return blocks


def command_lines(body: str) -> list[str]:
    """The commands a block holds: `$ ` prompts in a console block (their output is checked by
    running them: test_each_sample_is_what_its_command_prints), every non-comment line elsewhere;
    continuation lines joined."""
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
    return [
        f"{word}: no such file"
        for word in words
        if word.startswith(REPO_FOLDERS) and not (REPO / word.rstrip("/")).exists()
    ]


def check_pipeline(words: list[str]) -> list[str]:
    """Parse the command with the real Click command, without running it: an unknown command or
    option, a bad choice or a missing argument is a problem."""
    from pipeline.cli import main

    args = words[1:]
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            main.make_context("pipeline", list(args), resilient_parsing=False) as context,
        ):
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


@pytest.mark.parametrize(
    "line, problem",
    [
        ("pipeline run experiments/devices.yaml --dry-runn", "--dry-runn"),
        ("pipeline compare --formt csv", "--formt"),
        ("pipeline compare --format xml", "xml"),
        ("pipeline rnu experiments/devices.yaml", "rnu"),
        ("pipeline run experiments/no-such.yaml", "no such file"),
        ("make tset", "no such target"),
        ("python -m pytest -m 'not slwo'", "slwo"),
        ("mlflow ui", "illustrative"),
    ],
)
def test_a_misspelt_command_is_a_problem(line, problem):
    found = problems_in(f"```bash\n{line}\n```\n", "page.md")
    assert len(found) == 1 and problem in found[0], found


def test_illustrative_blocks_and_output_lines_are_not_checked():
    page = (
        f"{ILLUSTRATIVE}\n```bash\nmlflow ui --no-such-option\n```\n\n"
        "```console\n$ pipeline validate experiments/quickstart.yaml\nerror: anything at all\n```\n"
    )
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


# --- sample output: run the command, compare the whole output -------------------------------------
#
# Every ```console block of every page (PAGES: the README and docs/**/*.md) is a sample: each
# `$ pipeline ...` line is run here, in a fresh folder, and the lines under it must be its output,
# every line of it. A command that needs something in place first (a grid file the page shows, a
# store holding sweeps, a read-only folder) has its preparation in PREPARATIONS, keyed by the
# command, and builds what the page describes; any other command runs in the bare folder, as a
# reader's first try would. Only what changes from run to run is normalised before comparing
# (VOLATILE below): run ids, durations and throughputs, the folder it ran in, and which of two
# equally accurate settings the clock made the fastest. Table columns, notes and the verdict's words
# are compared as they are; losses and accuracies within 0.01 (LEARNED_TOLERANCE: another CPU's
# rounding). PIPELINE_UPDATE_DOCS=1 writes each block that differs from this run's output (its paths
# made the reader's), so that a sample is never pasted by hand:
#
#     PIPELINE_UPDATE_DOCS=1 python -m pytest tests/test_docs.py -k sample

import difflib  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402

from conftest import REAL_DATA  # noqa: E402

UPDATE = os.environ.get("PIPELINE_UPDATE_DOCS") == "1"
# What a reader sees in place of the folder the test ran in and of this interpreter's folder: a
# checkout in their home folder, with the virtual environment `make setup` creates.
READER_FOLDER = "/home/you/pipeline"
READER_BIN = ".venv/bin"


def console_samples(text: str) -> list[tuple[int, str, str]]:
    """(line, command, output) of each `$ ` line of every ```console block: its output is every line
    under it up to the next `$ ` line or the block's end."""
    samples = []
    for match in FENCE.finditer(text):
        if match.group(1) != "console":
            continue
        first = text[: match.start(2)].count("\n") + 1
        lines = match.group(2).splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
        if not starts or starts[0] != 0:  # output under no command: a sample of "" (run_sample refuses it)
            samples.append((first, "", "\n".join(lines[: starts[0] if starts else len(lines)])))
        for start, end in zip(starts, [*starts[1:], len(lines)]):
            samples.append((first + start, lines[start][2:], "\n".join(lines[start + 1 : end])))
    return samples


SAMPLES = [(page, *sample) for page in PAGES for sample in console_samples(page.read_text(encoding="utf-8"))]


def reader_paths(output: str, folder: Path) -> str:
    """The output as a reader sees it who ran the command in a checkout at READER_FOLDER with
    `make setup`'s environment; trailing spaces (rich pads centred titles) dropped."""
    output = output.replace(f"{Path(sys.executable).parent}/", f"{READER_BIN}/").replace(str(folder), READER_FOLDER)
    return "\n".join(line.rstrip() for line in output.splitlines())


# (pattern, what stands in its place): the parts of an output that differ between two runs of the
# same command on the same machine.
VOLATILE = [
    (re.compile(r"\b[0-9a-f]{32}\b"), "<run id>"),
    (re.compile(r"\brun [0-9a-f]{8}\b"), "run <run id>"),
    (re.compile(r"\b\d+\.\d+s \([\d,]+ img/s\)"), "<s> (<img/s>)"),  # an epoch's line
    (re.compile(r"\b\d+\.\d+ s/epoch\b"), "<s>/epoch"),  # the verdict's
    (re.compile(r"over the best, \d+\.\d+x (faster|slower)\b"), "over the best, <ratio>"),  # its "First on speed:"
]
TIMED_COLUMNS = ("epoch s", "img/s")  # the results table's
BOX = "┏┃┡│└┗┓┳╇┩┛┻┴┘┐┬┼├┤"
# Which setting is first on speed is the clock's call. Of settings equally accurate the verdict names
# the first, so its name is normalised, and with one run a side it cannot be told from the next,
# named too; when the clock made a less accurate setting the first of all, the best is "the most
# accurate" and a "First on speed:" line names the other. CLOCK_FORMS are those endings of the
# best's line.
VERDICT_NAME = re.compile(r"^(Best|First on speed): .+? \(")
CLOCK_FORMS = (
    re.compile(r": first on epoch time, not yet told from .+?: n too small \(1 run\), and the most accurate$"),
    re.compile(r": the most accurate \(every faster setting is less accurate by more than the margin\)$"),
)


def volatile(output: str) -> list[str]:
    """The output's lines with VOLATILE parts replaced, table cells stripped of their padding (a
    column's width follows its widest number) and runs of spaces made one."""
    lines, header = [], []
    for line in output.splitlines():
        for pattern, stand_in in VOLATILE:
            line = pattern.sub(stand_in, line)
        line = VERDICT_NAME.sub(r"\1: <setting> (", line)
        if line.strip()[:1] in BOX:
            if any(c.isalnum() for c in line):
                cells = [c.strip() for c in re.split(r"[┃│]", line)]
                if "┃" in line:
                    header = cells
                else:
                    cells = [
                        "<timed>" if i < len(header) and header[i] in TIMED_COLUMNS else cell
                        for i, cell in enumerate(cells)
                    ]
                line = " | ".join(cells)
            else:
                line = re.sub(r"([━─])\1+", r"\1", line)
        lines.append(" ".join(line.split()))
    return lines


def _fold_clock(lines: list[str]) -> list[str]:
    """The verdict with the clock's call left out: either ending of the best's line, and the
    "First on speed:" line that comes with the second."""
    folded = []
    for line in lines:
        if line.startswith("First on speed: ") and folded and folded[-1].startswith("Best: "):
            continue
        for form in CLOCK_FORMS:
            if line.startswith("Best: "):
                line = form.sub(": <the clock's call>", line)
        folded.append(line)
    return folded


# A loss or an accuracy as the pipeline prints it (4 decimals). One torch thread learns the same
# figures on every run on one machine; another CPU's kernels (AVX2 or AVX-512, another torch build)
# may round differently and move them in the last places, never by this much.
LEARNED = re.compile(r"\b\d+\.\d{4}\b")
LEARNED_TOLERANCE = 0.01


def _same_lines(page: list[str], fresh: list[str]) -> bool:
    """Equal lines, but for learned figures that differ by LEARNED_TOLERANCE or less."""
    if len(page) != len(fresh):
        return False
    for shown, now in zip(page, fresh):
        if LEARNED.sub("#", shown) != LEARNED.sub("#", now):
            return False
        pairs = zip(LEARNED.findall(shown), LEARNED.findall(now))
        if any(abs(float(a) - float(b)) > LEARNED_TOLERANCE for a, b in pairs):
            return False
    return True


def same_but_for_the_clock(page: list[str], fresh: list[str]) -> bool:
    """Equal lines (learned figures within LEARNED_TOLERANCE); or, where one run's clock made a less
    accurate setting the fastest and the other's did not (one has a "First on speed:" line, the other
    not), equal once that call is folded."""
    if _same_lines(page, fresh):
        return True
    fastest = [any(line.startswith("First on speed: ") for line in lines) for lines in (page, fresh)]
    return fastest[0] != fastest[1] and _same_lines(_fold_clock(page), _fold_clock(fresh))


# --- what a sample's command needs in place -------------------------------------------------------
#
# A preparation builds, in the folder a sample runs in, what its page says is there before the
# command runs, and undoes on leaving what would outlive the folder (a mount). It yields its
# stand-ins: a path the page shows -> the path made here to be it; the command runs with the
# second and its output is read back with the first, as the test's folder is read as READER_FOLDER.
# Where this machine cannot make the situation, it skips the sample and says why.
Preparation = Callable[[Path, str, int], contextlib.AbstractContextManager[dict[str, str]]]


def file_shown_above(text: str, line: int, name: str) -> str:
    """The file `name` as the page shows it before `line`: the nearest ```yaml block above whose
    first line is `# NAME`, that comment included."""
    shown = None
    for match in FENCE.finditer(text):
        if text[: match.start()].count("\n") + 1 >= line:
            break
        if match.group(1) == "yaml" and match.group(2).startswith(f"# {name}\n"):
            shown = match.group(2)
    assert shown is not None, (
        f"line {line} runs a command on {name}: show it above, in a ```yaml block headed `# {name}`"
    )
    return shown


def _the_file_shown_above(name: str) -> Preparation:
    @contextlib.contextmanager
    def prepare(folder: Path, text: str, line: int) -> Iterator[dict[str, str]]:
        (folder / name).write_text(file_shown_above(text, line, name), encoding="utf-8")
        yield {}

    return prepare


@contextlib.contextmanager
def _the_nightly_sweeps(folder: Path, text: str, line: int) -> Iterator[dict[str, str]]:
    """What docs/comparing.md says its gate sample compares, in ./mlflow.db: synthetic timings, 4
    runs a point; the baseline nightly-base at batch sizes 128, 256 and 512 (1.0, 0.8 and 0.7 s an
    epoch), and nightly with 128 made 12% slower and no 512."""
    import numpy as np

    from pipeline.base import names
    from synthetic_sweeps import Run, jittered, write_sweep

    rng = np.random.default_rng(12)

    def runs(points: list[tuple[str, float]]) -> list[Run]:
        return [
            Run(jittered(seconds, 4, rng), params={"batch_size": batch_size, names.REPEAT: str(repeat)})
            for batch_size, seconds in points
            for repeat in range(1, 5)
        ]

    store = f"sqlite:///{folder / 'mlflow.db'}"
    write_sweep(store, "nightly-base", runs([("128", 1.0), ("256", 0.8), ("512", 0.7)]))
    write_sweep(store, "nightly", runs([("128", 1.12), ("256", 0.8)]))
    yield {}


@contextlib.contextmanager
def _nothing_listening_on_5000(folder: Path, text: str, line: int) -> Iterator[dict[str, str]]:
    """The page's server at 127.0.0.1:5000 is one that is not running: where something listens on
    that port here (a developer's own server), the command would reach it, so the sample is skipped."""
    with socket.socket() as probe:
        probe.settimeout(1)
        listening = probe.connect_ex(("127.0.0.1", 5000)) == 0
    if listening:
        pytest.skip("something listens on 127.0.0.1:5000 on this machine; the sample shows no server there")
    yield {}


def _quietly(command: list[str]) -> bool:
    """Whether `command` (mount, umount) succeeded; False where it is missing or refused."""
    try:
        return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def _a_read_only_mount(folder: Path, text: str, line: int) -> Iterator[dict[str, str]]:
    """The page's /mnt/ro, a read-only mount: a read-only tmpfs mounted at ./ro, as root. (Root
    ignores file modes; for anyone else a folder of mode 555 is refused too, but as "Permission
    denied", not the page's "Read-only file system", so the sample is skipped there.)"""
    if os.geteuid() != 0:
        pytest.skip(
            "a read-only mount needs root here; a mode-555 folder prints Permission denied, not the "
            "page's Read-only file system"
        )
    mount_point = folder / "ro"
    mount_point.mkdir()
    if not _quietly(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount_point)]):
        pytest.skip("mount is refused here (a container without the capability): no read-only folder can be made")
    try:
        yield {"/mnt/ro": str(mount_point)}
    finally:
        _quietly(["umount", "-l", str(mount_point)])


# Keyed by the command as the page shows it. A command not here runs in the bare folder.
PREPARATIONS: dict[str, Preparation] = {
    "pipeline validate my.yaml": _the_file_shown_above("my.yaml"),
    (
        "pipeline compare --experiment nightly --baseline nightly-base --fail-if-slower 5 --format markdown"
    ): _the_nightly_sweeps,
    "pipeline run experiments/quickstart.yaml --tracking-uri http://127.0.0.1:5000": _nothing_listening_on_5000,
    "pipeline run experiments/quickstart.yaml --tracking-uri sqlite:////mnt/ro/mlflow.db": _a_read_only_mount,
}


# --- running a sample ------------------------------------------------------------------------------

_OUTPUTS: dict[str, str] = {}


def reader_checkout(folder: Path, store_template: Path) -> None:
    """`folder` as a reader's checkout is before their first command: `experiments/` in it, and the
    store ./mlflow.db, migrated and empty as a first run leaves it (which saves MLflow's ~5 s of
    schema creation)."""
    (folder / "experiments").symlink_to(REPO / "experiments")
    shutil.copy(store_template, folder / "mlflow.db")


def run_command(command: str, folder: Path, stand_ins: dict[str, str]) -> str:
    """What `command` prints in `folder`, stdout and stderr as a terminal interleaves them, with
    the page's paths for their stand-ins and the reader's for this folder and interpreter."""
    for shown, made in stand_ins.items():
        command = command.replace(shown, made)
    words = shlex.split(command)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        # One torch thread: the losses and accuracies depend on the thread count, and one keeps a
        # sample the same under `make test`'s two workers and alone.
        "OMP_NUM_THREADS": "1",
        # Others' work on a shared test machine would mark runs contended and change the notes.
        "PIPELINE_CONTENDED_SHARE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *words[1:]],
        cwd=folder,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=600,
    )
    output = done.stdout
    for shown, made in stand_ins.items():
        output = output.replace(made, shown)
    return reader_paths(output, folder)


def sample_output(
    text: str, line: int, command: str, folder: Path, store_template: Path, prepare: Preparation | None
) -> str:
    """What the sample's `command` (at `line` of the page `text`) prints, run as a reader runs it
    from a checkout, after `prepare` built what the page says is in place. A command with nothing to
    prepare runs once (the quickstart's sweep is on two pages); a prepared one each time."""
    words = shlex.split(command)
    assert words, "output under no `$ ` command: a console block opens with the command that prints it"
    assert words[0] == "pipeline", f"{command}: only `pipeline` commands are run as samples"
    if prepare is None and command in _OUTPUTS:
        return _OUTPUTS[command]
    reader_checkout(folder, store_template)
    with (prepare or (lambda *_: contextlib.nullcontext({})))(folder, text, line) as stand_ins:
        output = run_command(command, folder, stand_ins)
    if prepare is None:
        _OUTPUTS[command] = output
    return output


def sample_difference(where: str, command: str, shown: str, output: str) -> str | None:
    """None when `output` is the sample `shown` but for what changes between runs; else their diff
    (normalised, - page, + now)."""
    expected, got = volatile(shown), volatile(output)
    if same_but_for_the_clock(expected, got):
        return None
    first = "First on speed: "
    if any(text.startswith(first) for text in expected) != any(text.startswith(first) for text in got):
        expected, got = _fold_clock(expected), _fold_clock(got)  # the clock's call is no difference
    return "\n".join(difflib.unified_diff(expected, got, where, command, lineterm=""))


def rewrite(page: Path, command: str, old: str, new: str) -> None:
    text = page.read_text(encoding="utf-8")
    block = f"$ {command}\n{old}\n" if old else f"$ {command}\n"
    assert block in text, f"{page.name}: the sample of {command!r} moved while it ran"
    page.write_text(text.replace(block, f"$ {command}\n{new}\n", 1), encoding="utf-8")


def test_the_first_pages_hold_samples():
    """The README and getting-started show what a first sweep and its grid print."""
    shown = {(page.name, command) for page, _, command, _ in SAMPLES}
    assert ("README.md", "pipeline run experiments/quickstart.yaml") in shown
    assert ("getting-started.md", "pipeline validate experiments/quickstart.yaml") in shown


def test_every_preparation_is_for_a_sample_a_page_shows():
    assert sorted(set(PREPARATIONS) - {command for _, _, command, _ in SAMPLES}) == []


@pytest.mark.skipif(not REAL_DATA.is_dir(), reason="the samples train on the real Fashion-MNIST")
@pytest.mark.parametrize(
    "page, line, command, shown", SAMPLES, ids=[f"{page.relative_to(REPO)}:{line}" for page, line, _, _ in SAMPLES]
)
def test_each_sample_is_what_its_command_prints(page, line, command, shown, tmp_path, _store_template):
    output = sample_output(
        page.read_text(encoding="utf-8"), line, command, tmp_path, _store_template, PREPARATIONS.get(command)
    )
    difference = sample_difference(f"{page.name}:{line}", command, shown, output)
    if difference is None:
        return
    if UPDATE:
        rewrite(page, command, shown, output)
        return
    pytest.fail(
        f"{page.relative_to(REPO)}:{line}: `{command}` prints something else (normalised, - page, "
        f"+ now):\n{difference}\nPIPELINE_UPDATE_DOCS=1 rewrites the block from a real run."
    )


@pytest.mark.parametrize(
    "prepared, page_says, same",
    [
        (True, "as it is", True),
        (False, "as it is", False),  # no my.yaml: the command prints "no such grid file"
        (True, "with another key", False),  # a page that says something the command does not print
    ],
)
def test_a_sample_is_checked_against_a_real_run(prepared, page_says, same, tmp_path, _store_template):
    """docs/troubleshooting.md's refused grid: its sample holds only with my.yaml written from the
    page, and only with the output the command prints."""
    page = REPO / "docs" / "troubleshooting.md"
    [(line, command, shown)] = [
        (line, command, shown)
        for where, line, command, shown in SAMPLES
        if where == page and command == "pipeline validate my.yaml"
    ]
    if page_says == "with another key":
        shown = shown.replace("did you mean 'batch_size'", "did you mean 'lr'")
    output = sample_output(
        page.read_text(encoding="utf-8"),
        line,
        command,
        tmp_path,
        _store_template,
        PREPARATIONS[command] if prepared else None,
    )
    assert (sample_difference(page.name, command, shown, output) is None) is same, output


# The two verdicts the quickstart's runs print, the clock deciding which (a row of the table below each).
FIRST_FORM = (
    "Best: cpu bs100 w0 (0.807 s/epoch, test acc 0.7784, 1 run; model from run a27f444f): first on epoch time, "
    "not yet told from cpu bs100 w1: n too small (1 run), and the most accurate\n"
    "│ 1 │ 0.01 │ 100        │   0.7784 │   0.807 │ 12,385 │ FINISHED │"
)
SECOND_FORM = (
    "Best: cpu bs100 w1 (1.244 s/epoch, test acc 0.7784, 1 run; model from run 0b1c2d3e): the most accurate "
    "(every faster setting is less accurate by more than the margin)\n"
    "First on speed: cpu bs1000 w1 (0.701 s/epoch, test acc 0.6844): over the best, 1.77x faster "
    "(significance withheld: n too small (1 run)); but less accurate than the most accurate by more than 0.005\n"
    "│ 1 │ 0.01 │ 100        │   0.7784 │   1.244 │  8,040 │ FINISHED │"
)
HEADER = "┃ # ┃ lr   ┃ batch_size ┃ test acc ┃ epoch s ┃  img/s ┃ status   ┃\n"


@pytest.mark.parametrize(
    "page, now, same",
    [
        (FIRST_FORM, FIRST_FORM.replace("a27f444f", "ffffffff").replace("12,385", "112,385"), True),  # ids, timings
        (FIRST_FORM, SECOND_FORM, True),  # the clock made a less accurate setting the fastest this time
        (SECOND_FORM, FIRST_FORM, True),
        (SECOND_FORM, SECOND_FORM.replace("by more than 0.005", "by over 0.005"), False),  # the words drifted
        (FIRST_FORM, FIRST_FORM.replace("test acc 0.7784", "test acc 0.7785"), True),  # another CPU's rounding
        (FIRST_FORM, FIRST_FORM.replace("test acc 0.7784", "test acc 0.7984"), False),  # it learned otherwise
        (FIRST_FORM, FIRST_FORM.replace("0.7784 │", "0.7985 │"), False),
        (FIRST_FORM, FIRST_FORM.replace("FINISHED", "FAILED"), False),
        (FIRST_FORM, FIRST_FORM.splitlines()[0], False),  # a line dropped
        (FIRST_FORM, SECOND_FORM.replace("First on speed: ", "Quickest: "), False),
    ],
)
def test_only_what_changes_between_runs_is_left_out_of_a_sample(page, now, same):
    assert same_but_for_the_clock(volatile(HEADER + page), volatile(HEADER + now)) is same


def test_a_sample_reads_as_the_reader_sees_it(tmp_path):
    printed = (
        f"store sqlite:///{tmp_path}/mlflow.db   \n"
        f"Open the MLflow UI:  {Path(sys.executable).parent}/mlflow ui --backend-store-uri "
        f"sqlite:///{tmp_path}/mlflow.db"
    )
    assert reader_paths(printed, tmp_path) == (
        f"store sqlite:///{READER_FOLDER}/mlflow.db\nOpen the MLflow UI:  "
        f"{READER_BIN}/mlflow ui --backend-store-uri "
        f"sqlite:///{READER_FOLDER}/mlflow.db"
    )


def test_a_console_block_splits_into_commands_and_their_output():
    page = "text\n\n```console\n$ pipeline a\none\ntwo\n$ pipeline b\n```\n\n```console\norphan\n```\n"
    assert console_samples(page) == [(4, "pipeline a", "one\ntwo"), (7, "pipeline b", ""), (11, "", "orphan")]
