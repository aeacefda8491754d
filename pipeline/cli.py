"""The `pipeline` command: parses, calls and prints. Logic lives in the modules below it.

The package's light modules are imported at the top. Those that load torch, mlflow, pandas, numpy or
rich are imported inside the commands that need them: `--help`, `validate`, `schema` and `init` stay quick.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, get_type_hints

import click

from pipeline import __version__
from pipeline.base import interrupts
from pipeline.base.files import check_writable
from pipeline.base.uris import RUNS_PAGE, redact
from pipeline.errors import UserError
from pipeline.settings.config import DEFAULTS, KEYS, WORKERLESS, RunConfig, check_repeats, load_grid
from pipeline.settings.grid import MAX_POINTS, SHOWN_POINTS, expand, format_value
from pipeline.settings.schema import schema_text
from pipeline.settings.starter import FIRST_GRID, write_examples
from pipeline.sweep import registry
from pipeline.tracking import results
from pipeline.tracking.records import latest_experiment_id
from pipeline.tracking.server import check_port, run_mlflow, serve
from pipeline.tracking.store import (
    UI_OPTIONS,
    TrackingUnavailable,
    absolute_store_uri,
    fluent_target,
    local_state_dir,
    open_client,
    process_settings,
    resolve_tracking_uri,
    short_cause,
    tell_project_run,
    user_error,
)
from pipeline.training import peak as peaks

EXIT_INTERRUPTED = 130
TORCH_ADDRESS_SPACE_GIB = 4  # measured: a dry run loads under `ulimit -v` 3.5 GiB, not 3 GiB


class NonBlank(click.ParamType):
    """A value that may not be blank: `--experiment ""` is a mistake (an unset shell variable, a
    stray `=`), not a request for the default, so it is an error (exit 2) on every command.

    The one exception is MLproject: `mlflow run` passes "" for each string parameter left at its
    default. Under it (MLFLOW_RUN_ID is set), options built with `unset_when_blank` read "" as not
    given; the others (a name, a metric) still need a value.
    """

    def __init__(self, inner: click.ParamType = click.STRING, unset_when_blank: bool = False) -> None:
        self.inner, self.unset_when_blank = inner, unset_when_blank
        self.name = inner.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            if self.unset_when_blank and os.environ.get("MLFLOW_RUN_ID"):
                return None
            optional = isinstance(param, click.Option) and not param.required
            self.fail(
                f"empty value {value!r}; give one" + (", or leave the option out" if optional else ""), param, ctx
            )
        return self.inner.convert(value, param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
        return self.inner.shell_complete(ctx, param, incomplete)


TEXT = NonBlank()
OPTIONAL_TEXT = NonBlank(unset_when_blank=True)  # options MLproject passes as "" when unset
# A grid file's name: a path only so that shells complete file names (`pipeline run exp<TAB>`);
# Click checks nothing (readable=False), and the grid loader says what is wrong with it.
GRID_FILE = NonBlank(click.Path(readable=False))


def _grid_value(key: str):
    """A CLI flag checked exactly like the grid key of the same name."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        try:
            return KEYS[key].check(value)
        except ValueError as exc:
            raise click.BadParameter(f"got {value!r}; expected {exc}") from None

    return callback


