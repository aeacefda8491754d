"""Getting started without a clone: `pipeline init` writes the example grids, which ship inside the
package (a built wheel holds them), and Click's shell completion for the `pipeline` command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from conftest import REPO, invoke
from pipeline.settings.starter import shipped

GRIDS = ("devices.yaml", "quickstart.yaml", "sweep.yaml")


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


# --- pipeline init ---------------------------------------------------------------------------------


def test_init_writes_the_examples_and_the_command_it_prints_next_runs(tmp_path):
    result = invoke("init")
    assert result.exit_code == 0, result.output
    for name, content in shipped().items():
        assert (tmp_path / "experiments" / name).read_bytes() == content
        assert f"wrote experiments/{name}" in result.output
    assert sorted(p.name for p in (tmp_path / "experiments").iterdir()) == sorted(shipped())  # nothing staged left
    suggested = [line.split(": ", 1)[-1].strip() for line in _lines(result.output)[-2:]]
    assert suggested == ["pipeline validate experiments/quickstart.yaml", "pipeline run experiments/quickstart.yaml"]
    validated = invoke(*suggested[0].split()[1:])
    assert validated.exit_code == 0 and "ok: 4 grid points" in validated.output, validated.output


def test_init_into_a_named_folder_again_changes_nothing(tmp_path):
    assert invoke("init", "my grids/new").exit_code == 0
    folder = tmp_path / "my grids" / "new"
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = invoke("init", "my grids/new")
    assert again.exit_code == 0, again.output
    assert "wrote" not in again.output and "unchanged my grids/new/quickstart.yaml" in again.output
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert "pipeline validate 'my grids/new/quickstart.yaml'" in again.output  # quoted for the shell


def test_a_changed_example_is_kept_and_nothing_is_written_until_force(tmp_path):
    assert invoke("init").exit_code == 0
    folder = tmp_path / "experiments"
    (folder / "sweep.yaml").write_text("experiment: mine\n")
    (folder / "quickstart.yaml").unlink()
    (folder / "own.yaml").write_text("experiment: own\n")

    refused = invoke("init")
    assert refused.exit_code == 2
    assert _lines(refused.output) == [
        "error: experiments/sweep.yaml: already there and different from the shipped example; pass --force to "
        "overwrite, or choose another folder (pipeline init DIR)"
    ]
    assert (folder / "sweep.yaml").read_text() == "experiment: mine\n"
    assert not (folder / "quickstart.yaml").exists()  # all or nothing: the missing one is not written either

    forced = invoke("init", "--force")
    assert forced.exit_code == 0, forced.output
    assert "overwrote experiments/sweep.yaml" in forced.output and "wrote experiments/quickstart.yaml" in forced.output
    assert (folder / "sweep.yaml").read_bytes() == shipped()["sweep.yaml"]
    assert (folder / "own.yaml").read_text() == "experiment: own\n"  # not an example: never touched


@pytest.mark.parametrize(
    "make, folder, message",
    [
        (
            lambda root: (root / "notes").write_text("x"),
            "notes",
            "error: notes: is a file, not a folder; name a folder, e.g. pipeline init experiments",
        ),
        (
            lambda root: (root / "notes").write_text("x"),
            "notes/grids",
            "error: notes/grids: cannot write there (Not a directory); nothing was written; choose a folder you can "
            "write to (pipeline init DIR)",
        ),
        (
            lambda root: (root / "experiments" / "sweep.yaml").mkdir(parents=True),
            "experiments",
            "error: experiments/sweep.yaml: is a folder where the example sweep.yaml goes; move it away, or choose "
            "another folder (pipeline init DIR)",
        ),
    ],
)
def test_a_folder_that_cannot_hold_the_examples_is_one_line_and_exit_2(tmp_path, make, folder, message):
    make(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for args in (("init", folder), ("init", folder, "--force")):
        result = invoke(*args)
        assert (result.exit_code, _lines(result.output)) == (2, [message])
        assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_a_folder_it_may_not_write_is_refused_with_nothing_left_behind(tmp_path):
    """A folder the user may not write in: one made read-only, or, for root (who writes anywhere
    else), /sys, where nobody may create files."""
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(0o555)
    elif Path("/sys").is_dir():
        folder = Path("/sys")
    else:
        pytest.skip("running as root without /sys: no folder that refuses a new file")
    before = sorted(p.name for p in folder.iterdir())
    result = invoke("init", str(folder))
    assert result.exit_code == 2
    (line,) = _lines(result.output)
    assert line.startswith(f"error: {folder}: cannot write there (") and line.endswith(
        "); nothing was written; choose a folder you can write to (pipeline init DIR)"
    )
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_write_that_fails_half_way_leaves_nothing(tmp_path):
    """The CLI in a process that may not write a file as large as the schema, but may write each grid
    (a file-size limit; Python ignores SIGXFSZ, so the write fails with EFBIG as on a full disk):
    the grid staged before it is removed, and so are the folders init created."""
    resource = pytest.importorskip("resource", reason="file-size limits are POSIX")
    sizes = {name: len(content) for name, content in shipped().items()}
    limit = max(size for name, size in sizes.items() if name.endswith(".yaml")) + 1
    order = sorted(sizes)
    assert order[1] == "grid.schema.json" and sizes[order[0]] < limit < sizes[order[1]]  # the second write fails

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "init", "new/experiments"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=limited,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: new/experiments: cannot write there (File too large); nothing was written; "
        "choose a folder you can write to (pipeline init DIR)\n"
    )
    assert not (tmp_path / "new").exists()


def test_the_help_starts_with_init_then_the_grid_it_writes():
    text = invoke("--help").output
    start = text[text.index("Start with:") :].split("\n\n")[0]
    commands = [line.replace("Start with:", "").split("(")[0].strip() for line in start.splitlines()]
    assert commands == [
        "pipeline init",
        "pipeline validate experiments/quickstart.yaml",
        "pipeline run experiments/quickstart.yaml",
    ]
    assert "quickstart.yaml" in shipped()  # what `pipeline init` writes into ./experiments


# --- the grids are package data, kept once -----------------------------------------------------------


def test_the_grids_are_package_data_and_experiments_is_the_same_folder():
    folder = resources.files("pipeline").joinpath("examples")
    assert sorted(shipped()) == sorted([*GRIDS, "grid.schema.json"])
    for name in GRIDS:
        assert folder.joinpath(name).read_bytes() == (REPO / "experiments" / name).read_bytes()
    experiments = REPO / "experiments"
    assert experiments.is_symlink() and os.readlink(experiments) == "pipeline/examples"  # relative: one copy


def test_a_built_wheel_holds_the_grids(tmp_path):
    """Build the wheel a `pip install` would install, from a copy of the project's package files (a build
    in the repository would leave build/ and *.egg-info behind)."""
    pytest.importorskip("setuptools", reason="building a wheel needs setuptools")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "wheels"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "wheels").glob("pipeline-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"pipeline/examples/{name}" for name in shipped()} <= names


# --- shell completion (Click's protocol: _PIPELINE_COMPLETE) ------------------------------------------


def _complete(instruction: str, **env: str) -> subprocess.CompletedProcess:
    """The installed `pipeline` script, as a shell's completion function calls it."""
    script = Path(sys.executable).with_name("pipeline")
    if not script.exists():
        pytest.skip(f"no `pipeline` console script beside {sys.executable} (pip install -e .)")
    return subprocess.run(
        [str(script)], capture_output=True, text=True, env={**os.environ, "_PIPELINE_COMPLETE": instruction, **env}
    )


