"""The `pipeline` command: parses, calls and prints. Logic lives in the modules below it.

Heavy imports (torch, mlflow) happen inside the commands that need them, so `pipeline --help` and
`pipeline validate` answer in a fraction of a second.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from pipeline import __version__
from pipeline.errors import UserError

EXIT_INTERRUPTED = 130


def _blank_is_none(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    # MLproject passes "" for an unset string parameter.
    return None if value == "" else value


def _grid_value(key: str):
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        from pipeline.config import check_value

        if value is None:
            return None
        try:
            return check_value(key, value)
        except UserError as exc:
            raise click.BadParameter(str(exc).split(": ", 1)[1]) from None

    return callback


tracking_uri_option = click.option(
    "--tracking-uri", callback=_blank_is_none, metavar="URI",
    help="MLflow tracking URI. Default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here.",
)
data_dir_option = click.option(
    "--data-dir", callback=_blank_is_none, metavar="DIR",
    help="Folder with the four Fashion-MNIST IDX files (or a torchvision root). Default: search.",
)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted: the current run and its parent are marked KILLED", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipeline")
def main() -> None:
    """Train the Fashion-MNIST CNN over a YAML grid of settings and devices, tracked in MLflow.

    \b
    Start with:  pipeline validate experiments/quickstart.yaml
                 pipeline run experiments/quickstart.yaml
    """


@main.command()
@click.argument("grid", metavar="GRID.yaml")
@tracking_uri_option
@click.option("--experiment", callback=_blank_is_none, metavar="NAME",
              help="MLflow experiment. Default: the grid's `experiment`, else the file's name.")
@data_dir_option
@click.option("--require-devices", is_flag=True,
              help="Exit 2 before training if any grid point's device is missing, instead of skipping it.")
@click.option("--dry-run", is_flag=True, help="Show the plan (points, devices, data) and exit; trains nothing.")
def run(grid: str, tracking_uri: str | None, experiment: str | None, data_dir: str | None,
        require_devices: bool, dry_run: bool) -> None:
    """Train every point of GRID.yaml, one MLflow child run each, under one parent run.

    Points whose device this machine lacks are skipped with the reason. Exit code: 0 when every run
    that could run finished, 1 when one failed, 2 for bad input.
    """
    from pipeline.config import load_grid
    from pipeline.report import Reporter
    from pipeline.runner import run_grid

    spec = load_grid(grid)
    result = run_grid(spec, Reporter(), tracking_uri=tracking_uri, experiment=experiment,
                      data_dir=data_dir, require_devices=require_devices, dry_run=dry_run)
    sys.exit(result.exit_code)


@main.command()
@click.option("--device", default="auto", show_default=True, callback=_grid_value("device"),
              help="cpu, cuda, cuda:N, mps or auto.")
@click.option("--batch-size", type=int, default=100, show_default=True, callback=_grid_value("batch_size"))
@click.option("--lr", type=float, default=0.01, show_default=True, callback=_grid_value("lr"))
@click.option("--num-workers", type=int, default=0, show_default=True, callback=_grid_value("num_workers"),
              help="DataLoader worker processes.")
@click.option("--epochs", type=int, default=1, show_default=True, callback=_grid_value("epochs"))
@click.option("--seed", type=int, default=0, show_default=True, callback=_grid_value("seed"))
@click.option("--shuffle", type=bool, default=True, show_default=True, help="Shuffle training batches each epoch.")
@data_dir_option
@click.option("--experiment", default="train", show_default=True, callback=_blank_is_none, metavar="NAME")
@tracking_uri_option
def train(device: str, batch_size: int, lr: float, num_workers: int, epochs: int, seed: int,
          shuffle: bool, data_dir: str | None, experiment: str | None, tracking_uri: str | None) -> None:
    """Train one run with the given settings and track it in MLflow."""
    from pipeline.config import RunConfig
    from pipeline.report import Reporter
    from pipeline.runner import run_single

    config = RunConfig(lr=lr, batch_size=batch_size, num_workers=num_workers, device=device,
                       epochs=epochs, seed=seed, shuffle=shuffle)
    result = run_single(config, Reporter(), tracking_uri=tracking_uri, experiment=experiment, data_dir=data_dir)
    sys.exit(result.exit_code)


@main.command()
@click.argument("grid", metavar="GRID.yaml")
def validate(grid: str) -> None:
    """Check GRID.yaml and print its expanded grid and size, without training (or importing torch)."""
    from rich.table import Table

    from pipeline.config import load_grid
    from pipeline.grid import expand, format_value, grid_size
    from pipeline.report import make_console

    spec = load_grid(grid)
    table = Table(title=f"{spec.path}: experiment {spec.experiment!r}, {grid_size(spec)} grid points")
    table.add_column("#", justify="right")
    for key, _ in spec.axes:
        table.add_column(key)
    table.add_column("run name")
    for point in expand(spec):
        values = point.config.as_params()
        table.add_row(str(point.index), *(format_value(values[k]) for k, _ in spec.axes), point.name)
    console = make_console()
    console.print(table)
    data = spec.data
    if any((data.root, data.train_size, data.test_size)):
        console.print(f"data: root={data.root or 'search'} train_size={data.train_size or 'all'} "
                      f"test_size={data.test_size or 'all'}")
    console.print(f"ok: {grid_size(spec)} grid points")


@main.command()
def devices() -> None:
    """What this machine offers: CPU, each CUDA/MPS device (smoke-tested), and why CUDA is missing."""
    import torch
    from rich.table import Table

    from pipeline.device import survey
    from pipeline.report import make_console

    found, notes = survey()
    table = Table(title=f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}")
    for column in ("device", "hardware", "detail", "works"):
        table.add_column(column)
    for d in found:
        table.add_row(d.name, d.hardware, d.detail, "yes" if d.works else f"no: {d.error}")
    console = make_console()
    console.print(table)
    for note in notes:
        console.print(note)
    console.print(f"torch.cuda.is_available(): {torch.cuda.is_available()}")


@main.command()
@data_dir_option
@click.option("--download", is_flag=True, help="Fetch Fashion-MNIST with torchvision into ./data (needs a network).")
def data(data_dir: str | None, download: bool) -> None:
    """Find, verify and describe the Fashion-MNIST files the pipeline would use."""
    from pipeline import data as data_mod

    if download:
        click.echo(f"downloaded into {data_mod.download(data_dir or 'data')}")
    dataset = data_mod.load(data_dir)
    click.echo(dataset.description)