def _repeats(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    """--repeats, checked like the grid file's `repeats:` (the same message)."""
    if value is None:
        return None
    try:
        return check_repeats(value)
    except UserError as exc:
        raise click.BadParameter(str(exc).removeprefix("repeats: ")) from None


def setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One option per grid key that `pipeline train` offers (config.Key.train), in RunConfig's
    order, with its default and help from the table, its type from the field's, and its value
    checked like the grid key's: a key added to RunConfig is an option here without an edit."""
    types = get_type_hints(RunConfig)
    for name in reversed([name for name, key in KEYS.items() if key.train]):
        option = click.option(
            "--" + name.replace("_", "-"),
            name,
            type=types[name],
            # A boolean's default as a grid file writes it ("true", which Click converts), so that
            # --help shows true, not True.
            default=format_value(DEFAULTS[name]) if isinstance(DEFAULTS[name], bool) else DEFAULTS[name],
            show_default=True,
            callback=_grid_value(name),
            help=KEYS[name].help,
        )
        command = option(command)
    return command


tracking_uri_option = click.option(
    "--tracking-uri",
    type=OPTIONAL_TEXT,
    metavar="URI",
    help="MLflow tracking URI. Default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here.",
)
system_metrics_option = click.option(
    "--system-metrics",
    type=bool,
    is_flag=False,
    flag_value=True,
    default="false",  # as a grid file writes it (Click converts it): --help shows false, not False
    show_default=True,
    metavar="[true|false]",
    help="Record MLflow system metrics (CPU, memory, disk, network; GPU via nvidia-ml-py) per run; "
    "the bare flag means true.",
)
data_dir_option = click.option(
    "--data-dir",
    type=OPTIONAL_TEXT,
    metavar="DIR",
    help="Folder with the four Fashion-MNIST IDX files (or a torchvision root). Default: search.",
)


# Click shows the command's help for a bare `pipeline` (its own usage error subclass, absent before
# Click 8.2): that one stays as Click prints it.
_SHOWS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _one_line_usage_error(exc: click.UsageError) -> None:
    """An unknown option or command, a missing argument or a value Click refuses, said as every
    other error here is: one line that names the thing and where the fix is, and exit code 2
    (Click's own form is four lines: the usage, a pointer to --help, a blank line and the error)."""
    if isinstance(exc, _SHOWS_HELP):
        raise exc
    where = exc.ctx.command_path if exc.ctx is not None else "pipeline"
    click.echo(f"error: {exc.format_message().rstrip('.')} (see '{where} --help')", err=True)
    sys.exit(exc.exit_code)


# A disk that cannot take what is written: full, over quota, or a file over its size limit.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _output_lost(exc: OSError) -> NoReturn:
    """The command's output, sent to a file on a full disk (`> log`), could not be written: one line
    on stderr, exit 1. Every write the pipeline plans for says where it failed; this one is the
    output's. stdout then points at /dev/null, so that the interpreter's last flush of what could not
    be written fails no second time (Python's recipe for a closed pipe, signal's "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    click.echo(f"error: the output could not be written ({exc.strerror}); free space where it goes", err=True)
    sys.exit(1)


class _Group(click.Group):
    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:  # the group's own options: `pipeline --bogus`
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            _one_line_usage_error(exc)
            raise  # not reached: for type checkers

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        finally:  # what is still buffered: a full disk under `> log` is said here, not at the exit
            try:
                sys.stdout.flush()
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                _output_lost(exc)

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a command's options and arguments, or a command that does not exist
            _one_line_usage_error(exc)
        except UserError as exc:
            click.echo(f"error: {redact(str(exc))}", err=True)  # a password in any URI it names is masked
            tell_project_run(redact(str(exc)))
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            click.echo("interrupted: the current run and its parent are marked KILLED", err=True)
            ctx.exit(interrupts.exit_code(exc))
        except (MemoryError, ImportError) as exc:  # torch or mlflow too big for the memory left
            click.echo(f"error: {_cannot_load(exc)}", err=True)
            ctx.exit(1)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            _output_lost(exc)
        except Exception as exc:  # an MlflowException no caller mapped: one line, never a traceback
            from mlflow.exceptions import MlflowException

            if isinstance(exc, TrackingUnavailable) and exc.artifacts:
                click.echo(redact(f"error: {exc}; free space there or make it writable, then run it again"), err=True)
                ctx.exit(1)
            if isinstance(exc, TrackingUnavailable):
                click.echo(redact(f"error: the tracking store {exc}; run the command again once it answers"), err=True)
                ctx.exit(1)
            if not isinstance(exc, MlflowException):
                raise
            mapped = user_error(exc, "MLflow refused the request")
            click.echo(
                redact(
                    f"error: {mapped}"
                    if mapped
                    else f"error: the tracking store failed ({exc.error_code}: {short_cause(exc)})"
                ),
                err=True,
            )
            ctx.exit(2 if mapped else 1)


def _cannot_load(exc: MemoryError | ImportError) -> str:
    """What ran out, in one line, with what to do. Under an address-space limit (`ulimit -v`) below
    what torch maps as it loads, the limit is to blame; else the machine's memory, or (a library
    that will not load with memory to spare) the installation."""
    import resource

    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY and limit < TORCH_ADDRESS_SPACE_GIB * 2**30:
        return (
            f"too little memory to load torch: this process may use only {limit // 2**20} MiB of address "
            f"space (ulimit -v {limit // 1024}); torch needs about {TORCH_ADDRESS_SPACE_GIB} GiB of it: "
            "raise the limit (ulimit -v unlimited)"
        )
    if isinstance(exc, MemoryError):
        return "out of memory: free some memory (close other programs) and run the command again"
    cause = (str(exc) or type(exc).__name__).splitlines()[0]
    return f"could not load a library ({cause}): reinstall the environment (make setup)"


set_option = click.option(
    "--set",
    "overrides",
    type=TEXT,
    multiple=True,
    metavar="KEY=VALUE",
    help="Override the grid file without editing it (repeatable): a grid key and its values (batch_size=100,1000), "
    "or experiment, repeats, max_repeats, half_width, quality_margin, checkpoint, stop_at_target, data.KEY, "
    "target.METRIC; values read as in the file.",
)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipeline")
def main() -> None:
    """Train the Fashion-MNIST CNN over a YAML grid of settings and devices, tracked in MLflow.

    \b
    Start with:  pipeline init        (writes the example grids into ./experiments)
                 pipeline validate experiments/quickstart.yaml
                 pipeline run experiments/quickstart.yaml
    """
    click.get_current_context().with_resource(process_settings())  # for the command, then put back
    _tolerant_output()


def _tolerant_output() -> None:
    """A character the terminal's encoding lacks (an experiment named "café" under LC_ALL=C's
    ASCII, or PYTHONIOENCODING=ascii) is written as an escape (caf\\xe9), not a crash mid-sweep."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