@pytest.mark.parametrize(
    "shell, line",
    [
        ("bash", "complete -o nosort -F _pipeline_completion pipeline"),
        ("zsh", "#compdef pipeline"),
        ("fish", "complete --no-files --command pipeline"),
    ],
)
def test_each_shell_gets_a_completion_script(shell, line):
    done = _complete(f"{shell}_source")
    assert done.returncode == 0, done.stderr
    assert [text for text in done.stdout.splitlines() if text.strip().startswith(line)] != []
    assert f"_PIPELINE_COMPLETE={shell}_complete" in done.stdout  # it calls `pipeline` back to complete


def test_the_bash_script_completes_a_command_in_bash():
    """The script as a user's ~/.bashrc evaluates it, and its function called the way bash calls it."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    script = Path(sys.executable).with_name("pipeline")
    if not script.exists():
        pytest.skip(f"no `pipeline` console script beside {sys.executable} (pip install -e .)")
    session = (
        'eval "$(_PIPELINE_COMPLETE=bash_source pipeline)"; COMP_WORDS=(pipeline va); COMP_CWORD=1; '
        '_pipeline_completion pipeline; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [bash, "-c", session],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert (done.returncode, done.stdout) == (0, "validate\n"), done.stderr


@pytest.mark.parametrize(
    "words, expected",
    [
        ("pipeline in", ["plain,init"]),
        ("pipeline va", ["plain,validate"]),
        ("pipeline run --dry", ["plain,--dry-run"]),
        ("pipeline compare --format ", ["plain,table", "plain,csv", "plain,markdown", "plain,json"]),
        ("pipeline validate experiments/qu", ["file,experiments/qu"]),  # the shell then lists the files
    ],
)
def test_bash_completes_commands_options_choices_and_grid_files(words, expected):
    done = _complete("bash_complete", COMP_WORDS=words, COMP_CWORD=str(len(words.split(" ")) - 1))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