@main.command(short_help="Write the example grids and their JSON Schema into DIR to edit.")
@click.argument("folder", type=NonBlank(click.Path(path_type=Path)), default="experiments", metavar="[DIR]")
@click.option("--force", is_flag=True, help="Overwrite example files in DIR that differ from the shipped ones.")
def init(folder: Path, force: bool) -> None:
    """Write the example grids, and the JSON Schema they name for editors, into DIR (default:
    ./experiments), to copy and edit. A file already there is never overwritten without --force."""
    import shlex

    copied = write_examples(folder, force)
    for path in copied.written:
        click.echo(f"wrote {path}")
    for path in copied.overwritten:
        click.echo(f"overwrote {path}")
    for path in copied.unchanged:
        click.echo(f"unchanged {path} (already the shipped example)")
    first = shlex.quote(str(folder / FIRST_GRID))
    click.echo(f"next: pipeline validate {first}\n      pipeline run {first}")


@main.command(short_help="Print the JSON Schema of a grid file, for editors.")
def schema() -> None:
    """Print the JSON Schema of a grid file, for editors (the example grids name it in their first line)."""
    click.echo(schema_text(), nl=False)


@main.command(short_help="Train every point of GRID.yaml, one MLflow child run each.")
@click.argument("grid", type=GRID_FILE, metavar="GRID.yaml")
@tracking_uri_option
@click.option(
    "--experiment",
    type=OPTIONAL_TEXT,
    metavar="NAME",
    help="MLflow experiment. Default: the grid's `experiment`, else the file's name.",
)
@data_dir_option
@click.option(
    "--require-devices",
    is_flag=True,
    help="Exit 2 before training if any grid point's device is missing, instead of skipping it.",
)
@click.option("--dry-run", is_flag=True, help="Show the plan (points, devices, data) and exit; trains nothing.")
@system_metrics_option
@click.option(
    "--register",
    "register_name",
    type=OPTIONAL_TEXT,
    metavar="MODEL_NAME",
    help="When the grid finishes, register the run its verdict names best (the fastest setting within the "
    "quality margin of the most accurate) as MODEL_NAME@champion.",
)
@click.option("--rerun", is_flag=True, help="Train every point, even those already FINISHED in this experiment.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failed run.")
@click.option(
    "--checkpoint",
    is_flag=True,
    help="Save model and optimizer state each epoch; an interrupted point resumes from it.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: one point after another (fair timing); ray: every point as a Ray task.",
)
@click.option(
    "--ray-address",
    type=OPTIONAL_TEXT,
    metavar="ADDR",
    help="With --executor ray: 'auto' or 'ray://HOST:10001' joins a cluster; default starts Ray here.",
)
@click.option(
    "--max-points",
    type=click.IntRange(min=1),
    default=MAX_POINTS,
    show_default=True,
    metavar="N",
    help="Refuse a sweep of more runs (points x repeats) than this (a dry run shows the first ones).",
)
@click.option(
    "--repeats",
    type=str,
    default=None,
    metavar="N|auto",
    callback=_repeats,
    help="Train each point N times, interleaved (overrides the grid's `repeats`; raising it trains "
    "only the missing repeats); auto: rounds until every speedup is clear, up to max_repeats.",
)
@set_option
def run(
    grid: str,
    tracking_uri: str | None,
    experiment: str | None,
    data_dir: str | None,
    require_devices: bool,
    dry_run: bool,
    system_metrics: bool,
    register_name: str | None,
    rerun: bool,
    fail_fast: bool,
    checkpoint: bool,
    executor: str,
    ray_address: str | None,
    max_points: int,
    repeats: int | str | None,
    overrides: tuple[str, ...],
) -> None:
    """Train every point of GRID.yaml, one MLflow child run each, under one parent run.

    Points whose device this machine lacks are skipped with the reason, and points that already
    have a FINISHED run in the experiment (same settings, data, host and hardware) are not trained
    again. Exit code: 0 when every run that could run finished, 1 when one failed, 2 for bad input,
    130 on Ctrl-C (143 on SIGTERM, 129 on SIGHUP).
    """
    # rich (report), and pandas and numpy (runner): loaded by the commands that use them only
    from pipeline.present.report import Reporter
    from pipeline.sweep.runner import Options, run_grid

    spec = load_grid(grid, overrides)
    if register_name:  # refused now, not after the sweep
        registry.check_name(register_name, "--register")
    options = Options(
        tracking_uri=tracking_uri,
        experiment=experiment,
        data_dir=data_dir,
        require_devices=require_devices,
        dry_run=dry_run,
        system_metrics=system_metrics,
        rerun=rerun,
        fail_fast=fail_fast,
        checkpoint=checkpoint,
        executor=executor,
        ray_address=ray_address,
        register=register_name,
        max_points=max_points,
        repeats=repeats,
    )
    result = run_grid(spec, Reporter(), options)
    if register_name and result.tracking_uri is not None:  # None: a dry run, which records nothing
        try:
            _print_registration(registry.register_best(result.tracking_uri, result.comparison, register_name))
        except UserError as exc:  # the sweep is done and recorded; only the registration failed
            click.echo(f"--register {register_name}: {redact(str(exc))}", err=True)
            sys.exit(max(result.exit_code, 1))
    sys.exit(result.exit_code)


@main.command(short_help="Train one run with the given settings and track it in MLflow.")
@setting_options
@data_dir_option
@click.option(
    "--train-size",
    type=NonBlank(click.IntRange(1), unset_when_blank=True),
    metavar="N",
    help="Train on the first N training images (default: all 60,000), as a grid's data.train_size: "
    "a quick run on a busy machine, at a cost in accuracy.",
)
@click.option(
    "--test-size",
    type=NonBlank(click.IntRange(1), unset_when_blank=True),
    metavar="N",
    help="Score on the first N test images (default: all 10,000), as a grid's data.test_size.",
)
@click.option(
    "--experiment",
    default="train",
    show_default=True,
    type=OPTIONAL_TEXT,
    metavar="NAME",
    help="MLflow experiment to log the run in (made when missing).",
)
@tracking_uri_option
@system_metrics_option
def train(
    data_dir: str | None,
    train_size: int | None,
    test_size: int | None,
    experiment: str | None,
    tracking_uri: str | None,
    system_metrics: bool,
    **settings: Any,
) -> None:
    """Train one run with the given settings (each the grid key of its name) and track it in MLflow."""
    # rich (report), and pandas and numpy (runner): loaded by the commands that use them only
    from pipeline.present.report import Reporter
    from pipeline.sweep.runner import Options, run_single

    config = RunConfig(**settings)
    for key, what in WORKERLESS.items():
        if getattr(config, key) and config.num_workers > 0:
            raise UserError(f"--{key.replace('_', '-')} true {what}, without DataLoader workers; set --num-workers 0")
    options = Options(
        tracking_uri=tracking_uri,
        experiment=experiment,
        data_dir=data_dir,
        system_metrics=system_metrics,
        train_size=train_size,
        test_size=test_size,
    )
    sys.exit(run_single(config, Reporter(), options).exit_code)


@main.command(short_help="Check GRID.yaml and print its expanded grid, without training.")
@click.argument("grid", type=GRID_FILE, metavar="GRID.yaml")
@set_option
def validate(grid: str, overrides: tuple[str, ...]) -> None:
    """Check GRID.yaml and print its expanded grid and size, without training (or importing torch)."""
    from pipeline.present.report import (  # rich: not for --help
        grid_notes,
        grid_table,
        make_console,
        sweep_size,
        target_line,
    )

    spec = load_grid(grid, overrides)
    title = f"{spec.path}: experiment {spec.experiment!r}, {sweep_size(spec)}"
    shown = expand(spec, limit=SHOWN_POINTS)  # a grid of a million points is counted, not listed
    table = grid_table(spec, [(point, point.name) for point in shown], title, "run name")
    console = make_console()
    console.print(table)
    for line in grid_notes(spec, len(shown), MAX_POINTS):
        console.print(line)
    if spec.target is not None:
        console.print(target_line(spec))
    data = spec.data
    if any((data.root, data.train_size, data.test_size)):
        root = redact(str(data.root)) if data.root else "search"
        console.print(f"data: root={root} train_size={data.train_size or 'all'} test_size={data.test_size or 'all'}")
    console.print(f"ok: {sweep_size(spec)}")


@main.command(short_help="What this machine offers: CPU, and each CUDA or MPS device.")
@click.option(
    "--peak",
    is_flag=True,
    help="Also each working device's peaks: a large matrix multiplication at each precision and a memory "
    "copy, measured (a few seconds a device) and cached, beside the vendor's figures or an estimate.",
)
@click.option("--remeasure", is_flag=True, help="With --peak: measure again, even where a measurement is cached.")
def devices(peak: bool, remeasure: bool) -> None:
    """What this machine offers: CPU, each CUDA/MPS device (smoke-tested), and why CUDA is missing.
    With --peak, how fast each one is at most: what every run's MFU is a share of."""
    import torch

    from pipeline.present.report import devices_table, make_console, print_peaks
    from pipeline.training.device import survey

    if remeasure and not peak:
        raise click.UsageError("--remeasure goes with --peak")
    found, notes = survey()
    console = make_console()
    console.print(devices_table(found))
    for note in notes:
        console.print(note)
    console.print(f"torch.cuda.is_available(): {torch.cuda.is_available()}")
    if peak:
        print_peaks(console, [peaks.find(torch.device(d.name), remeasure) for d in found if d.works])


@main.command(short_help="Find, verify and describe the Fashion-MNIST files to train on.")
@data_dir_option
@click.option("--download", is_flag=True, help="Fetch Fashion-MNIST with torchvision into ./data (needs a network).")
def data(data_dir: str | None, download: bool) -> None:
    """Find, verify and describe the Fashion-MNIST files the pipeline would use."""
    from pipeline.training import data as data_mod  # torch

    if download:
        click.echo(f"downloaded into {data_mod.download(data_dir or 'data')}")
    dataset = data_mod.load(data_dir)
    click.echo(dataset.description)


@main.command(short_help="A sweep's verdict and one row per setting, or a regression gate.")
@click.option(
    "--experiment",
    type=OPTIONAL_TEXT,
    metavar="NAME",
    help="Compare this experiment's latest sweep. Default: the latest sweep in the store.",
)
@click.option("--parent-run", type=OPTIONAL_TEXT, metavar="ID", help="Compare this sweep (a parent run id).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "markdown", "json"]),
    default="table",
    show_default=True,
    help="table for a terminal; csv, markdown and json print only the data.",
)
@click.option(
    "--wide",
    is_flag=True,
    help="The table with every column; by default it keeps the ones a decision rests on "
    "(what varies, epoch time, speedups, test accuracy, images/s). csv, markdown and json have all.",
)
@click.option(
    "--out",
    type=NonBlank(click.Path(file_okay=False)),
    metavar="DIR",
    help="Also write the charts (PNG), results.csv and results.md into DIR.",
)
@click.option(
    "--html",
    type=NonBlank(click.Path()),
    metavar="FILE",
    help="Also write the report: one HTML file that opens offline (the verdict, the table, the charts, "
    "the hosts, the commands to run the sweep again).",
)
@click.option(
    "--publish",
    is_flag=True,
    help="Write the comparison back to the store, with this call's options: the sweep's saved view, "
    "its runs' setting figures, the descriptions, and the parent run's comparison/ and report.html. "
    "Without it compare only reads. `pipeline run` publishes each sweep at its end.",
)
@click.option(
    "--sort", type=TEXT, metavar="METRIC", help="Sort rows by a column, e.g. test_accuracy or epoch_duration_s."
)
@click.option(
    "--versus",
    type=TEXT,
    metavar="KEY=VALUE",
    help="Also each row's speedup over its twin that differs only in KEY and has VALUE there, "
    "e.g. num_workers=0, batch_size=1000, or seed=0 (an A/A check: expect no difference).",
)
@click.option(
    "--include-contended",
    is_flag=True,
    help="Count runs recorded while other processes took the cores in the speedups and the gate.",
)
@click.option(
    "--baseline",
    type=TEXT,
    metavar="SWEEP",
    help="Compare each point's epoch time with this sweep's (a parent run id, or an experiment name "
    "for its latest sweep): same settings, device, hardware and host.",
)
@click.option(
    "--fail-if-slower",
    type=float,
    metavar="PCT",
    help="With --baseline: exit 1 when a point is slower by more than PCT percent by its interval, "
    "not its estimate (Holm-corrected across the points, 2.5% family-wise); exit 3 when a point cannot "
    "be judged (and none is slower).",
)
@click.option(
    "--allow-inconclusive",
    is_flag=True,
    help="With --baseline and --fail-if-slower: exit 0, not 3, when some point cannot be judged "
    "(too few runs, only on one side, every run contended, other hardware) and none is slower.",
)
@click.option("--across-hosts", is_flag=True, help="With --baseline: pair points recorded on other hosts too.")
@click.option(
    "--quality-margin",
    type=float,
    metavar="ACC",
    help="The test accuracy a faster setting may lose and still win (absolute, e.g. 0.005). "
    "Default: the sweep's own (its grid's quality_margin, else 0.005).",
)
@tracking_uri_option
def compare(
    experiment: str | None,
    parent_run: str | None,
    fmt: str,
    wide: bool,
    out: str | None,
    html: str | None,
    publish: bool,
    sort: str | None,
    versus: str | None,
    include_contended: bool,
    baseline: str | None,
    fail_if_slower: float | None,
    allow_inconclusive: bool,
    across_hosts: bool,
    quality_margin: float | None,
    tracking_uri: str | None,
) -> None:
    """The verdict first (the best setting and its run, "the fastest" only where its lead is
    significant, the most accurate, each speedup in words), then one row per setting of a sweep (its
    repeats aggregated): n runs, the geometric mean and quartiles of their steady-state epoch times,
    final loss and accuracy, images/s, time shares, time to target, and each device's speedup over its
    cpu twin with a 95% interval over the runs. With --baseline, each point's change in epoch time
    against another sweep instead (a regression gate, Holm-corrected across the points).
    It reads only: --out and --html write files, --publish writes to the store."""
    # pandas (the comparison and everything that reads it) and rich: loaded by compare only
    from pipeline.analysis.compare import CHART_HISTORIES, CompareOptions
    from pipeline.present import view
    from pipeline.present.answer import Answer
    from pipeline.present.comparison_folder import write_html, write_report
    from pipeline.present.tables import render, render_gate
    from pipeline.present.verdict import Verdict
    from pipeline.sweep.comparing import comparison_of, gate_against
    from pipeline.sweep.publish import link, provenance
    from pipeline.sweep.publish import publish as publish_sweep

    _check_compare_options(fail_if_slower, baseline, allow_inconclusive, quality_margin, publish, html, out)
    client = open_client(resolve_tracking_uri(tracking_uri), must_exist=True)
    # Per-epoch histories only where a chart draws them (--out, --publish, --html), or for runs
    # without end figures.
    charted = CHART_HISTORIES if out or publish or html else ()  # only the test-accuracy chart draws histories
    options = CompareOptions(sort, versus, include_contended)
    comparison = comparison_of(client, experiment, parent_run, options, quality_margin, charted)
    if not comparison.sweep.children:
        sweep = comparison.sweep
        raise UserError(f"sweep {sweep.name!r} ({sweep.run_id}) has no FINISHED runs to compare")
    if baseline is not None:
        result = gate_against(
            client, comparison, baseline, options, quality_margin, fail_if_slower, across_hosts, allow_inconclusive
        )
        if fmt == "table":
            Verdict().gate(result)
        else:
            click.echo(render_gate(result, fmt), nl=False)
        sys.exit(result.exit_code)
    # The writes first, then the printing: a reader that stops early (`| head`) ends the printing
    # with a broken pipe, and that must not cancel a --publish or leave a report unwritten.
    written: list[str] = []
    answer = Answer(comparison)  # worked out once for every writer and the terminal
    if out:
        written += [f"wrote {path}" for path in write_report(answer, Path(out))]
    if html:
        written.append(f"wrote {write_html(answer, Path(html), provenance(client, comparison.sweep.run_id))}")
    if publish:
        publish_sweep(client, answer)
        written.append(
            f"published: the saved view, the descriptions and {view.REPORT} of sweep {comparison.sweep.run_id}"
        )
    if fmt == "table":
        Verdict().comparison(answer, wide)
    else:
        click.echo(render(comparison, fmt), nl=False)
    for line in written:
        click.echo(line, err=True)
    click.echo(f"In the MLflow UI: {link(client, comparison)}", err=fmt != "table")


def _check_compare_options(
    fail_if_slower: float | None,
    baseline: str | None,
    allow_inconclusive: bool,
    quality_margin: float | None,
    publish: bool,
    html: str | None,
    out: str | None,
) -> None:
    """`pipeline compare`'s options that only make sense together, and the places it would write:
    UserError before the store is opened or anything is printed."""
    if fail_if_slower is not None and baseline is None:
        raise UserError(f"--fail-if-slower {fail_if_slower:g} needs --baseline SWEEP to compare against")
    if fail_if_slower is not None and (fail_if_slower < 0 or fail_if_slower != fail_if_slower):
        raise UserError(f"--fail-if-slower {fail_if_slower:g}: give a percentage >= 0, e.g. --fail-if-slower 10")
    if allow_inconclusive and (baseline is None or fail_if_slower is None):
        raise UserError(
            "--allow-inconclusive needs --baseline SWEEP and --fail-if-slower PCT: it turns the gate's "
            "exit 3 (some point could not be judged) into 0"
        )
    if quality_margin is not None and not 0 <= quality_margin < 1:
        raise UserError(
            f"--quality-margin {quality_margin:g}: give a number >= 0 and below 1, e.g. 0.005 "
            "(half a point of test accuracy)"
        )
    if baseline is not None and (publish or html):
        raise UserError(
            f"{'--publish' if publish else '--html'} publishes a sweep's comparison; with --baseline "
            "compare checks a gate and publishes nothing: run them as two commands"
        )

    if out:  # before anything is printed: a table followed by a failed write reads as success
        check_writable(Path(out), "--out", "pass a folder you can write in (it is created when missing)")
    if html:
        if Path(html).is_dir():
            raise UserError(f"--html {html}: a folder; pass a file name, e.g. --html {Path(html) / 'report.html'}")
        check_writable(Path(html).parent, "--html", "pass a file in a folder you can write in")


@main.command(short_help="Start the MLflow UI on the pipeline's store; print its address.")
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True, help="Port to serve the UI on.")
@click.option(
    "--host",
    type=TEXT,
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind. The UI has no authentication: keep it on 127.0.0.1 unless you must.",
)
@tracking_uri_option
def ui(port: int, host: str, tracking_uri: str | None) -> None:
    """Start the MLflow UI on the store the pipeline writes to, and print the address to open."""
    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        click.echo(f"{redact(uri)} is a tracking server: its UI is at that address")
        return
    from pipeline.present import view  # pandas: not before a server's address is all there is to say

    check_port(host, port)
    client = open_client(uri, must_exist=True)
    experiment_id = latest_experiment_id(client)
    page = RUNS_PAGE.format(experiment_id=experiment_id) if experiment_id else ""
    parent = view.latest(client.get_experiment(experiment_id).tags) if experiment_id else None
    page = view.page(page, parent) if parent else page
    if host in ("0.0.0.0", "::"):
        click.echo(
            f"warning: --host {host} exposes the UI, without authentication, to every network this machine is on",
            err=True,
        )
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    store = absolute_store_uri(uri)
    click.echo(f"MLflow UI for {redact(store)}: http://{shown}:{port}/{page}  (Ctrl-C stops it)")
    sys.exit(
        run_mlflow(["ui", "--backend-store-uri", store, "--host", host, "--port", str(port), *UI_OPTIONS], host, port)
    )


@main.command(short_help="Register a run's model (by default the sweep's best); alias it.")
@click.option("--run-id", type=OPTIONAL_TEXT, metavar="ID", help="Register this run's model.")
@click.option(
    "--experiment",
    type=OPTIONAL_TEXT,
    metavar="NAME",
    help="Register the best run of this experiment's latest sweep (see --by).",
)
@click.option("--parent-run", type=OPTIONAL_TEXT, metavar="ID", help="Register the best run of this sweep (see --by).")
@click.option("--name", required=True, type=TEXT, metavar="MODEL_NAME", help="Registered model name, e.g. fashion-cnn.")
@click.option(
    "--by",
    "rule",
    type=NonBlank(click.Choice(["best", "speed", "accuracy"]), unset_when_blank=True),
    default=None,
    metavar="[best|speed|accuracy]",
    help="Which run: best (the default: the fastest setting within the quality margin of the most "
    "accurate, as the sweep's verdict names it), speed (the fastest setting) or accuracy (the most "
    "accurate); each setting stands by its most accurate run.",
)
@click.option(
    "--metric",
    type=OPTIONAL_TEXT,
    metavar="NAME",
    help="Instead of --by: the FINISHED run with the highest (--mode max) or lowest value of this metric, "
    "over every sweep of --experiment, or the runs of --parent-run.",
)
@click.option("--mode", type=click.Choice(["max", "min"]), default="max", show_default=True, help="With --metric.")
@click.option("--alias", type=TEXT, default="champion", show_default=True, help="Alias to point at the version.")
@click.option(
    "--force",
    type=bool,
    is_flag=False,
    flag_value=True,
    default=False,
    metavar="[true|false]",
    help="Make a new version even if this run is already registered, and move --alias even to a less "
    "accurate model than the one it holds; the bare flag means true.",
)
@click.option(
    "--include-contended",
    type=bool,
    is_flag=False,
    flag_value=True,
    default=False,
    metavar="[true|false]",
    help="With --by: count contended runs' speed figures, as `compare --include-contended` does (and the "
    "verdict a `compare --include-contended --publish` wrote); the bare flag means true.",
)
@tracking_uri_option
def register(
    run_id: str | None,
    experiment: str | None,
    parent_run: str | None,
    name: str,
    rule: str | None,
    metric: str | None,
    mode: str,
    alias: str,
    force: bool,
    include_contended: bool,
    tracking_uri: str | None,
) -> None:
    """Register a run's model (by default the run the sweep's verdict names best) as a new version of
    MODEL_NAME and alias it."""
    if not (run_id or experiment or parent_run):
        raise UserError("say which run to register: --run-id ID, or --experiment NAME [--parent-run ID]")
    if rule and metric:
        raise UserError(
            f"--by {rule} and --metric {metric}: give one; --by picks a setting by the sweep's rule, "
            "--metric one run by one metric"
        )
    if run_id and (rule or metric):
        raise UserError(f"--run-id names the run; drop {'--by' if rule else '--metric'}")
    registry.check_alias(alias)
    registry.check_name(name)
    client = open_client(resolve_tracking_uri(tracking_uri), must_exist=True)
    if run_id:
        run = registry.finished_run(client, run_id)
        reason = registry.Reason("--run-id", {})
    elif metric:
        run = registry.best_run(client, experiment=experiment, parent_run_id=parent_run, metric=metric, mode=mode)
        reason = registry.metric_reason(run, metric)
    else:
        from pipeline.analysis.compare import CompareOptions  # pandas: --help stays quick
        from pipeline.sweep.comparing import comparison_of

        comparison = comparison_of(client, experiment, parent_run, CompareOptions(include_contended=include_contended))
        run, reason = registry.picked_run(client, comparison, rule or "best")
    _print_registration(registry.register(client, run, name=name, reason=reason, alias=alias, force=force))


def _print_registration(reg) -> None:
    if reg.created:
        click.echo(f"registered {reg.name} version {reg.version} from run {reg.run_id}, by {reg.reason.words}")
    else:
        click.echo(
            f"run {reg.run_id} is already {reg.name} version {reg.version}; "
            "not registering it again (--force makes a new version)"
        )
    click.echo(f"alias {reg.alias} -> version {reg.version}")
    click.echo(f"load it with: {reg.uri}")


@main.command(short_help="Classify images, or measure accuracy on a Fashion-MNIST split.")
@click.argument("images", nargs=-1, type=NonBlank(click.Path(path_type=Path)), metavar="[IMAGE_FILES]...")
@click.option(
    "--model",
    "model_uri",
    required=True,
    type=TEXT,
    metavar="URI",
    help="models:/NAME@ALIAS, models:/m-..., or runs:/RUN_ID/model.",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "cpu", "cuda", "mps"]),
    help="Where the model runs; auto: cuda, else mps, else cpu.",
)
@data_dir_option
@click.option(
    "--split",
    type=click.Choice(["test", "train"]),
    default="test",
    show_default=True,
    help="Without IMAGE_FILES: the Fashion-MNIST split to measure accuracy on.",
)
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Only the first N examples of the split.")
@tracking_uri_option
def predict(
    images: tuple[Path, ...],
    model_uri: str,
    device: str,
    data_dir: str | None,
    split: str,
    limit: int | None,
    tracking_uri: str | None,
) -> None:
    """Classify IMAGE_FILES (PNG/JPEG, any size, colour or grey), or measure accuracy on a
    Fashion-MNIST split when no files are given."""
    # torch (data, predict) and rich (report): loaded by predict only
    from pipeline.present.report import class_accuracy_table, make_console
    from pipeline.tracking import predict as predict_mod
    from pipeline.training import data as data_mod

    target = predict_mod.check_inputs(device, images, bool(data_dir or limit))
    batch = predict_mod.read_images(list(images)) if images else None
    uri = resolve_tracking_uri(tracking_uri)
    predict_mod.check_store(model_uri, uri)
    dataset = None if images else data_mod.load(data_dir)
    with fluent_target(uri):  # MLflow resolves runs:/ and models:/ URIs through its fluent target
        model = predict_mod.load(model_uri, target)
    if dataset is None:  # image files given: a line each
        for p in predict_mod.predict_files(model, list(images), batch, target):
            click.echo(f"{p.path}\t{p.class_name}\t{p.probability:.3f}")
        return
    part = getattr(dataset, split).head(limit)
    accuracy, per_class = predict_mod.split_accuracy(model, part.images, part.labels, target)
    click.echo(f"accuracy {accuracy:.4f}")
    title = f"{split} split, first {len(part)} examples ({dataset.folder})"
    make_console().print(class_accuracy_table(title, per_class))


@main.command(short_help="Log the runs a tracking outage kept only in the results file.")
@click.argument("results_file", required=False, type=NonBlank(click.Path(path_type=Path)), metavar="[RESULTS.jsonl]")
@tracking_uri_option
def relog(results_file: Path | None, tracking_uri: str | None) -> None:
    """Log the runs that a tracking outage kept only in the local results file (pipeline-results.jsonl
    beside the store, or in the working folder for a server) into the store and sweep each line names,
    and close the runs the outage left RUNNING. --tracking-uri sends them all to another store.

    A line that is not a results line (cut short, not JSON, not text) is named (FILE:LINE) and left
    as it is; the other lines are relogged, and the exit code is 2 (bad input). A line whose run the
    store refuses (or whose model file is gone) marks that run FAILED with the reason and stays for
    a relog after the fix; the other lines are relogged, and the exit code is 1."""
    path = results_file or results.path_in(local_state_dir(resolve_tracking_uri(tracking_uri)))

    def waiting() -> None:
        click.echo(f"another process is relogging or writing {path}: waiting for it", err=True)

    done = results.relog(path, override_uri=tracking_uri, waiting=waiting)
    logged, failed = [run for run in done if not run.error], [run for run in done if run.error]
    click.echo(f"logged {len(logged)} run(s) from {path}")
    for run in logged:
        click.echo(f"  {run.name}: run {run.run_id} in {redact(run.tracking_uri)}")
    if failed:  # one line for them all: the first, and how many more
        first, more = failed[0], f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        marked = f"run {first.run_id} FAILED: " if first.run_id else ""
        click.echo(
            f"error: {path}:{first.line}: {marked}{first.error}{more}; fix or delete the line, then run "
            "`pipeline relog` again",
            err=True,
        )
    bad = results.bad_lines(path)
    if bad:  # bad input (exit 2), named once the good lines are in
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UserError(
            f"{bad[0]}{more}; left as it is, the other lines were relogged; fix or delete it, "
            "then run `pipeline relog` again"
        )
    if failed:
        sys.exit(1)


@main.command(short_help="Start an MLflow tracking server for sweeps on several machines.")
@click.option(
    "--host",
    type=TEXT,
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind. Without auth anyone who reaches the port can write: widen with care.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True, help="Port to listen on.")
@click.option(
    "--backend-store-uri",
    type=TEXT,
    default="sqlite:///mlflow.db",
    show_default=True,
    envvar="MLFLOW_BACKEND_STORE_URI",
    help="Where runs are stored; use a database (postgresql://...) for a busy cluster. "
    "Also read from $MLFLOW_BACKEND_STORE_URI, which keeps a password off the command line.",
)
@click.option(
    "--artifacts-destination",
    type=TEXT,
    default="./mlartifacts",
    show_default=True,
    help="Where artifacts (models, charts) are stored; a shared path or s3://... for a cluster.",
)
# The default depends on the machine, so --help and the docs state the rule, not this machine's number.
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=min(4, os.cpu_count() or 1),
    show_default="4, or the number of cores if fewer",
    help="Request-handling processes (MLflow's default is 4 whatever the machine).",
)
@click.option(
    "--allowed-hosts",
    type=TEXT,
    metavar="NAMES",
    help="Host names clients may use to reach it (comma-separated), e.g. head,head:5000.",
)
@click.option(
    "--auth",
    is_flag=True,
    help="Require a login (MLflow's basic-auth app). The first start creates the "
    "admin user with the password from $MLFLOW_AUTH_ADMIN_PASSWORD or --admin-password-file.",
)
@click.option(
    "--admin-password-file", type=TEXT, metavar="FILE", help="With --auth: a file holding the admin's password."
)
@click.option(
    "--default-permission",
    type=click.Choice(("READ", "EDIT", "MANAGE", "NO_PERMISSIONS")),
    default="READ",
    show_default=True,
    help="With --auth: what users may do with experiments and models they did not create.",
)
@click.option(
    "--auth-database-uri",
    type=TEXT,
    metavar="URI",
    help="With --auth: where users are stored [default: the tracking database, or basic_auth.db beside "
    "a sqlite store].",
)
def server(
    host: str,
    port: int,
    backend_store_uri: str,
    artifacts_destination: str,
    workers: int,
    allowed_hosts: str | None,
    auth: bool,
    admin_password_file: str | None,
    default_permission: str,
    auth_database_uri: str | None,
) -> None:
    """Start an MLflow tracking server for sweeps on several machines (Ray workers log to it)."""
    sys.exit(
        serve(
            host,
            port,
            backend_store_uri,
            artifacts_destination,
            workers,
            allowed_hosts,
            auth=auth,
            admin_password_file=admin_password_file,
            default_permission=default_permission,
            auth_database_uri=auth_database_uri,
        )
    )
